"""vLLM's KV cache manager (vllm/v1/core/kv_cache_manager.py) on this project's pools: a
request's KV blocks allocated as its computed tokens grow (evicting cached blocks when
short), its full blocks put in the prefix cache as they fill, and all of it released on
finish or preemption. Blocks are pages of the allocator; the prefix cache is the radix
tree (or ChunkCache without prefix caching)."""

from __future__ import annotations

from array import array

from scheduler.memory.chunk_cache import ChunkCache
from scheduler.core.ids import ids
from scheduler.memory.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from scheduler.memory.radix_cache import RadixCache
from scheduler.core.req import Req


class VllmKVBlocks:
    def __init__(self, req_to_token_pool: ReqToTokenPool, allocator: TokenToKVPoolAllocator,
                 tree_cache: RadixCache | ChunkCache, page_size: int) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree_cache = tree_cache
        self.page_size = page_size

    @staticmethod
    def known_tokens(req: Req, end: int | None = None) -> array:
        """The request's known tokens (prompt, then outputs), the first `end` of them if given."""
        prompt = req.origin_input_ids
        if end is not None and end <= len(prompt):
            return prompt[:end]
        outs = req.output_ids if end is None else req.output_ids[: end - len(prompt)]
        return prompt + ids(outs) if outs else prompt

    def evict_for_running(self, running: list[Req], budget: int) -> None:
        """Evict, once, the cached blocks the running requests' next tokens will need: one
        pass over the cache's leaves per step instead of one per request (the same LRU
        victims, taken together)."""
        ps, need, left = self.page_size, 0, budget
        for req in running:
            if left <= 0:
                break
            pending = req.pending_token is not None
            if pending and len(req.output_ids) + 1 >= req.max_new_tokens:
                continue  # not scheduled: its last token is in flight
            n = min(req.input_len + len(req.output_ids) + pending - req.seq_len, left)
            if n > 0:
                need += -(-(req.seq_len + n) // ps) - (-(-req.seq_len // ps))
                left -= n
        short = need - self.allocator.num_free_pages()
        if short > 0:
            self.tree_cache.evict(short * ps)

    def allocate(self, req: Req, num_new: int, cache_blocks: bool = True) -> array | None:
        """KV slots for req's next num_new tokens (evicting cached blocks if short); None if
        the pool lacks blocks, then nothing is allocated. With cache_blocks, its full blocks
        enter the prefix cache at once (vLLM caches them when it allocates them)."""
        alloc, ps, pool = self.allocator, self.page_size, self.req_to_token_pool
        before = req.seq_len
        row = pool.req_to_token[req.req_pool_idx]
        if num_new == 1 and before % ps:  # a decode inside its last page: the next slot
            locs = ids((row[before - 1] + 1,))
        else:
            need_pages = -(-(before + num_new) // ps) - (-(-before // ps))
            short = need_pages - alloc.num_free_pages()
            if short > 0:
                self.tree_cache.evict(short * ps)
                if need_pages > alloc.num_free_pages():
                    return None
            last = row[before - 1] if before else -1
            locs = alloc.alloc_extend([last], [before], [num_new])
            assert locs is not None
        pool.write(req.req_pool_idx, before, locs)
        req.seq_len = before + num_new
        if cache_blocks:
            self.cache_full_blocks(req)
        return locs

    def cache_full_blocks(self, req: Req) -> None:
        """Put req's full blocks of known tokens in the prefix cache; it keeps using them, locked."""
        if self.tree_cache.disabled:
            return
        ps = self.page_size
        full = min(req.seq_len, req.input_len + len(req.output_ids)) // ps * ps
        have = len(req.prefix_indices)
        if full <= have:
            return
        tokens = self.known_tokens(req, full)
        cache = self.tree_cache
        # match_prefix(tokens) and _insert(tokens, kv), each from the request's own cached path
        # (its locked last_node spells tokens[:have]): the same walks, splits and stamps.
        if cache.match_len_below(tokens, req.last_node, have) > have:
            return  # another request cached some of these blocks first: ours stay private
        kv = self.req_to_token_pool.get(req.req_pool_idx, 0, full)
        _, node = cache._insert(tokens, kv, known=req.last_node)  # the tree takes our slots past `have`
        cache.inc_lock_ref(node)
        cache.dec_lock_ref(req.last_node)
        req.prefix_indices, req.last_node = kv, node

    def release(self, req: Req) -> None:
        """Free the request's KV: its private slots, its row, its lock on cached blocks."""
        pool = self.req_to_token_pool
        # Cached blocks stay in the cache (unlocked, evictable); the rest is the request's own.
        self.allocator.free(pool.get(req.req_pool_idx, len(req.prefix_indices), req.seq_len))
        pool.free(req.req_pool_idx)
        self.tree_cache.dec_lock_ref(req.last_node)
        req.req_pool_idx, req.prefix_indices, req.last_node, req.seq_len = None, ids(), None, 0
