"""ChunkCache: the `--disable-radix-cache` variant. Same interface, no sharing.

A request's slots are its own; chunked prefill still works because
cache_unfinished_req hands the request its own slots back as its prefix.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Sequence

from scheduler.core.ids import ids
from scheduler.memory.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from scheduler.memory.radix_cache import finished_kv_len

if TYPE_CHECKING:
    from scheduler.core.req import Req


class ChunkCache:
    disabled = True

    def __init__(self, req_to_token_pool: ReqToTokenPool, allocator: TokenToKVPoolAllocator, page_size: int = 1) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.page_size = page_size

    def reset(self) -> None:
        pass

    def match_prefix(self, key: Sequence[int], max_len: int | None = None) -> tuple[array, None]:
        return ids(), None

    def touch_prefix(self, key: Sequence[int]) -> None:
        pass

    def locked_prefix_len(self, key: Sequence[int]) -> int:
        return 0

    def cached_prefix_len(self, key: Sequence[int]) -> int:
        return 0

    def insert(self, key: Sequence[int], value: Sequence[int]) -> int:
        return 0

    def inc_lock_ref(self, node: None) -> None:
        pass

    def dec_lock_ref(self, node: None) -> None:
        pass

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def evict(self, num_tokens: int) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def all_values(self) -> array:
        return ids()

    def cache_finished_req(self, req: Req) -> None:
        self.allocator.free(self.req_to_token_pool.get(req.req_pool_idx, 0, finished_kv_len(req)))
        self.req_to_token_pool.free(req.req_pool_idx)

    def cache_unfinished_req(self, req: Req) -> None:
        req.prefix_indices = self.req_to_token_pool.get(req.req_pool_idx, 0, len(req.fill_ids))
