"""Cached blocks whose hashes the prefix cache's map does not have yet, and when a lookup
needs them.

A full block enters vLLM's cache in the step that computes it (kv_blocks.VllmKVBlocks
.cache_blocks): from then on it is counted, evictable once free, and ordered among
duplicates (block_pool.BlockPool.cache_blocks). Its hash matters only to a lookup that could
find it, so it is hashed, with its request's other such blocks, and put in the map only when
one may (flush): most never are looked up before they are evicted, and one vector pass then
hashes, and one puts in the map, thousands of steps' blocks (the Mooncake replay flushes ~300
times for ~16,000 lookups).

A lookup (kv_blocks.VllmKVBlocks.get_computed_blocks) reads the map as it is and stops at its
first miss, block `index`. Blocks waiting here can change that answer only if one of them is
block `index` of its request with the same hash (may_hold): a block hash covers its whole
prefix, so blocks at other places have other hashes, and the blocks found come before any
duplicate waiting here (they were cached before the last flush). Only then does the lookup
flush and look again.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from scheduler.core.ids import ids
from scheduler.core.req import Req
from scheduler.vllm.block_hashes import hashes_of_joined_runs
from scheduler.vllm.block_pool import BlockPool
from scheduler.vllm.request_blocks import NO_HASHES, RequestBlocks, known_tokens_between

# Freed requests' runs kept waiting at most: past this the freeing flushes. A lookup looks
# through them (may_hold, ~0.1 us each); a flush costs ~50 ns a block still cached, and the
# longer runs wait the more of their blocks are evicted first (the Mooncake replay's pool holds
# about 40 requests' blocks): 128 flushes a fourth as often as 32, for about a third the cost.
MAX_FREED_RUNS = 128


@dataclass(eq=False, slots=True)
class UnhashedRun:
    """One request's cached blocks start .. start + len(blocks) - 1 without hashes in the map:
    the first ones' hashes, known already (its prompt's, hashed for its own lookup), then the
    tokens of the rest (copied: a finished request lets its prompt go), whose prefix before
    them (block `first` on) sums to parent."""

    st: RequestBlocks
    start: int
    blocks: np.ndarray
    entries: np.ndarray  # (the pool's, given when they were cached: block_hash_index.py)
    known: np.ndarray
    tokens: array = field(default_factory=ids)
    first: int = 0
    parent: int = 0


class UnhashedBlocks:
    def __init__(self, pool: BlockPool, page_size: int) -> None:
        self.pool = pool
        self.page_size = page_size
        # Requests with such blocks (RequestBlocks.num_hashed .. num_cached - 1), and the runs
        # of requests freed since.
        self.pending: dict[RequestBlocks, Req] = {}
        self.freed: list[UnhashedRun] = []

    def __bool__(self) -> bool:
        return bool(self.pending or self.freed)

    def _run(self, req: Req, st: RequestBlocks) -> UnhashedRun:
        ps, a, b = self.page_size, st.num_hashed, st.num_cached
        have = len(st.hashes)
        blocks = np.frombuffer(st.blocks, dtype=np.int64)[a:b].copy()
        run = UnhashedRun(st, a, blocks, self.pool.entries(blocks), st.hashes[a:b] if have > a else NO_HASHES)
        if have < b:
            run.tokens, run.first = known_tokens_between(req, have * ps, b * ps), have
            run.parent = int(st.hashes[have - 1]) if have else 0
        return run

    def freeing(self, req: Req, st: RequestBlocks) -> None:
        """req is freeing its blocks: its waiting ones keep their tokens here."""
        if st in self.pending:
            self.freed.append(self._run(req, st))
            del self.pending[st]

    def too_many(self) -> bool:
        return len(self.freed) > MAX_FREED_RUNS

    def may_hold(self, index: int, block_hash: np.uint64) -> bool:
        """Whether a waiting block `index` of some request may hold block_hash (its hash, where
        known so far, is it; else it may be)."""
        h = int(block_hash)  # (a Python int against .item(): no numpy scalars made)
        for st in self.pending:
            if st.num_hashed <= index < st.num_cached and (index >= len(st.hashes) or st.hashes.item(index) == h):
                return True
        for run in self.freed:
            at = index - run.start
            if 0 <= at < len(run.blocks) and (at >= len(run.known) or run.known.item(at) == h):
                return True
        return False

    def flush(self) -> None:
        """Hash every waiting block and put it in the pool's map."""
        if not self:
            return
        runs = self.freed
        for st, req in self.pending.items():
            runs.append(self._run(req, st))
            st.num_hashed = st.num_cached
        self.pending, self.freed = {}, []
        ps = self.page_size
        hashing = [run for run in runs if run.tokens]
        if hashing:
            joined = np.frombuffer(b"".join(run.tokens for run in hashing), dtype=np.int64)
            counts = [len(run.tokens) // ps for run in hashing]
            hashed = hashes_of_joined_runs(joined, counts, [run.first for run in hashing], [run.parent for run in hashing], ps)
            at = 0
            for run, n in zip(hashing, counts):
                more = hashed[at : at + n]
                at += n
                run.known = np.concatenate((run.known, more)) if len(run.known) else more
                if len(run.st.hashes) == run.first:  # (the request's own hashes, for its later lookups)
                    run.st.hashes = np.concatenate((run.st.hashes, more)) if run.first else more
        if len(runs) == 1:
            self.pool.add_hashes(runs[0].blocks, runs[0].known, runs[0].entries)
        else:
            self.pool.add_hashes(
                np.concatenate([run.blocks for run in runs]),
                np.concatenate([run.known for run in runs]),
                np.concatenate([run.entries for run in runs]),
            )
