"""vLLM's KV cache manager (vllm/v1/core/kv_cache_manager.py and single_type_kv_cache_manager.py's
FullAttentionManager, release 0.19.0) on a BlockPool (block_pool.py): each request's blocks, its
block hashes (block_hashes.py), its longest cached prefix, the slots its next tokens take, the
full blocks it puts in the prefix cache, and freeing it all, tail first.

A block b holds KV slots b * page_size .. b * page_size + page_size - 1; a request's row in the
ReqToTokenPool lists the slots of its tokens, which is what a forward reads.
"""

from __future__ import annotations

from array import array

import numpy as np

from scheduler.core.ids import extend_range, ids
from scheduler.core.req import Req
from scheduler.memory.memory_pool import ReqToTokenPool
from scheduler.vllm.block_hashes import block_hashes
from scheduler.vllm.block_pool import FIRST_PROBES, BlockPool
from scheduler.vllm.request_blocks import RequestBlocks, known_tokens_between
from scheduler.vllm.stretch_blocks import window_slots
from scheduler.vllm.unhashed_blocks import UnhashedBlocks

__all__ = ["RequestBlocks", "VllmKVBlocks", "ids_of"]

# Runs of blocks shorter than this are counted in a Python loop: numpy's fixed cost (a few
# microseconds a call) is more than a loop over so few.
NUMPY_FROM = 16
# Blocks a lookup hashes at first, then twice as many each time all of them hit (block_pool's
# FIRST_PROBES: a lookup stops at its first miss, within 64 blocks for nearly every Mooncake
# prompt, whose 750 blocks would cost ~60 us to hash).
FIRST_HASHED = FIRST_PROBES


def ids_of(blocks: np.ndarray) -> array:
    """A numpy array of block ids or slots as an int64 array."""
    out = ids()
    out.frombytes(memoryview(np.ascontiguousarray(blocks, dtype=np.int64)).cast("B"))
    return out


