"""The vLLM block pool's parts on their own: block hashes follow whole prefixes, the free
queue behaves as vLLM's linked list (an ordered dict here) and the hash index as vLLM's map of
hashes to blocks under any mix of operations."""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.vllm import block_hashes as block_hashes_module
from scheduler.vllm.block_hash_index import BlockHashIndex
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


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 120))
def test_the_hash_index_answers_as_vllms_map(seed, n):
    """Blocks cached in runs (few distinct hashes, so duplicates abound, also within one run),
    their hashes added later in any grouping, evictions in between, rebuilds as it fills: every
    lookup gets the block cached first among those still cached under its hash, as vLLM's
    dict of dicts gives it."""
    rng = random.Random(seed)
    hashes = np.zeros(n, dtype=np.uint64)
    index = BlockHashIndex(n, hashes)
    keys = [rng.getrandbits(64) for _ in range(max(2, n // 3))]
    model: dict[int, OrderedDict[int, None]] = {}  # hash -> blocks in caching order (vLLM's map)
    cached: dict[int, int] = {}  # block -> its hash, for blocks whose hash is added
    waiting: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # cached, hashes not added yet
    free = list(range(n))
    for _ in range(200):
        op = rng.random()
        if op < 0.4 and free:
            run = np.array(rng.sample(free, rng.randint(1, min(len(free), 12))), dtype=np.int64)
            free = [b for b in free if b not in set(run.tolist())]
            index.cache(run)
            run_hashes = np.array([rng.choice(keys) for _ in run], dtype=np.uint64)
            waiting.append((run, run_hashes, index.entries_of(run)))
            for b, h in zip(run.tolist(), run_hashes.tolist()):
                model.setdefault(h, OrderedDict())[b] = None
        elif op < 0.6 and waiting:
            k = rng.randint(1, len(waiting))
            rng.shuffle(waiting)
            group, waiting = waiting[:k], waiting[k:]
            blocks = np.concatenate([g[0] for g in group])
            index.add(blocks, np.concatenate([g[1] for g in group]), np.concatenate([g[2] for g in group]))
            for g in group:
                cached.update(zip(g[0].tolist(), g[1].tolist()))
        elif op < 0.8:
            gone = [b for b in range(n) if b not in free and rng.random() < 0.3]
            if gone:
                index.uncache(np.array(gone, dtype=np.int64))
                for b in gone:
                    for blocks in model.values():
                        blocks.pop(b, None)
                    cached.pop(b, None)
                free += gone
        if not waiting:  # (a lookup reads the index once every cached block's hash is in)
            asked = keys + [rng.getrandbits(64)]
            got = index.first_blocks(np.array(asked, dtype=np.uint64)).tolist()
            want = [next(iter(model[h]), -1) if model.get(h) else -1 for h in asked]
            assert got == want
            assert not index.errors()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), num_big=st.integers(0, 9))
def test_a_tokens_key_is_the_same_however_it_is_made(seed, num_big):
    """Ids past the key table (markers, 40-bit ids, negative ones) are mixed in numpy or, a few,
    in Python: the same hashes either way."""
    rng = random.Random(seed)
    tokens = np.array([rng.randrange(0, 1000) for _ in range(64)], dtype=np.int64)
    for i in rng.sample(range(64), num_big):
        tokens[i] = rng.choice([rng.randrange(1 << 18, 1 << 62), -rng.randrange(1, 1 << 62)])
    got = []
    for few in (0, 64):
        old, block_hashes_module.FEW_BIG = block_hashes_module.FEW_BIG, few
        try:
            got.append(block_hashes(tokens, 0, 0, 16).tolist())
        finally:
            block_hashes_module.FEW_BIG = old
    assert got[0] == got[1]


def test_an_idle_pool_reports_a_block_neither_free_nor_held():
    """The check that ends every replay: all blocks back in the free queue, each once. A block
    taken and dropped without being freed (a leak) is counted, and a pool given everything back
    passes."""
    from scheduler.vllm.block_pool import BlockPool

    pool = BlockPool(64, enable_caching=True)
    blocks = pool.get_new_blocks(5)
    pool.free_blocks(blocks[:4])
    assert any("still referenced" in e for e in pool.errors_when_idle())
    pool.ref_cnt[int(blocks[4])] = 0  # dropped without going back to the queue
    assert pool.errors_when_idle() == ["KV leak: 1 blocks neither free nor held"]
    pool.free_queue.append_n(blocks[4:])
    assert pool.errors_when_idle() == []
