"""Scheduler: the waiting queue, the running batch, and one step's decisions.

get_next_batch_to_run() is SGLang's prefill-first selection: merge the last
prefill into the running batch, try a new prefill batch, else decode (retracting
requests when the KV pool runs out). process_batch_result() applies a forward's
sampled tokens. The event loop (loop.py) calls both; it never decides anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.chunk_cache import ChunkCache
from scheduler.config import SchedulerConfig
from scheduler.forward_plan import ForwardMode, ForwardPlan
from scheduler.future_indices import FUTURE_MAP_SIZE, FutureIndices
from scheduler.invariants import InvariantError, check_end_of_run
from scheduler.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from scheduler.policy import SchedulePolicy
from scheduler.prefill_adder import AddReqResult, PrefillAdder
from scheduler.radix_cache import RadixCache
from scheduler.req import FinishReason, Req
from scheduler.schedule_batch import ScheduleBatch

__all__ = ["FUTURE_MAP_SIZE", "InvariantError", "LaunchedBatch", "Scheduler"]


@dataclass(eq=False, slots=True)
class LaunchedBatch:
    """A batch as it was when launched: the running batch changes before its result is processed."""

    reqs: list[Req]
    plan: ForwardPlan
    chunked_req: Req | None
    num_retracted: int
    cache_hit_tokens: int


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        page_size = config.page_size
        self.max_running_requests = config.effective_max_running_requests
        # One slot more than can run, for the request being chunked.
        self.req_to_token_pool = ReqToTokenPool(self.max_running_requests + 2, journal=config.journal_row_writes)
        self.allocator = TokenToKVPoolAllocator(config.kv_tokens, page_size)
        cache_cls = ChunkCache if config.disable_radix_cache else RadixCache
        self.tree_cache = cache_cls(self.req_to_token_pool, self.allocator, page_size)
        self.policy = SchedulePolicy(config.policy, self.tree_cache, seed=config.seed)
        self.waiting_queue: list[Req] = []
        self.running_batch = self._new_batch([])
        self.last_batch: ScheduleBatch | None = None
        self.chunked_req: Req | None = None
        self.new_token_ratio = config.init_new_token_ratio
        self.done: list[Req] = []  # finished and rejected requests, in finishing order
        self.num_requests = 0
        self.num_retractions = 0
        self._future = FutureIndices()

    def _new_batch(self, reqs: list[Req]) -> ScheduleBatch:
        return ScheduleBatch(reqs, self.req_to_token_pool, self.allocator, self.tree_cache)

    # -- admission ------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        self.num_requests += 1
        need = req.input_len + req.max_new_tokens
        if need > self.config.context_len:
            self._reject(req, f"input {req.input_len} + output {req.max_new_tokens} tokens exceed the context length {self.config.context_len}")
        elif need >= self.allocator.size:  # PrefillAdder admits only what leaves a free slot
            self._reject(req, f"input {req.input_len} + output {req.max_new_tokens} tokens do not fit the KV pool of {self.allocator.size} tokens (a request must leave one slot free)")
        else:
            self.waiting_queue.append(req)

    def _reject(self, req: Req, reason: str) -> None:
        req.finished_reason = FinishReason.REJECTED
        req.reject_reason = reason
        req.finish_time = req.arrival_time
        self.done.append(req)

    def is_idle(self) -> bool:
        """No unfinished request waits, runs, or sits in the last prefill batch (merged at the next schedule)."""
        last = self.last_batch
        unmerged = last is not None and last.forward_mode is not ForwardMode.DECODE and any(not r.finished() for r in last.reqs)
        running = any(not r.finished() for r in self.running_batch.reqs)
        return not self.waiting_queue and not running and self.chunked_req is None and not unmerged

    def kv_used_tokens(self) -> int:
        """Slots held by requests or locked in the cache (not counting evictable cache)."""
        return self.allocator.size - self.allocator.available_size() - self.tree_cache.evictable_size()

    # -- batch selection --------------------------------------------------------
    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        chunked_to_exclude: Req | None = None
        if self.chunked_req is not None:
            # Cache what the chunked request has prefilled so far; it continues from there.
            chunked_to_exclude = self.chunked_req
            self.tree_cache.cache_unfinished_req(self.chunked_req)
        last = self.last_batch
        if last is not None and last.forward_mode is not ForwardMode.DECODE:
            last_bs = last.batch_size()
            last.filter_batch(exclude=(last.chunked_req, chunked_to_exclude))
            if last.batch_size() < last_bs:
                self.running_batch.batch_is_full = False
            if not last.is_empty():
                if self.running_batch.is_empty():
                    self.running_batch = self._new_batch(last.reqs)
                else:
                    self.running_batch.merge_batch(last)

        batch = self.get_new_batch_prefill()
        if batch is None and not self.running_batch.is_empty():
            self.update_running_batch()
            batch = None if self.running_batch.is_empty() else self.running_batch
        self.last_batch = batch
        return batch

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        if (self.running_batch.batch_is_full or not self.waiting_queue) and self.chunked_req is None:
            return None
        running_bs = self.running_batch.batch_size()
        if running_bs >= self.max_running_requests:
            self.running_batch.batch_is_full = True
            return None

        self.policy.calc_priority(self.waiting_queue)
        adder = PrefillAdder(
            self.tree_cache,
            self.allocator,
            self.running_batch.reqs,
            self.new_token_ratio,
            self.config.max_prefill_tokens,
            self.config.effective_chunked_prefill_size,
            self.config.page_size,
        )
        continued = self.chunked_req
        if continued is not None:
            continued.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(continued)

        for req in self.waiting_queue:
            if running_bs + len(adder.can_run_list) >= self.max_running_requests:
                self.running_batch.batch_is_full = True
                break
            req.init_next_round_input(self.tree_cache)
            res = adder.add_one_req(req)
            if res != AddReqResult.CONTINUE:
                if res == AddReqResult.NO_TOKEN:
                    self.running_batch.batch_is_full = True
                break

        can_run = adder.can_run_list
        if not can_run:
            return None
        # Admitted requests are a prefix of the (sorted) queue; the continued chunk is not in it.
        num_from_queue = len(can_run) - (1 if continued is not None else 0)
        del self.waiting_queue[:num_from_queue]
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.is_chunked += 1

        batch = self._new_batch(can_run)
        batch.chunked_req = self.chunked_req
        batch.cache_hit_tokens = adder.log_hit_tokens
        for r in can_run:
            if r.is_retracted or r.req_pool_idx is None:  # a new admission, not a continued chunk
                r.is_retracted = False
                r.cached_tokens += len(r.prefix_indices)
                r.prefill_tokens += r.input_len + len(r.output_ids)
        batch.prepare_for_extend()
        return batch

    def update_running_batch(self) -> None:
        batch = self.running_batch
        initial_bs = batch.batch_size()
        batch.filter_batch()
        if batch.is_empty():
            batch.batch_is_full = False
            return
        batch.num_retracted = 0
        if not batch.check_decode_mem():
            retracted, ratio = batch.retract_decode()
            self.new_token_ratio = ratio
            self.num_retractions += len(retracted)
            self.waiting_queue.extend(retracted)
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.config.new_token_ratio_decay, self.config.min_new_token_ratio)
        if batch.batch_size() < initial_bs:
            batch.batch_is_full = False
        batch.prepare_for_decode()

    def on_idle(self) -> None:
        """Nothing to run: the decode estimate starts over, as SGLang does when idle."""
        self.new_token_ratio = self.config.init_new_token_ratio

    # -- launch and results -------------------------------------------------------
    def launch(self, batch: ScheduleBatch, now: float, overlap: bool) -> LaunchedBatch:
        """Freeze the batch for its forward; in overlap mode name its outputs by future indices."""
        plan = batch.plan
        assert plan is not None
        reqs = list(batch.reqs)
        if overlap:
            self._future.assign(plan, reqs)
        if plan.mode is not ForwardMode.DECODE:
            for r in reqs:
                if r.scheduled_time is None:
                    r.scheduled_time = now
        return LaunchedBatch(reqs, plan, batch.chunked_req, batch.num_retracted, batch.cache_hit_tokens)

    def process_batch_result(self, launched: LaunchedBatch, next_token_ids: list[int], now: float) -> None:
        plan = launched.plan
        is_decode = plan.mode is ForwardMode.DECODE
        future = plan.future_indices
        ps = self.config.page_size
        for i, req in enumerate(launched.reqs):
            if req.is_retracted:
                continue  # retracted while this forward ran: its token is dropped
            if not is_decode and not plan.sample[i]:
                req.is_chunked -= 1  # a non-final chunk samples nothing
                continue
            if req.finished_reason is not None:
                # Overlap: the request finished one step earlier, this token is the extra one.
                if is_decode and (ps == 1 or (req.input_len + len(req.output_ids) - 1) % ps == 0):
                    self.allocator.free(plan.out_cache_loc[i : i + 1])
                continue
            if future is not None and req.pending_token == -future[i]:
                req.pending_token = None
            out = req.output_ids
            out.append(next_token_ids[i])
            req.token_times.append(now)
            if req.first_token_time is None:
                req.first_token_time = now
            if len(out) >= req.max_new_tokens or not req.sampling_params.ignore_eos:
                req.check_finished()
            if req.finished_reason is not None:
                req.finish_time = now
                self.tree_cache.cache_finished_req(req)
                req.req_pool_idx = None
                req.pending_token = None
                req.release_tokens()
                self.done.append(req)
            elif not is_decode:
                self.tree_cache.cache_unfinished_req(req)

    # -- checks -------------------------------------------------------------------
    def check_invariants(self) -> None:
        """At the end of a run: every KV slot free or held by the cache, every request done right."""
        check_end_of_run(
            idle=self.is_idle(),
            waiting=self.waiting_queue,
            num_running=self.running_batch.batch_size(),
            allocator=self.allocator,
            cache=self.tree_cache,
            req_to_token_pool=self.req_to_token_pool,
            done=self.done,
            num_requests=self.num_requests,
        )
