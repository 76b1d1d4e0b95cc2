"""SGLang's scheduler (scheduler/sglang/) in a prefill role and a decode role (roles.py)."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core.req import Req
from scheduler.disagg.roles import DecodeRole, PrefillRole
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.prefill_adder import CLIP_MAX_NEW_TOKENS
from scheduler.sglang.scheduler import Scheduler

# Decode tokens the decode side keeps free for each request it has (running, pre-allocated,
# waiting) and one being pre-allocated: SGLANG_NUM_RESERVED_DECODE_TOKENS's default.
RESERVED_DECODE_TOKENS = 512


class SglangPrefill(PrefillRole, Scheduler):
    """A prefill instance: SGLang's scheduler (its radix cache, chunking, policy), whose requests
    end at their first token and hold their KV until it has crossed."""

    def __init__(self, config: SchedulerConfig) -> None:
        Scheduler.__init__(self, config)
        self._init_prefill_role()

    def _hold(self, req: Req) -> None:
        # SGLang's process_batch_result_disagg_prefill: the prompt goes to the tree, still locked.
        self.tree_cache.cache_unfinished_req(req)

    def _release_kv(self, req: Req) -> None:
        # SGLang's release_kv_cache when the transfer is done: unlocked, the rest freed.
        self.tree_cache.cache_finished_req(req)


class SglangDecode(DecodeRole, Scheduler):
    """A decode instance: SGLang's scheduler without a radix cache (as SGLang's decode side runs),
    pre-allocating by its DecodePreallocQueue's budget (pop_preallocated): a free request row, and

        max(prompt + RESERVED, prompt + min(max_new_tokens, 4096) - retractable) <= allocatable
        allocatable = free KV - max(RESERVED x (running + pre-allocated + waiting), need_single)

    where retractable is what the running requests hold (prompt + output tokens) and need_single
    the most any one of them still needs beyond that (prompt + min(max_new_tokens, 4096) -
    retractable): room for the request's decode and for each request's next RESERVED tokens, so
    that a decode does not run dry while pre-allocated requests, which cannot be retracted, wait."""

    def __init__(self, config: SchedulerConfig) -> None:
        Scheduler.__init__(self, replace(config, disable_radix_cache=True))
        self._init_decode_role()

    def _required(self, req: Req) -> int:
        ps = self.allocator.page_size
        return -(-req.input_len // ps) * ps + RESERVED_DECODE_TOKENS

    def _never_preallocated(self, req: Req) -> str | None:
        pool = self.allocator.size
        n, out = req.input_len, min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        if self._required(req) <= pool and n + out <= pool:
            return None
        return (
            f"never pre-allocated: its {n}-token prompt with {RESERVED_DECODE_TOKENS} reserved decode tokens, or with {out} "
            f"output tokens, does not fit the decode instance's KV pool of {pool} tokens (SGLang would hold it forever)"
        )

    def _try_preallocate(self, req: Req) -> bool:
        rows = self.req_to_token_pool
        if rows.available_size() <= 0:
            return False
        # The running requests that go on: SGLang's batch still lists those that finished in the step
        # before until its schedule drops them, right after this; SGLang polls again at once, where
        # an idle instance here would wait for the next event.
        running = [r for r in self.running_batch.reqs if r.finished_reason is None and not r.is_retracted]
        retractable = sum(r.input_len + len(r.output_ids) for r in running)
        need_single = max((min(r.max_new_tokens, CLIP_MAX_NEW_TOKENS) + r.input_len - retractable for r in running), default=0)
        active = len(running) + len(self.preallocated) + len(self.waiting_queue)
        allocatable = self.allocator.available_size() - max(RESERVED_DECODE_TOKENS * active, need_single)
        n = req.input_len
        if max(self._required(req), n + min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) - retractable) > allocatable:
            return False
        locs = self.allocator.alloc(n)
        if locs is None:
            return False
        req.req_pool_idx = rows.alloc()
        rows.write(req.req_pool_idx, 0, locs)
        req.seq_len = n
        return True

    def _join_running(self, req: Req) -> None:
        self.running_batch.reqs.append(req)

    def _free_preallocated(self, req: Req) -> None:
        self.allocator.free(self.req_to_token_pool.get(req.req_pool_idx, 0, req.seq_len))
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx, req.seq_len = None, 0