class VllmKVBlocks:
    def __init__(self, req_to_token_pool: ReqToTokenPool, num_blocks: int, page_size: int, enable_caching: bool) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.pool = BlockPool(num_blocks, enable_caching)
        self.page_size = page_size
        self.enable_caching = enable_caching
        self.reqs: dict[Req, RequestBlocks] = {}
        self.unhashed = UnhashedBlocks(self.pool, page_size)  # cached blocks not in the map yet

    # -- tokens and hashes ------------------------------------------------------------
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
            if num_blocks * ps <= req.input_len:  # (the prompt's, read in place)
                tokens = np.frombuffer(req.origin_input_ids, dtype=np.int64)[have * ps : num_blocks * ps]
            else:
                tokens = np.frombuffer(known_tokens_between(req, have * ps, num_blocks * ps), dtype=np.int64)
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
        st = self._state(req)
        hit, hashes = self._longest_hit(req, st, max_blocks)
        # Waiting blocks may extend the hit: those below the blocks looked up go in the map (each
        # time the hit grows past them, up to the blocks looked up then).
        while len(hit) < max_blocks and self.unhashed.may_hold(len(hit), hashes[len(hit)]):
            self.unhashed.flush(below=len(hashes))
            hit, hashes = self._longest_hit(req, st, max_blocks)
        return hit

    def _longest_hit(self, req: Req, st: RequestBlocks, max_blocks: int) -> tuple[list[int], np.ndarray]:
        """The longest cached prefix of req's first max_blocks blocks, and the hashes it looked
        up (at least one past the hit, unless all hit). Only the blocks a lookup reaches are
        hashed: it stops at its first miss, mostly within the first FIRST_HASHED blocks; the
        rest are hashed by a flush (unhashed_blocks.py), if one comes before they are evicted."""
        n = min(FIRST_HASHED, max_blocks)
        while True:
            hashes = self._hashes(req, st, n)[:n]
            hit = self.pool.longest_hit(hashes)
            if len(hit) < n or n == max_blocks:
                return hit, hashes
            n = min(2 * n, max_blocks)

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
            st.num_cached = st.num_hashed = len(hit)  # (hits: cached, hashes in the pool)
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

    def allocate_decode(self, req: Req) -> int:
        """allocate_slots(req, 1, cache=False) of a running request (a row, its blocks covering
        its computed tokens), as the one slot, or -1 for None: the slot after its last, in a new
        block when that one is full. The step's most common call, kept to a few operations."""
        rows = self.req_to_token_pool
        before, ps = req.seq_len, self.page_size
        row = rows.req_to_token[req.req_pool_idx]
        if rows.journal is not None or len(row) != before:
            locs = self.allocate_slots(req, 1, cache=False)
            return -1 if locs is None else locs[0]
        blocks = self.reqs[req].blocks
        if -(-(before + 1) // ps) > len(blocks):
            if not len(self.pool.free_queue):
                return -1
            b = self.pool.get_new_block()
            blocks.append(b)
            loc = b * ps
        else:
            loc = row[before - 1] + 1
        row.append(loc)
        req.seq_len = before + 1
        return loc

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

    def extend_decoding(self, reqs: list[Req], num_steps: list[int], taken: np.ndarray) -> None:
        """Decode steps of these requests at once (a decode stretch's window, blocks of more
        than one slot; request i in the first num_steps[i]): each request's slots, written into
        its row, and its blocks, from those the steps took (stretch_blocks.window_slots)."""
        rows = self.req_to_token_pool.req_to_token
        w = window_slots([r.seq_len for r in reqs], [rows[r.req_pool_idx][r.seq_len - 1] for r in reqs], taken, num_steps, self.page_size)
        assert sum(map(len, w.new_blocks)) == len(taken), "a decode stretch took other blocks than its steps need"
        for r, slots, blocks, n in zip(reqs, w.slots, w.new_blocks, num_steps):
            rows[r.req_pool_idx].frombytes(memoryview(slots).cast("B"))
            r.seq_len += n
            if len(blocks):
                self.reqs[r].blocks.frombytes(memoryview(blocks).cast("B"))

    def cache_filled(self, reqs: list[Req], filled: list[tuple[int, int, int]]) -> None:
        """Blocks of these requests enter the cache in this order: (step, i, b) is block b of
        reqs[i], after those it has in (a decode stretch's filled blocks:
        stretch_blocks.filled_blocks; the requests without one may have finished)."""
        states = self.reqs
        held = [(states[reqs[i]], b) for _, i, b in filled]
        self.pool.cache_blocks(np.array([st.blocks[b] for st, b in held], dtype=np.int64))
        pending = self.unhashed.pending
        for (st, _), (_, i, _) in zip(held, filled):
            st.num_cached += 1
            pending[st] = reqs[i]

    def cache_known_blocks(self, req: Req) -> None:
        """req's full blocks of known tokens whose KV its steps compute enter the cache."""
        self.cache_blocks(req, min(req.seq_len, req.input_len + len(req.output_ids)))

    def cache_known_blocks_of(self, reqs: list[Req]) -> None:
        """cache_known_blocks of each request in turn (a decode fills a block once in page_size
        steps: most requests of a step have none to cache, told here without a call)."""
        if not self.enable_caching:
            return
        states, ps = self.reqs, self.page_size
        for r in reqs:
            n = r.input_len + len(r.output_ids)
            if r.seq_len < n:
                n = r.seq_len
            if n // ps > states[r].num_cached:
                self.cache_blocks(r, n)

    def cache_blocks(self, req: Req, num_tokens: int) -> None:
        """req's full blocks among its first num_tokens tokens enter the cache (those not in yet):
        counted, evictable once free and in caching order now, hashed and in the pool's map of
        hashes when a lookup may need them (unhashed_blocks.py)."""
        if not self.enable_caching:
            return
        st = self.reqs[req]
        full, start = num_tokens // self.page_size, st.num_cached
        if full > start:
            if full == start + 1:
                self.pool.cache_block(st.blocks[start])
            else:
                self.pool.cache_blocks(np.frombuffer(st.blocks, dtype=np.int64)[start:full])
            st.num_cached = full
            self.unhashed.pending[st] = req

    def flush_cache(self) -> None:
        """Every cached block's hash in the pool's map (for checks that read it)."""
        self.unhashed.flush()

    def free(self, req: Req) -> None:
        """Free req's blocks, its last block first (evicted first), and its row. Its hashes stay
        (a preempted request looks them up again); forget() drops them."""
        st = self.reqs.get(req)
        if st is not None and st.blocks:
            self.unhashed.freeing(req, st)
            self.pool.free_blocks(np.frombuffer(st.blocks, dtype=np.int64)[::-1].copy())
            st.blocks, st.num_cached, st.num_hashed = ids(), 0, 0
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
