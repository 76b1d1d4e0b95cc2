"""vLLM's BlockPool (vllm/v1/core/block_pool.py, release 0.19.0) on block ids: each KV block's
reference count and hash, the queue of free blocks in eviction order, and the prefix cache that
maps a block hash to the blocks holding it.

- The free queue (vLLM's FreeKVCacheBlockQueue) starts in block-id order. New blocks come
  from its front; a freed block goes to its back, so the least recently used is taken first.
  A request frees its blocks tail first, so its last block is evicted before its first.
- A cached block is a full block with a hash. It stays cached while it is free, until it is
  taken from the front of the queue for another use: that is an eviction, one block at a time,
  whether or not uncached free blocks wait behind it.
- A hit takes a cached block (touch): its count goes up, and a free one leaves the queue.
- The cache keeps duplicates: two requests that filled the same block each cache theirs, and
  a lookup gets the one cached first.

There is no null block: vLLM sets block 0 aside for sliding windows, which this pool has not,
so a pool here of N blocks is a vLLM pool of N + 1.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        assert num_blocks > 0
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        # Free blocks, front first: an OrderedDict pops its front and drops a block from its
        # middle in O(1), as vLLM's linked list does.
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # hash -> the block holding it, or {block: None, ...} in caching order when several do.
        self.cached: dict[int, int | dict[int, None]] = {}
        self.num_cached_free = 0  # free blocks that are cached: what eviction can take

    # -- reading -----------------------------------------------------------------
    def num_free_blocks(self) -> int:
        """Free blocks, cached ones included (vLLM's get_num_free_blocks)."""
        return len(self.free_queue)

    def cached_block(self, block_hash: int) -> int | None:
        """The block cached first under this hash, if any."""
        blocks = self.cached.get(block_hash)
        if blocks is None or isinstance(blocks, int):
            return blocks
        return next(iter(blocks))

    # -- taking and freeing ----------------------------------------------------------
    def get_new_blocks(self, n: int, evicted_at: list[int] | None = None) -> list[int]:
        """n blocks from the front of the free queue, each evicted from the cache if cached
        (their places among the n appended to evicted_at, if given)."""
        assert n <= len(self.free_queue), f"{n} blocks wanted, {len(self.free_queue)} free"
        pop, ref, hashes = self.free_queue.popitem, self.ref_cnt, self.block_hash
        out = []
        for i in range(n):
            b = pop(last=False)[0]
            if hashes[b] is not None:
                self._evict(b)
                if evicted_at is not None:
                    evicted_at.append(i)
            ref[b] = 1
            out.append(b)
        return out

    def _evict(self, b: int) -> None:
        """Drop free block b from the cache (it is being taken)."""
        h = self.block_hash[b]
        blocks = self.cached.pop(h)
        if not isinstance(blocks, int):
            del blocks[b]
            if blocks:
                self.cached[h] = blocks
        self.block_hash[b] = None
        self.num_cached_free -= 1

    def touch(self, blocks: Iterable[int]) -> None:
        """Blocks a request takes from the cache: a free one leaves the queue."""
        ref, queue, hashes = self.ref_cnt, self.free_queue, self.block_hash
        for b in blocks:
            if ref[b] == 0:
                del queue[b]
                if hashes[b] is not None:
                    self.num_cached_free -= 1
            ref[b] += 1

    def free_blocks(self, ordered: Iterable[int]) -> None:
        """Drop one reference from each block; those left unreferenced join the back of the
        queue in the given order (the first given is evicted first)."""
        ref, queue, hashes = self.ref_cnt, self.free_queue, self.block_hash
        for b in ordered:
            ref[b] -= 1
            if ref[b] == 0:
                queue[b] = None
                if hashes[b] is not None:
                    self.num_cached_free += 1

    def cache_block(self, b: int, block_hash: int) -> None:
        """Block b (held, full) enters the cache under block_hash, beside any duplicate."""
        assert self.block_hash[b] is None and self.ref_cnt[b] > 0
        self.block_hash[b] = block_hash
        blocks = self.cached.get(block_hash)
        if blocks is None:
            self.cached[block_hash] = b
        elif isinstance(blocks, int):
            self.cached[block_hash] = {blocks: None, b: None}
        else:
            blocks[b] = None

    # -- checks ------------------------------------------------------------------------
    def errors_when_idle(self) -> list[str]:
        """What is wrong with a pool no request holds: each block free once, the cache's map
        and the blocks' hashes in agreement."""
        errors = []
        if any(self.ref_cnt):
            errors.append(f"{sum(1 for c in self.ref_cnt if c)} KV blocks still referenced")
        if len(self.free_queue) != self.num_blocks:
            errors.append(f"KV leak: {self.num_blocks - len(self.free_queue)} blocks neither free nor held")
        in_map = {b: h for h, v in self.cached.items() for b in ([v] if isinstance(v, int) else v)}
        hashed = {b: h for b, h in enumerate(self.block_hash) if h is not None}
        if in_map != hashed or self.num_cached_free != len(hashed):
            errors.append("the prefix cache's map, the blocks' hashes and its evictable count disagree")
        return errors
