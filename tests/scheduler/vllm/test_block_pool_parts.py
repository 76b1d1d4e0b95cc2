"""The vLLM block pool's parts on their own: block hashes follow whole prefixes, and the free
queue behaves as vLLM's linked list (an ordered dict here) under any mix of operations."""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.vllm.block_hashes import block_hashes, hashes_of_runs
from scheduler.vllm.free_block_queue import FreeBlockQueue


def _tokens(rng: random.Random, n: int) -> np.ndarray:
    return np.array([rng.randrange(0, 1 << 40) for _ in range(n)], dtype=np.int64)


def test_a_blocks_hash_is_its_whole_prefix():
    rng = random.Random(0)
    a = _tokens(rng, 64)
    b = a.copy()
    b[5] += 1  # a change in block 0 changes every block's hash after it
    ha, hb = block_hashes(a, 0, 0, 16), block_hashes(b, 0, 0, 16)
    assert len(ha) == 4 and len(set(ha.tolist())) == 4
    assert all(x != y for x, y in zip(ha, hb))
    c = a.copy()
    c[40] += 1  # a change in block 2 leaves blocks 0 and 1 as they were
    hc = block_hashes(c, 0, 0, 16)
    assert (hc[:2] == ha[:2]).all() and (hc[2:] != ha[2:]).all()
    # The same tokens at other positions are another prefix.
    assert block_hashes(a[16:32], 0, 0, 16)[0] != ha[1]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), page=st.sampled_from([1, 4, 16]))
def test_hashes_made_in_pieces_or_together_are_the_same(seed, page):
    rng = random.Random(seed)
    runs, firsts, parents, whole = [], [], [], []
    for _ in range(rng.randint(1, 4)):
        blocks = rng.randint(1, 12)
        toks = _tokens(rng, blocks * page)
        full = block_hashes(toks, 0, 0, page)
        first = rng.randrange(blocks)
        assert (block_hashes(toks[first * page :], first, int(full[first - 1]) if first else 0, page) == full[first:]).all()
        runs.append(toks[first * page :])
        firsts.append(first)
        parents.append(int(full[first - 1]) if first else 0)
        whole.append(full[first:])
    for got, want in zip(hashes_of_runs(runs, firsts, parents, page), whole):
        assert (got == want).all()


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 200))
def test_the_free_queue_is_vllms_ordered_free_list(seed, n):
    """Random takes from the front (one or many), frees to the back and removals from anywhere,
    compactions included: the same blocks, in the same order, as an ordered dict."""
    rng = random.Random(seed)
    q, model = FreeBlockQueue(n), OrderedDict.fromkeys(range(n))
    held: list[int] = []
    for _ in range(300):
        op = rng.random()
        if op < 0.35 and model:
            k = rng.randint(1, min(len(model), 100))
            got = [q.popleft()] if k == 1 else q.popleft_n(k).tolist()
            want = [model.popitem(last=False)[0] for _ in range(k)]
            assert got == want
            held += got
        elif op < 0.7 and held:
            rng.shuffle(held)
            k = rng.randint(1, len(held))
            back, held = held[:k], held[k:]
            if k == 1:
                q.append(back[0])
            else:
                q.append_n(np.array(back, dtype=np.int64))
            for b in back:
                model[b] = None
        elif model:
            b = rng.choice(list(model))
            q.remove(b)
            del model[b]
            held.append(b)
        assert len(q) == len(model)
        assert q.order().tolist() == list(model)
        assert all((b in q) == (b in model) for b in range(n))
