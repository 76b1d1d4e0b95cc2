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
  a lookup gets the one cached first (of those still cached).

There is no null block: vLLM sets block 0 aside for sliding windows, which this pool has not,
so a pool here of N blocks is a vLLM pool of N + 1.

The counts and hashes are arrays with numpy views of the same memory: one block at a time goes
through the array (a decode), a run of blocks (a prefill, a freed request, a decode stretch)
through numpy; so does the map from hash to blocks (block_hash_index.py), which gets a cached
block's hash only once a lookup may need it (add_hashes; kv_blocks.py and unhashed_blocks.py
say when).
"""

from __future__ import annotations

from array import array
from typing import Sequence

import numpy as np

from scheduler.vllm.block_hash_index import BlockHashIndex
from scheduler.vllm.free_block_queue import FreeBlockQueue

# Hashes a lookup tries at first, then twice as many each time all of them hit: a prompt's
# cached prefix is mostly short beside its length (the Mooncake trace: 33 of ~750 blocks on
# average), and a lookup stops at its first miss. 64: one try for nearly every lookup there.
FIRST_PROBES = 64


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        assert num_blocks > 0
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = array("i", bytes(4 * num_blocks))
        self._ref = np.frombuffer(self.ref_cnt, dtype=np.int32)
        self.block_hash = array("Q", bytes(8 * num_blocks))  # meaningful where is_cached, once added (add_hashes)
        self._hash = np.frombuffer(self.block_hash, dtype=np.uint64)
        self.is_cached = bytearray(num_blocks)
        self._is_cached = np.frombuffer(self.is_cached, dtype=np.uint8)
        self.free_queue = FreeBlockQueue(num_blocks)
        self._index: BlockHashIndex | None = None  # made when a block is first cached
        self.num_cached_free = 0  # free blocks that are cached: what eviction can take
        self.num_evicted = 0  # blocks evicted so far

    @property
    def index(self) -> BlockHashIndex:
        """hash -> the cached blocks holding it. Made on first use: a pool that never caches (prefix
        caching off) spares its tables (20 ms at a B200's pool, a tenth of a short replay)."""
        if self._index is None:
            self._index = BlockHashIndex(self.num_blocks, self._hash)
        return self._index

    # -- reading -----------------------------------------------------------------
    def num_free_blocks(self) -> int:
        """Free blocks, cached ones included (vLLM's get_num_free_blocks)."""
        return len(self.free_queue)

    def longest_hit(self, hashes: np.ndarray) -> list[int]:
        """The cached blocks of the longest run of these block hashes, from the first, that are
        all cached (the block cached first under each)."""
        found, start, n = [], 0, FIRST_PROBES
        while start < len(hashes):
            blocks = self.index.first_blocks(hashes[start : start + n])
            missed = (blocks < 0).nonzero()[0]
            if len(missed):
                found.extend(blocks[: missed[0]].tolist())
                break
            found.extend(blocks.tolist())
            start, n = start + n, 2 * n
        return found

    @property
    def cached(self) -> dict[int, tuple[int, ...]]:
        """Every hash in the cache -> the blocks holding it, in caching order (for checks)."""
        return self.index.holders()

    # -- taking and freeing ----------------------------------------------------------
    def get_new_block(self) -> int:
        """The front block of the free queue, evicted from the cache if cached."""
        b = self.free_queue.popleft()
        if self.is_cached[b]:
            self.index.uncache_one(b)
            self.is_cached[b] = 0
            self.num_cached_free -= 1
            self.num_evicted += 1
        self.ref_cnt[b] = 1
        return b

    def get_new_blocks(self, n: int, evicted_at: list[int] | None = None) -> np.ndarray:
        """The first n blocks of the free queue, each evicted from the cache if cached (their
        places among the n appended to evicted_at, if given)."""
        blocks = self.free_queue.popleft_n(n)
        if self.num_cached_free:
            places = self._is_cached[blocks].nonzero()[0]
            if len(places):
                self._evict(blocks[places])
                if evicted_at is not None:
                    evicted_at.extend(places.tolist())
        self._ref[blocks] = 1
        return blocks

    def _evict(self, blocks: np.ndarray) -> None:
        """Drop these free cached blocks from the cache (they are being taken)."""
        self.index.uncache(blocks)
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
        left = ref.take(ordered) - 1
        ref[ordered] = left
        zero = ordered[left == 0]
        if len(zero):
            self.free_queue.append_n(zero)
            self.num_cached_free += int(np.count_nonzero(self._is_cached[zero]))

    def cache_blocks(self, blocks: np.ndarray) -> None:
        """These blocks (held, full, not cached) enter the cache now, in this order, beside any
        duplicate; their hashes come later (add_hashes), before any lookup."""
        self._is_cached[blocks] = 1
        self.index.cache(blocks)

    def cache_block(self, b: int) -> None:
        self.is_cached[b] = 1
        self.index.cache_one(b)

    def entries(self, blocks: np.ndarray) -> np.ndarray:
        """These cached blocks' entries (block_hash_index.py), to give add_hashes."""
        return self.index.entries_of(blocks)

    def add_hashes(self, blocks: np.ndarray, hashes: np.ndarray, entries: np.ndarray) -> None:
        """The hashes of blocks cached (with these entries) since, for lookups: those evicted
        meanwhile are left out."""
        self.index.add(blocks, hashes, entries)

    # -- checks ------------------------------------------------------------------------
    def errors_when_idle(self) -> list[str]:
        """What is wrong with a pool no request holds: each block free once, the cache's map
        and the blocks' hashes in agreement."""
        errors = []
        if self._ref.any():
            errors.append(f"{int(np.count_nonzero(self._ref))} KV blocks still referenced")
        order = self.free_queue.order()
        # blocks free once each: a count per block id (np.unique hashes them: 70 ms at a B200's 100k blocks)
        distinct = int(np.count_nonzero(np.bincount(order, minlength=self.num_blocks))) if len(order) else 0
        if len(order) != self.num_blocks or len(self.free_queue) != self.num_blocks or distinct != len(order):
            errors.append(f"KV leak: {self.num_blocks - distinct} blocks neither free nor held")
        cached = self._is_cached != 0
        in_map = self._index.cached() if self._index is not None else np.zeros(self.num_blocks, dtype=bool)
        if not np.array_equal(cached, in_map) or self.num_cached_free != int(np.count_nonzero(cached)):
            errors.append("the prefix cache's map, the blocks' hashes and its evictable count disagree")
        return errors + (self._index.errors() if self._index is not None else [])
