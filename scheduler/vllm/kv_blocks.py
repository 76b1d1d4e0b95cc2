"""vLLM's KV cache manager (vllm/v1/core/kv_cache_manager.py) on this project's pools: a
request's KV blocks allocated as its computed tokens grow (evicting cached blocks when
short), its full blocks put in the prefix cache as they fill, and all of it released on
finish or preemption. Blocks are pages of the allocator; the prefix cache is the radix
tree (or ChunkCache without prefix caching)."""

from __future__ import annotations

from array import array

from scheduler.core.ids import ids
from scheduler.core.req import Req
from scheduler.memory.chunk_cache import ChunkCache
from scheduler.memory.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from scheduler.memory.radix_cache import RadixCache


class VllmKVBlocks:
    def __init__(
        self, req_to_token_pool: ReqToTokenPool, allocator: TokenToKVPoolAllocator, tree_cache: RadixCache | ChunkCache, page_size: int
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree_cache = tree_cache
        self.page_size = page_size

    @staticmethod
    def known_tokens(req: Req) -> array:
        """The request's known tokens: prompt, then outputs."""
        prompt = req.origin_input_ids
        return prompt + ids(req.output_ids) if req.output_ids else prompt

    @staticmethod
    def known_tokens_between(req: Req, start: int, end: int) -> array:
        """Known tokens start .. end - 1 (of the prompt, then the outputs)."""
        prompt = req.origin_input_ids
        n = len(prompt)
        if end <= n:
            return prompt[start:end]
        outs = ids(req.output_ids[max(start - n, 0) : end - n])
        return prompt[start:] + outs if start < n else outs

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
        # match_prefix and insert of its first `full` known tokens, each from the request's own
        # cached path (its locked last_node spells the first `have`): the same walks, splits and
        # stamps, handed only the tokens past `have`.
        tail = self.known_tokens_between(req, have, full)
        cache = self.tree_cache
        if cache.match_len_after(req.last_node, tail) > 0:
            return  # another request cached some of these blocks first: ours stay private
        tail_kv = self.req_to_token_pool.get(req.req_pool_idx, have, full)
        node = cache.insert_after(req.last_node, have, tail, tail_kv)  # the tree takes these slots
        cache.inc_lock_ref(node)
        cache.dec_lock_ref(req.last_node)
        req.prefix_indices, req.last_node = req.prefix_indices + tail_kv, node

    def release(self, req: Req) -> None:
        """Free the request's KV: its private slots, its row, its lock on cached blocks."""
        pool = self.req_to_token_pool
        # Cached blocks stay in the cache (unlocked, evictable); the rest is the request's own.
        self.allocator.free(pool.get(req.req_pool_idx, len(req.prefix_indices), req.seq_len))
        pool.free(req.req_pool_idx)
        self.tree_cache.dec_lock_ref(req.last_node)
        req.req_pool_idx, req.prefix_indices, req.last_node, req.seq_len = None, ids(), None, 0
