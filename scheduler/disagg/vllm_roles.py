"""vLLM's scheduler (scheduler/vllm/) in a prefill role and a decode role (roles.py), on SGLang's
PD flow.

vLLM's own (a KV connector such as NIXL's) differs in one way kept out here: its decode instance
recomputes the prompt's last token and samples the first output token itself, after the transfer.
What is vLLM's here: a prefill instance keeps a request's blocks until the transfer is done (the
connector's delayed free), and a decode instance reserves the prompt's blocks for a waiting
request as its scheduler allocates the remote prompt tokens (any free or evictable block, no
reserve beyond; a request row of its max_num_seqs for each running or pre-allocated request).
These classes live beside scheduler/vllm/ and use its scheduler's own methods and its KV manager's.
"""

from __future__ import annotations

from scheduler.core.req import Req
from scheduler.disagg.roles import DecodeRole, PrefillRole
from scheduler.vllm.config import VllmSchedulerConfig
from scheduler.vllm.scheduler import VllmScheduler


class VllmPrefill(PrefillRole, VllmScheduler):
    """A prefill instance: vLLM's scheduler, whose requests end at their first token and keep
    their blocks (the prompt's full blocks in the prefix cache) until they have crossed."""

    def __init__(self, config: VllmSchedulerConfig) -> None:
        VllmScheduler.__init__(self, config)
        self._init_prefill_role()

    def _hold(self, req: Req) -> None:
        pass  # its blocks stay allocated

    def _release_kv(self, req: Req) -> None:
        self.kv.free(req)
        self.kv.forget(req)


class VllmDecode(DecodeRole, VllmScheduler):
    """A decode instance: vLLM's scheduler; a request takes its prompt's blocks when they fit."""

    def __init__(self, config: VllmSchedulerConfig) -> None:
        VllmScheduler.__init__(self, config)
        self._init_decode_role()

    def check_arrival(self, req: Req) -> bool:
        """vLLM's checks at arrival (add_request's), without its waiting queue."""
        VllmScheduler.add_request(self, req)
        if req.finished_reason is not None:
            return False  # rejected
        self.waiting_queue.remove(req)
        return True

    def _never_preallocated(self, req: Req) -> str | None:
        return None  # add_request's check (prompt + output fit the pool) covers the prompt's blocks

    def _try_preallocate(self, req: Req) -> bool:
        if self.req_to_token_pool.available_size() <= 0:
            return False
        return self.kv.allocate_slots(req, req.input_len, cache=False) is not None

    def _join_running(self, req: Req) -> None:
        self.running.append(req)

    def _free_preallocated(self, req: Req) -> None:
        self.kv.free(req)
        self.kv.forget(req)
