"""Cached blocks whose hashes the prefix cache's map does not have yet, and when a lookup
needs them.

A full block enters vLLM's cache in the step that computes it (kv_blocks.VllmKVBlocks
.cache_blocks): from then on it is counted, evictable once free, and ordered among
duplicates (block_pool.BlockPool.cache_blocks). Its hash matters only to a lookup that could
find it, so it is hashed, with its request's other such blocks, and put in the map only when
one may (flush): most never are looked up before they are evicted, and one vector pass then
hashes, and one puts in the map, thousands of steps' blocks.

A lookup (kv_blocks.VllmKVBlocks.get_computed_blocks) reads the map as it is and stops at its
first miss, block `index`. Blocks waiting here can change that answer only if one of them is
block `index` of its request with the same hash (may_hold): a block hash covers its whole
prefix, so blocks at other places have other hashes. Only then does the lookup flush and look
again, and only the waiting blocks of index below those it looked up (flush(below)): a lookup
stops within its first blocks (a Mooncake prompt's ~750 blocks, its hit ~33), and the rest of a
running request's prompt need not be hashed until one reaches them. A flush puts in the map the
waiting blocks of an index all together or none of them, so every block in the map was cached
before any duplicate of it still waiting: the map's first block under a hash is the one cached
first. A flush drops the blocks evicted since they were cached: a freed request's run is cut
after its last block still cached (its blocks join the free queue last one first), before
anything is hashed.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from scheduler.core.ids import ids
from scheduler.core.req import Req
from scheduler.vllm.block_hashes import hashes_of_joined_runs
from scheduler.vllm.block_pool import FIRST_PROBES, BlockPool
from scheduler.vllm.request_blocks import NO_HASHES, RequestBlocks

# Freed requests' runs kept waiting at most: past this the freeing flushes those below
# FIRST_PROBES (then all, if more than half are left: a full flush hashes every running prompt).
# A lookup looks through them (may_hold, ~0.1 us each), and the longer runs wait the more of
# their blocks are evicted first. On the Mooncake replay 128 and 256 cost the same, and 64 and
# 32 three and five times as much in freeing (their full flushes).
MAX_FREED_RUNS = 128


@dataclass(eq=False, slots=True)
class UnhashedRun:
    """One request's cached blocks start .. start + len(blocks) - 1 without hashes in the map:
    the first ones' hashes, known already (hashed for its own lookups), then the tokens of the
    rest, whose prefix before them (block `first` on) sums to parent. Its tokens: those of its
    prompt from position first * page_size (the prompt itself, not a copy: nothing changes a
    prompt, and a finished request's stays alive only until the flush), then its outputs from
    position outs_from on (copied)."""

    st: RequestBlocks
    start: int
    blocks: np.ndarray
    entries: np.ndarray  # (the pool's, given when they were cached: block_hash_index.py)
    known: np.ndarray
    first: int  # its request's hashes known so far: those of blocks 0 .. first - 1
    parent: int = 0
    prompt: array | None = None
    outs: array = field(default_factory=ids)
    outs_from: int = 0

    def split(self, k: int) -> tuple[UnhashedRun, UnhashedRun]:
        """Its first k blocks and the rest, as two runs with its tokens."""
        b, e, kn = self.blocks, self.entries, self.known
        head = UnhashedRun(self.st, self.start, b[:k], e[:k], kn[:k], self.first, self.parent, self.prompt, self.outs, self.outs_from)
        rest = UnhashedRun(self.st, self.start + k, b[k:], e[k:], kn[k:], self.first, self.parent, self.prompt, self.outs, self.outs_from)
        return head, rest

    def token_parts(self, upto: int, page_size: int) -> list[memoryview]:
        """Its tokens of blocks first .. upto - 1, as views of its prompt and outputs."""
        start, end, o = self.first * page_size, upto * page_size, self.outs_from
        parts = []
        if self.prompt is not None:
            parts.append(memoryview(self.prompt)[start : min(end, o)])
        if end > o:
            parts.append(memoryview(self.outs)[max(start - o, 0) : end - o])
        return parts


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

    def _run(self, req: Req, st: RequestBlocks, b: int) -> UnhashedRun:
        """The run of req's waiting blocks num_hashed .. b - 1."""
        ps, a = self.page_size, st.num_hashed
        have = len(st.hashes)
        blocks = np.frombuffer(st.blocks, dtype=np.int64)[a:b].copy()
        run = UnhashedRun(st, a, blocks, self.pool.entries(blocks), st.hashes[a:b] if have > a else NO_HASHES, first=have)
        if have < b:
            run.parent = int(st.hashes[have - 1]) if have else 0
            start, end, n = have * ps, b * ps, req.input_len
            if start < n:
                run.prompt = req.origin_input_ids
            run.outs_from = max(start, n)
            if end > n:
                run.outs = ids(req.output_ids[max(start - n, 0) : end - n])
        return run

    def freeing(self, req: Req, st: RequestBlocks) -> None:
        """req is freeing its blocks: its waiting ones keep their tokens here. When the freed
        runs are too many, those a lookup mostly reaches are flushed, and all of them if that
        leaves too many still (a flush drops the evicted blocks)."""
        if st in self.pending:
            self.freed.append(self._run(req, st, st.num_cached))
            del self.pending[st]
            if len(self.freed) > MAX_FREED_RUNS:
                self.flush(below=FIRST_PROBES)
                if len(self.freed) > MAX_FREED_RUNS // 2:
                    self.flush()

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

    def flush(self, below: int | None = None) -> None:
        """Hash the waiting blocks still cached, those of index below `below` (None: all), and
        put them in the pool's map. Blocks with one index are all flushed or none: so every
        block in the map was cached before any duplicate of it left waiting."""
        if not self:
            return
        runs: list[UnhashedRun] = []
        for st, req in list(self.pending.items()):
            end = st.num_cached if below is None else min(st.num_cached, below)
            if end > st.num_hashed:
                runs.append(self._run(req, st, end))
                st.num_hashed = end
            if end == st.num_cached:
                del self.pending[st]
        freed, self.freed = self._up_to_last_cached(self.freed), []
        splits: list[tuple[UnhashedRun, UnhashedRun]] = []  # (a run's blocks below `below`, the rest)
        for run in freed:
            if below is None or run.start + len(run.blocks) <= below:
                runs.append(run)
            elif run.start >= below:
                self.freed.append(run)
            else:
                head, rest = run.split(below - run.start)
                runs.append(head)
                self.freed.append(rest)
                splits.append((head, rest))
        if not runs:
            return
        ps = self.page_size
        hashing = [run for run in runs if run.first < run.start + len(run.blocks)]
        if hashing:
            ends = [run.start + len(run.blocks) for run in hashing]
            joined = np.frombuffer(b"".join([p for run, e in zip(hashing, ends) for p in run.token_parts(e, ps)]), dtype=np.int64)
            counts = [e - run.first for run, e in zip(hashing, ends)]
            hashed = hashes_of_joined_runs(joined, counts, [run.first for run in hashing], [run.parent for run in hashing], ps)
            at = 0
            for run, n in zip(hashing, counts):
                more = hashed[at : at + n]
                at += n
                # (more[k] is block first + k's; the run needs them from its first unknown one)
                more_of_run = more[run.start + len(run.known) - run.first :]
                run.known = np.concatenate((run.known, more_of_run)) if len(run.known) else more_of_run
                if len(run.st.hashes) == run.first:  # (the request's own hashes, for its later lookups)
                    run.st.hashes = np.concatenate((run.st.hashes, more)) if run.first else more
        for head, rest in splits:
            if rest.first < rest.start:  # (its tokens from where the head's hashes end)
                rest.first, rest.parent = rest.start, int(head.known[len(head.blocks) - 1])
        if len(runs) == 1:
            self.pool.add_hashes(runs[0].blocks, runs[0].known[: len(runs[0].blocks)], runs[0].entries)
        else:
            self.pool.add_hashes(
                np.concatenate([run.blocks for run in runs]),
                np.concatenate([run.known[: len(run.blocks)] for run in runs]),
                np.concatenate([run.entries for run in runs]),
            )

    def _up_to_last_cached(self, runs: list[UnhashedRun]) -> list[UnhashedRun]:
        """The runs cut after their last block still cached, those with none left out: an
        evicted block needs no hash (a freed request's blocks join the free queue last one
        first, and most of a finished request's are evicted before the next flush)."""
        if not runs:
            return runs
        lens = np.array([len(run.blocks) for run in runs], dtype=np.int64)
        ends = np.cumsum(lens)
        blocks = np.concatenate([run.blocks for run in runs])
        entries = np.concatenate([run.entries for run in runs])
        cached = (self.pool.entries(blocks) == entries).nonzero()[0]
        if len(cached) == len(blocks):
            return runs
        if not len(cached):
            return []
        which = np.searchsorted(ends, cached, side="right")
        last = np.flatnonzero(np.append(which[1:] != which[:-1], True))  # (each run's last cached block)
        keep = np.zeros(len(runs), dtype=np.int64)
        keep[which[last]] = cached[last] - (ends - lens)[which[last]] + 1
        kept = []
        for run, k, n in zip(runs, keep.tolist(), lens.tolist()):
            if k < n:
                if not k:
                    continue
                run.blocks, run.entries = run.blocks[:k], run.entries[:k]
            kept.append(run)
        return kept
