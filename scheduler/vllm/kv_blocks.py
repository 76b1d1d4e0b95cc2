"""vLLM's KV cache manager (vllm/v1/core/kv_cache_manager.py and single_type_kv_cache_manager.py's
FullAttentionManager, release 0.19.0) on a BlockPool (block_pool.py): each request's blocks, its
block hashes (block_hashes.py), its longest cached prefix, the slots its next tokens take, the
full blocks it puts in the prefix cache, and freeing it all, tail first.

A block b holds KV slots b * page_size .. b * page_size + page_size - 1; a request's row in the
ReqToTokenPool lists the slots of its tokens, which is what a forward reads.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from scheduler.core.ids import extend_range, ids
from scheduler.core.req import Req
from scheduler.memory.memory_pool import ReqToTokenPool
from scheduler.vllm.block_hashes import block_hashes, hashes_of_runs
from scheduler.vllm.block_pool import BlockPool

_NO_HASHES = np.empty(0, dtype=np.uint64)
# Runs of blocks shorter than this are counted in a Python loop: numpy's fixed cost (a few
# microseconds a call) is more than a loop over so few.
NUMPY_FROM = 16


@dataclass(eq=False, slots=True)
class RequestBlocks:
    """What the manager keeps for one request (vLLM: req_to_blocks, num_cached_block, and the
    request's block_hashes, which outlive a preemption)."""

    blocks: array = field(default_factory=ids)
    num_cached: int = 0  # its first blocks that are in the cache
    hashes: np.ndarray = field(default_factory=lambda: _NO_HASHES)  # of its full blocks of known tokens, so far


def ids_of(blocks: np.ndarray) -> array:
    """A numpy array of block ids or slots as an int64 array."""
    out = ids()
    out.frombytes(blocks.astype(np.int64, copy=False).tobytes())
    return out


class VllmKVBlocks:
    def __init__(self, req_to_token_pool: ReqToTokenPool, num_blocks: int, page_size: int, enable_caching: bool) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.pool = BlockPool(num_blocks, enable_caching)
        self.page_size = page_size
        self.enable_caching = enable_caching
        self.reqs: dict[Req, RequestBlocks] = {}
        # Blocks to cache, not yet in the pool's map, in caching order: (request, its state,
        # first block, end block) (cache_blocks says why).
        self.pending: list[tuple[Req, RequestBlocks, int, int]] = []

    # -- tokens and hashes ------------------------------------------------------------
    @staticmethod
    def known_tokens_between(req: Req, start: int, end: int) -> array:
        """Known tokens start .. end - 1 (of the prompt, then the outputs)."""
        prompt = req.origin_input_ids
        n = len(prompt)
        if end <= n:
            return prompt[start:end]
        outs = ids(req.output_ids[max(start - n, 0) : end - n])
        return prompt[start:] + outs if start < n else outs

    def _state(self, req: Req) -> RequestBlocks:
        st = self.reqs.get(req)
        if st is None:
            st = self.reqs[req] = RequestBlocks()
        return st

    def _hashes(self, req: Req, st: RequestBlocks, num_blocks: int) -> np.ndarray:
        """The hashes of req's first num_blocks blocks (all full of known tokens), extended as needed."""
        have = len(st.hashes)
        if have < num_blocks:
            ps = self.page_size
            tokens = np.frombuffer(self.known_tokens_between(req, have * ps, num_blocks * ps), dtype=np.int64)
            more = block_hashes(tokens, have, int(st.hashes[have - 1]) if have else 0, ps)
            st.hashes = np.concatenate((st.hashes, more)) if have else more
        return st.hashes

    # -- admission ----------------------------------------------------------------------
    def get_computed_blocks(self, req: Req) -> list[int]:
        """The cached blocks of req's longest cached prefix, at most all its known tokens but
        the last (whose position must be computed to sample from)."""
        if not self.enable_caching:
            return []
        known = req.input_len + len(req.output_ids)
        max_blocks = (known - 1) // self.page_size
        if not max_blocks:
            return []
        self.flush_cache()
        return self.pool.longest_hit(self._hashes(req, self._state(req), max_blocks)[:max_blocks].tolist())

    def _blocks_to_allocate(self, held: int, num_tokens: int, hit: list[int]) -> int:
        """New blocks for num_tokens slots, beside the held ones and the hits, plus the hits
        that are free (taking them takes them out of the free queue)."""
        new = max(-(-num_tokens // self.page_size) - held - len(hit), 0)
        if len(hit) > NUMPY_FROM:
            return new + int(np.count_nonzero(self.pool._ref[hit] == 0))
        ref = self.pool.ref_cnt
        return new + sum(1 for b in hit if ref[b] == 0)

    def can_fit_full_sequence(self, req: Req, hit: list[int]) -> bool:
        """Whether all of req's known tokens find blocks now (vLLM's scheduler_reserve_full_isl)."""
        known = req.input_len + len(req.output_ids)
        return self._blocks_to_allocate(0, known, hit) <= self.pool.num_free_blocks()

    # -- slots ----------------------------------------------------------------------------
    def _slots(self, blocks: array, start: int, end: int) -> array:
        """The KV slots of positions start .. end - 1 in these blocks."""
        ps = self.page_size
        if ps == 1:
            return blocks[start:end]
        first, last = start // ps, (end - 1) // ps
        if first == last:
            out = ids()
            base = blocks[first] * ps
            extend_range(out, base + start % ps, base + (end - 1) % ps + 1)
            return out
        bl = np.frombuffer(blocks, dtype=np.int64)[first : last + 1]
        slots = (bl[:, None] * ps + np.arange(ps, dtype=np.int64)).ravel()
        return ids_of(slots[start - first * ps : end - first * ps])

    def allocate_slots(self, req: Req, num_new: int, hit: list[int] | None = None, cache: bool = True) -> array | None:
        """Slots for req's next num_new tokens: the KV slots of those tokens, written into its row,
        or None (nothing changes) when the free blocks are too few. A request being admitted
        (no row yet) passes its cache hit: it takes those blocks and a row, and its computed
        tokens start after them. Its full blocks of known tokens then enter the cache (with
        cache, else at cache_known_blocks)."""
        pool, ps, rows = self.pool, self.page_size, self.req_to_token_pool
        st = self._state(req)
        new_req = req.req_pool_idx is None
        hit = hit or []
        before = len(hit) * ps if new_req else req.seq_len
        need = self._blocks_to_allocate(len(st.blocks), before + num_new, hit)
        if need > pool.num_free_blocks():
            return None
        if new_req:
            pool.touch(hit)
            st.blocks = ids(hit)
            st.num_cached = len(hit)
            req.req_pool_idx = rows.alloc()
            assert req.req_pool_idx is not None, "max_num_seqs rows serve max_num_seqs running requests"
            if hit:
                rows.write(req.req_pool_idx, 0, self._slots(st.blocks, 0, before))
            req.seq_len = before
        more = -(-(before + num_new) // ps) - len(st.blocks)
        if more == 1:
            st.blocks.append(pool.get_new_block())
        elif more > 0:
            st.blocks.frombytes(pool.get_new_blocks(more).tobytes())
        if num_new == 1 and before % ps:  # a decode inside its last block: the next slot
            locs = ids((rows.req_to_token[req.req_pool_idx][before - 1] + 1,))
        else:
            locs = self._slots(st.blocks, before, before + num_new)
        rows.write(req.req_pool_idx, before, locs)
        req.seq_len = before + num_new
        if cache:
            self.cache_known_blocks(req)
        return locs

    def blocks_from_rows(self, reqs: list[Req]) -> None:
        """Each request's blocks extended by those its row's new slots lie in (slots written in
        bulk, by a decode stretch)."""
        ps, rows = self.page_size, self.req_to_token_pool.req_to_token
        for r in reqs:
            blocks, row = self.reqs[r].blocks, rows[r.req_pool_idx]
            if ps == 1:
                blocks.extend(row[len(blocks) :])
            else:
                firsts = np.frombuffer(row, dtype=np.int64)[len(blocks) * ps : r.seq_len : ps]
                blocks.frombytes((firsts // ps).tobytes())

    def cache_known_blocks(self, req: Req) -> None:
        """req's full blocks of known tokens whose KV its steps compute enter the cache."""
        self.cache_blocks(req, min(req.seq_len, req.input_len + len(req.output_ids)))

    def cache_known_blocks_of(self, reqs: list[Req]) -> None:
        """cache_known_blocks of each request in turn."""
        for r in reqs:
            self.cache_blocks(r, min(r.seq_len, r.input_len + len(r.output_ids)))

    def cache_blocks(self, req: Req, num_tokens: int) -> None:
        """req's full blocks among its first num_tokens tokens enter the cache (those not in yet).

        They are logged, and hashed and put in the pool's map in the logged order when the map
        is next read (flush_cache): a lookup, or the request freeing them (only then can they
        be evicted). Until then nothing reads which blocks are cached: the blocks are held, so
        neither the free queue nor the evictable count sees them. One vector pass then hashes
        many steps' blocks instead of one pass a step."""
        if not self.enable_caching:
            return
        st = self.reqs[req]
        full = num_tokens // self.page_size
        if full > st.num_cached:
            self.pending.append((req, st, st.num_cached, full))
            st.num_cached = full

    def flush_cache(self) -> None:
        """Put the logged blocks in the cache, in the order they were logged."""
        pending = self.pending
        if not pending:
            return
        self.pending = []
        ps, ends = self.page_size, {}
        for req, st, _, end in pending:
            ends[req] = (st, max(end, ends[req][1]) if req in ends else end)
        runs, firsts, parents, hashed = [], [], [], []
        for req, (st, end) in ends.items():
            have = len(st.hashes)
            if have < end:
                runs.append(np.frombuffer(self.known_tokens_between(req, have * ps, end * ps), dtype=np.int64))
                firsts.append(have)
                parents.append(int(st.hashes[have - 1]) if have else 0)
                hashed.append(st)
        if runs:
            for st, more in zip(hashed, hashes_of_runs(runs, firsts, parents, ps)):
                st.hashes = np.concatenate((st.hashes, more)) if len(st.hashes) else more
        if len(pending) == 1:
            _, st, start, end = pending[0]
            blocks, hashes = np.frombuffer(st.blocks, dtype=np.int64)[start:end], st.hashes[start:end]
        else:
            blocks = np.concatenate([np.frombuffer(st.blocks, dtype=np.int64)[start:end] for _, st, start, end in pending])
            hashes = np.concatenate([st.hashes[start:end] for _, st, start, end in pending])
        self.pool.cache_blocks(blocks, hashes)

    def free(self, req: Req) -> None:
        """Free req's blocks, its last block first (evicted first), and its row. Its hashes stay
        (a preempted request looks them up again); forget() drops them."""
        st = self.reqs.get(req)
        if st is not None and st.blocks:
            if self.pending:
                self.flush_cache()
            self.pool.free_blocks(np.frombuffer(st.blocks, dtype=np.int64)[::-1].copy())
            st.blocks, st.num_cached = ids(), 0
        if req.req_pool_idx is not None:
            self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx, req.seq_len = None, 0

    def forget(self, req: Req) -> None:
        """A request that has ended: nothing of it stays (free it first)."""
        self.reqs.pop(req, None)

    # -- counts ---------------------------------------------------------------------------
    def used_tokens(self) -> int:
        """Slots in blocks that requests hold."""
        return (self.pool.num_blocks - self.pool.num_free_blocks()) * self.page_size

    def cached_free_tokens(self) -> int:
        """Slots in free blocks that are cached: what eviction can take."""
        return self.pool.num_cached_free * self.page_size
