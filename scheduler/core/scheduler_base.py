"""What both schedulers do alike: end a request (rejected at arrival, or finished) and keep the
list of ended ones. SGLang's (scheduler/sglang/) and vLLM's (scheduler/vllm/) scheduler derive
from it; each keeps its own queues, batches, KV memory and admission."""

from __future__ import annotations

from scheduler.core.req import FinishReason, Req


class SchedulerBase:
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

    def _ended(self, req: Req, now: float) -> None:
        """A request that has its last token and no KV left: it keeps its outputs and metrics."""
        req.finish_time = now
        req.req_pool_idx = None
        req.pending_token = None
        req.release_tokens()
        self.done.append(req)
