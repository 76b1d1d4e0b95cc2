"""What both schedulers do alike: end a request (rejected at arrival, or finished), count the KV
in use, and check the end of a run. SGLang's (scheduler/sglang/) and vLLM's (scheduler/vllm/)
scheduler derive from it; each keeps its own queues, batches and admission."""

from __future__ import annotations

from scheduler.core.invariants import check_end_of_run
from scheduler.core.req import FinishReason, Req
from scheduler.memory.chunk_cache import ChunkCache
from scheduler.memory.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from scheduler.memory.radix_cache import RadixCache


class SchedulerBase:
    req_to_token_pool: ReqToTokenPool
    allocator: TokenToKVPoolAllocator
    tree_cache: RadixCache | ChunkCache
    waiting_queue: object  # a list (SGLang) or a WaitingQueue (vLLM): sized, iterable
    done: list[Req]  # finished and rejected requests, in finishing order
    num_requests: int

    def is_idle(self) -> bool:
        raise NotImplementedError

    def num_running(self) -> int:
        raise NotImplementedError

    def _reject(self, req: Req, reason: str) -> None:
        """Ended at arrival, never run: it finishes when it arrived, with the reason."""
        req.finished_reason = FinishReason.REJECTED
        req.reject_reason = reason
        req.finish_time = req.arrival_time
        self.done.append(req)

    def finish(self, req: Req, now: float) -> None:
        """A request has its last token: its KV goes to the cache (or is freed), its row too."""
        req.finish_time = now
        if req.req_pool_idx is not None:  # (vLLM: preempted while its last token was in flight)
            self.tree_cache.cache_finished_req(req)
            req.req_pool_idx = None
        req.pending_token = None
        req.release_tokens()
        self.done.append(req)

    def kv_used_tokens(self) -> int:
        """Slots held by requests or locked in the cache (not counting evictable cache)."""
        return self.allocator.size - self.allocator.available_size() - self.tree_cache.evictable_size()

    def check_invariants(self) -> None:
        """At the end of a run: every KV slot free or held by the cache, every request done right."""
        check_end_of_run(
            idle=self.is_idle(),
            waiting=self.waiting_queue,
            num_running=self.num_running(),
            allocator=self.allocator,
            cache=self.tree_cache,
            req_to_token_pool=self.req_to_token_pool,
            done=self.done,
            num_requests=self.num_requests,
        )
