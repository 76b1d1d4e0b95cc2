"""vLLM's BlockPool (vllm/v1/core/block_pool.py, release 0.19.0) on block ids: each KV block's
reference count and hash, the queue of free blocks in eviction order (free_block_queue.py),
and the prefix cache that maps a block hash to the blocks holding it.

- The free queue starts in block-id order. New blocks come from its front; a freed block goes
  to its back, so the least recently used is taken first. A request frees its blocks tail
  first, so its last block is evicted before its first.
- A cached block is a full block with a hash. It stays cached while it is free, until it is
  taken from the front of the queue for another use: that is an eviction, one block at a time,
  whether or not uncached free blocks wait behind it.
- A hit takes a cached block (touch): its count goes up, and a free one leaves the queue.
- The cache keeps duplicates: two requests that filled the same block each cache theirs, and
  a lookup gets the one cached first.

There is no null block: vLLM sets block 0 aside for sliding windows, which this pool has not,
so a pool here of N blocks is a vLLM pool of N + 1.

The counts and hashes are arrays with numpy views of the same memory: one block at a time goes
through the array (a decode), a run of blocks (a prefill, a freed request, a decode stretch)
through numpy.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import Sequence

import numpy as np

from scheduler.vllm.free_block_queue import FreeBlockQueue


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        assert num_blocks > 0
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = array("i", bytes(4 * num_blocks))
        self._ref = np.frombuffer(self.ref_cnt, dtype=np.int32)
        self.block_hash = array("Q", bytes(8 * num_blocks))  # meaningful where is_cached
        self._hash = np.frombuffer(self.block_hash, dtype=np.uint64)
        self.is_cached = bytearray(num_blocks)
        self._is_cached = np.frombuffer(self.is_cached, dtype=np.uint8)
        self.free_queue = FreeBlockQueue(num_blocks)
        # hash -> the block holding it, or {block: None, ...} in caching order when several do.
        self.cached: dict[int, int | dict[int, None]] = {}
        self.num_duplicated = 0  # hashes that several blocks hold
        self.num_cached_free = 0  # free blocks that are cached: what eviction can take
        self.num_evicted = 0  # blocks evicted so far

    # -- reading -----------------------------------------------------------------
    def num_free_blocks(self) -> int:
        """Free blocks, cached ones included (vLLM's get_num_free_blocks)."""
        return len(self.free_queue)

    def longest_hit(self, hashes: Sequence[int]) -> list[int]:
        """The cached blocks of the longest run of these block hashes, from the first, that are
        all cached (the block cached first under each)."""
        found = list(map(self.cached.get, hashes))
        try:
            found = found[: found.index(None)]
        except ValueError:
            pass
        if self.num_duplicated:
            found = [b if type(b) is int else next(iter(b)) for b in found]
        return found

    # -- taking and freeing ----------------------------------------------------------
    def get_new_block(self) -> int:
        """The front block of the free queue, evicted from the cache if cached."""
        b = self.free_queue.popleft()
        if self.is_cached[b]:
            self._evict_one(b)
        self.ref_cnt[b] = 1
        return b

    def get_new_blocks(self, n: int, evicted_at: list[int] | None = None) -> np.ndarray:
        """The first n blocks of the free queue, each evicted from the cache if cached (their
        places among the n appended to evicted_at, if given)."""
        blocks = self.free_queue.popleft_n(n)
        if self.num_cached_free:
            places = np.flatnonzero(self._is_cached[blocks])
            if len(places):
                self._evict(blocks[places])
                if evicted_at is not None:
                    evicted_at.extend(places.tolist())
        self._ref[blocks] = 1
        return blocks

    def _evict_one(self, b: int) -> None:
        h = self.block_hash[b]
        blocks = self.cached.pop(h)
        if type(blocks) is not int:
            del blocks[b]
            if len(blocks) == 1:
                self.cached[h] = next(iter(blocks))
                self.num_duplicated -= 1
            else:
                self.cached[h] = blocks
        self.is_cached[b] = 0
        self.num_cached_free -= 1
        self.num_evicted += 1

    def _evict(self, blocks: np.ndarray) -> None:
        """Drop these free cached blocks from the cache (they are being taken)."""
        if self.num_duplicated:
            for b in blocks.tolist():
                self._evict_one(b)
            return
        deque(map(self.cached.pop, self._hash[blocks].tolist()), 0)
        self._is_cached[blocks] = 0
        self.num_cached_free -= len(blocks)
        self.num_evicted += len(blocks)

    def touch(self, blocks: Sequence[int]) -> None:
        """Cached blocks a request takes (its prefix hit): a free one leaves the queue."""
        if not blocks:
            return
        b = np.asarray(blocks, dtype=np.int64)
        free = b[self._ref[b] == 0]
        if len(free):
            self.free_queue.remove_n(free)
            self.num_cached_free -= len(free)
        self._ref[b] += 1

    def free_blocks(self, ordered: np.ndarray) -> None:
        """Drop one reference from each block; those left unreferenced join the back of the
        queue in the given order (the first given is evicted first)."""
        ref = self._ref
        ref[ordered] -= 1
        zero = ordered[ref[ordered] == 0]
        if len(zero):
            self.free_queue.append_n(zero)
            self.num_cached_free += int(np.count_nonzero(self._is_cached[zero]))

    def cache_block(self, b: int, block_hash: int) -> None:
        """Block b (held, full) enters the cache under block_hash, beside any duplicate."""
        self.block_hash[b] = block_hash
        self.is_cached[b] = 1
        blocks = self.cached.get(block_hash)
        if blocks is None:
            self.cached[block_hash] = b
        elif type(blocks) is int:
            self.cached[block_hash] = {blocks: None, b: None}
            self.num_duplicated += 1
        else:
            blocks[b] = None

    def cache_blocks(self, blocks: np.ndarray, hashes: np.ndarray) -> None:
        """These blocks (held, full) enter the cache under these hashes, in order."""
        self._hash[blocks] = hashes
        self._is_cached[blocks] = 1
        keys = hashes.tolist()
        cached = self.cached
        if any(map(cached.__contains__, keys)) or len(set(keys)) != len(keys):
            for b, h in zip(blocks.tolist(), keys):
                self.cache_block(b, h)
        else:
            cached.update(zip(keys, blocks.tolist()))

    # -- checks ------------------------------------------------------------------------
    def errors_when_idle(self) -> list[str]:
        """What is wrong with a pool no request holds: each block free once, the cache's map
        and the blocks' hashes in agreement."""
        errors = []
        if self._ref.any():
            errors.append(f"{int(np.count_nonzero(self._ref))} KV blocks still referenced")
        order = self.free_queue.order()
        if len(order) != self.num_blocks or len(self.free_queue) != self.num_blocks or len(np.unique(order)) != len(order):
            errors.append(f"KV leak: {self.num_blocks - len(np.unique(order))} blocks neither free nor held")
        in_map = {b: h for h, v in self.cached.items() for b in ([v] if type(v) is int else v)}
        hashed = {b: self.block_hash[b] for b in np.flatnonzero(self._is_cached).tolist()}
        duplicated = sum(1 for v in self.cached.values() if type(v) is not int)
        if in_map != hashed or self.num_cached_free != len(hashed) or duplicated != self.num_duplicated:
            errors.append("the prefix cache's map, the blocks' hashes and its evictable count disagree")
        return errors
