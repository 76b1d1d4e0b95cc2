"""Scheduler: the waiting queue, the running batch, and one step's decisions.

get_next_batch_to_run() is SGLang's prefill-first selection (SGLang 0.5.23's
scheduler.py): merge the last prefill into the running batch, drop finished requests,
try a new prefill batch (with mixed chunk, the running decodes ride along in it), else
decode (retracting requests when the KV pool runs out). process_batch_result() applies
a forward's sampled tokens. The event loop (loop.py) calls both; it never decides anything.
"""

from __future__ import annotations

from scheduler.core.forward_plan import ForwardMode
from scheduler.core.future_indices import FUTURE_MAP_SIZE, FutureIndices
from scheduler.core.invariants import InvariantError, check_end_of_run
from scheduler.core.launched_batch import LaunchedBatch
from scheduler.core.req import Req
from scheduler.core.scheduler_base import SchedulerBase
from scheduler.memory.chunk_cache import ChunkCache
from scheduler.memory.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from scheduler.memory.radix_cache import RadixCache
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.decode_stretches import SglangDecodeStretches
from scheduler.sglang.policy import SchedulePolicy
from scheduler.sglang.prefill_adder import CLIP_MAX_NEW_TOKENS, IGNORE_EOS_RESERVE_TOKENS, AddReqResult, PrefillAdder
from scheduler.sglang.schedule_batch import ScheduleBatch
from scheduler.sglang.token_ratio import NewTokenRatioDecay

__all__ = ["FUTURE_MAP_SIZE", "InvariantError", "LaunchedBatch", "Scheduler"]
# SGLang reserves a few tokens of the longest request for the output (max_req_input_len).
INPUT_LEN_MARGIN = 5


class Scheduler(SchedulerBase):
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.decode_stretches = SglangDecodeStretches(self)  # the simulator's fast-forward
        page_size = config.page_size
        self.max_running_requests = config.effective_max_running_requests
        # SGLang's request slots: one more than can run.
        self.req_to_token_pool = ReqToTokenPool(self.max_running_requests + 1, journal=config.journal_row_writes)
        self.allocator = TokenToKVPoolAllocator(config.kv_tokens, page_size)
        cache_cls = ChunkCache if config.disable_radix_cache else RadixCache
        self.tree_cache = cache_cls(self.req_to_token_pool, self.allocator, page_size)
        self.policy = SchedulePolicy(
            config.policy, self.tree_cache, seed=config.seed, enable_priority_scheduling=config.enable_priority_scheduling
        )
        self.enable_priority_preemption = self.policy.enable_priority_scheduling
        self.is_mixed_chunk = config.enable_mixed_chunk and config.effective_chunked_prefill_size is not None
        self.waiting_queue: list[Req] = []
        self.running_batch = self._new_batch([])
        self.last_batch: ScheduleBatch | None = None
        self.chunked_req: Req | None = None
        # Overlap: the launched batch whose result is not processed yet (SGLang's result_queue).
        self.inflight: list[LaunchedBatch] = []
        self.new_token_ratio = config.init_new_token_ratio
        self.ratio_decay = NewTokenRatioDecay(config.new_token_ratio_decay, config.min_new_token_ratio)
        self.done: list[Req] = []  # finished and rejected requests, in finishing order
        self.num_requests = 0
        self.num_retractions = 0
        self.future = FutureIndices()
        self._queue_ct = 0
        # SGLang's request length limits (tp_worker.get_worker_info).
        self.max_req_len = min(config.context_len - 1, self.allocator.size - 1)
        self.max_req_input_len = self.max_req_len - INPUT_LEN_MARGIN

    def _new_batch(self, reqs: list[Req]) -> ScheduleBatch:
        return ScheduleBatch(reqs, self.req_to_token_pool, self.allocator, self.tree_cache)

    # -- admission ------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        """SGLang's checks at arrival (check_arrival), then a request its admission would refuse
        even on an empty pool is rejected; the rest wait."""
        if not self.check_arrival(req):
            return
        never = self._never_admitted(req)
        if never is not None:
            self._reject(req, never)
            return
        self._enqueue(req)

    def check_arrival(self, req: Req) -> bool:
        """SGLang's checks at arrival: a prompt that leaves no room is refused; an output
        longer than the context or the KV pool allows is cut to fit (recorded on the request).
        False: rejected (it is done)."""
        self.num_requests += 1
        n = req.input_len
        if n >= self.max_req_input_len:
            limit = "context length" if self.config.context_len - 1 <= self.allocator.size - 1 else "KV pool"
            # The request's own length first, so that a summary can count the reason without it.
            self._reject(
                req,
                f"input {n} tokens leave no room for output: prompts must be under {self.max_req_input_len} "
                f"tokens ({limit} {self.max_req_len + 1} less {INPUT_LEN_MARGIN + 1})",
            )
            return False
        ps = self.allocator.page_size
        by_context = self.max_req_len - n - 1
        by_pool = self.allocator.size - (-(-n // ps) * ps) - ps - 1
        fits = max(0, min(by_context, by_pool))
        if req.max_new_tokens > fits:
            by_ctx = self.config.context_len < self.allocator.size and by_context < by_pool
            limit = f"the context length {self.config.context_len}" if by_ctx else f"the KV pool of {self.allocator.size} tokens"
            req.truncate_reason = f"output truncated from {req.max_new_tokens} to {fits} tokens to fit {limit}"
            req.truncated_from = req.max_new_tokens
            req.max_new_tokens = fits
        return True

    def _never_admitted(self, req: Req) -> str | None:
        """Why PrefillAdder refuses req even on an empty pool, or None. SGLang queues such a request
        and waits for it forever (and, first come first served, for every request behind it); here it
        is rejected at arrival with the reason. On an empty pool the whole pool is free (a cached
        prefix counts against the pool as much as it shortens the prefill), so this is the adder's own
        test with nothing running: add_one_req's `extend + reserved output + a page < free`, or without
        a radix cache, for a request that ignores EOS, add_one_req_ignore_eos's check that its decode
        never runs the pool dry."""
        ps, pool, n = self.allocator.page_size, self.allocator.size, req.input_len
        out = min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        if req.sampling_params.ignore_eos and self.tree_cache.disabled:
            paged = -(-n // ps) * ps + ps
            if paged <= pool and not (req.max_new_tokens > 0 and pool - paged - req.max_new_tokens <= IGNORE_EOS_RESERVE_TOKENS):
                return None
            need = f"its prompt's {paged} slots (paged, and a page) and its {req.max_new_tokens} output tokens"
        elif n + out + ps < pool:
            return None
        else:
            need = f"its {n}-token prompt, {out} output tokens and a page of {ps}"
        return (
            f"never admitted: {need} do not fit the KV pool of {pool} tokens with the slack SGLang's admission keeps "
            f"(SGLang would wait for it forever); a larger --kv-tokens or a smaller --page-size admits it"
        )

    def _enqueue(self, req: Req) -> None:
        """Append to the waiting queue (new, retracted or preempted: all go to the back)."""
        self._queue_ct += 1
        req.queue_entry = self._queue_ct
        self.waiting_queue.append(req)

    def num_running(self) -> int:
        return self.running_batch.batch_size()

    def is_idle(self) -> bool:
        """No unfinished request waits, runs, or sits in the last prefill batch (merged at the next schedule)."""
        last = self.last_batch
        unmerged = last is not None and last.forward_mode is not ForwardMode.DECODE and any(not r.finished() for r in last.reqs)
        running = any(not r.finished() for r in self.running_batch.reqs)
        return not self.waiting_queue and not running and self.chunked_req is None and not unmerged

    def is_fully_idle(self) -> bool:
        """SGLang's is_fully_idle: nothing waits, runs, or is in flight, and the last batch is gone."""
        last = self.last_batch
        return (
            self.running_batch.is_empty()
            and self.chunked_req is None
            and (last is None or last.is_empty())
            and not self.inflight
            and not self.waiting_queue
        )

    def finish(self, req: Req, now: float) -> None:
        """A request has its last token: its KV goes to the cache (or is freed), its row too."""
        if req.req_pool_idx is not None:
            self.tree_cache.cache_finished_req(req)
        self._ended(req, now)

    def kv_used_tokens(self) -> int:
        """Slots held by requests or locked in the cache (not counting evictable cache)."""
        return self.allocator.size - self.allocator.available_size() - self.tree_cache.evictable_size()

    def kv_cached_tokens(self) -> int:
        """Slots in the radix cache that no request locks: what eviction can take."""
        return self.tree_cache.evictable_size()

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

    # -- batch selection --------------------------------------------------------
    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        self.merge_last_prefill()
        batch = self.get_new_batch_prefill()
        if batch is None and not self.running_batch.is_empty():
            batch = self.update_running_batch()
        self.last_batch = batch
        return batch

    def merge_last_prefill(self) -> None:
        """A step's schedule begins here: the prefill scheduled last joins the running batch
        (but a request still being chunked, which is cached so far and continues), and
        finished requests leave it."""
        exclude: list[Req] = []
        chunked = self.chunked_req
        if chunked is not None:
            # Cache what the chunked request has prefilled so far; it continues from there.
            exclude.append(chunked)
            if len(chunked.fill_ids) > len(chunked.prefix_indices):
                self.tree_cache.cache_unfinished_req(chunked)
        running = self.running_batch
        last = self.last_batch
        if last is not None and last.forward_mode.is_extend():
            if last.chunked_req is not None:
                exclude.append(last.chunked_req)
            last_bs = last.batch_size()
            last.filter_batch(exclude=tuple(exclude))
            if last.batch_size() < last_bs:
                running.batch_is_full = False
            if not last.is_empty():
                if running.is_empty():
                    running = self.running_batch = self._new_batch(last.reqs)
                else:
                    running.merge_batch(last)
        # Every step, not only after a merge: in overlap mode a prefill's requests are merged
        # before its result finishes them, and the decode branch may not run.
        running_bs = running.batch_size()
        running.filter_batch()
        if running.batch_size() < running_bs:
            running.batch_is_full = False

    def get_num_allocatable_reqs(self, running_bs: int, num_held_rows: int = 0) -> int:
        return min(self.max_running_requests - running_bs, self.req_to_token_pool.available_size() + num_held_rows)

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        running = self.running_batch
        if self.enable_priority_preemption:
            running.batch_is_full = False  # let preemption try
        if running.is_empty():
            # Only a leaving request clears the flag otherwise: an empty batch would stay full.
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting_queue) and self.chunked_req is None:
            return None
        running_bs = running.batch_size()
        if self.get_num_allocatable_reqs(running_bs) <= 0 and self.chunked_req is None and not self.enable_priority_preemption:
            running.batch_is_full = True
            return None

        self.policy.calc_priority(self.waiting_queue)
        adder = PrefillAdder(
            self.tree_cache,
            self.allocator,
            running,
            self.new_token_ratio,
            self.config.max_prefill_tokens,
            self.config.effective_chunked_prefill_size,
            self.config.page_size,
            num_mixed_decode_tokens=running_bs if self.is_mixed_chunk else 0,
            priority_preemption_threshold=self.config.priority_scheduling_preemption_threshold,
        )
        continued = self.chunked_req
        if continued is not None:
            continued.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(continued)

        for req in self.waiting_queue:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            held = sum(1 for r in adder.can_run_list if r.req_pool_idx is not None)
            if len(adder.can_run_list) >= self.get_num_allocatable_reqs(running.batch_size(), held):
                running.batch_is_full = True
            if running.batch_is_full:
                if not self.enable_priority_preemption or not adder.preempt_to_schedule(req, running.release_for_retract):
                    break
            req.init_next_round_input(self.tree_cache)
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None)
            if res != AddReqResult.CONTINUE:
                if res == AddReqResult.NO_TOKEN:
                    running.batch_is_full = bool(adder.can_run_list) or not running.is_empty()
                break

        can_run = adder.can_run_list
        if not can_run:
            for r in adder.preempt_list:
                self._requeue_retracted(r)
            return None
        # The admitted requests are a prefix of the (sorted) queue: admission stops at the
        # first refusal. The continued chunk is not in the queue.
        del self.waiting_queue[: len(can_run) - (1 if continued is not None else 0)]
        for r in adder.preempt_list:
            self._requeue_retracted(r)
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.is_chunked += 1

        batch = self._new_batch(can_run)
        batch.chunked_req = self.chunked_req
        batch.cache_hit_tokens = adder.log_hit_tokens
        batch.num_retracted = len(adder.preempt_list)
        for r in can_run:
            if r.is_retracted or r.req_pool_idx is None:  # a new admission, not a continued chunk
                r.is_retracted = False
                r.cached_tokens += len(r.prefix_indices)
                r.prefill_tokens += r.input_len + len(r.output_ids)
        batch.prepare_for_extend()

        if self.is_mixed_chunk and not running.is_empty():
            # Mixed chunk: the running requests decode in this batch (unless one is about to
            # finish in flight, or the prefill left their decode no room: then they wait).
            finishing = self.reqs_finishing_inflight(running.reqs)
            running.filter_batch(exclude=tuple(finishing))
            if finishing:
                running.batch_is_full = False
            if not running.is_empty() and running.check_decode_mem():
                running.prepare_for_decode()
                batch.mix_with_running(running)
                full = running.batch_is_full
                self.running_batch = self._new_batch([])
                self.running_batch.batch_is_full = full
        return batch

    def _requeue_retracted(self, req: Req) -> None:
        self.num_retractions += 1
        self._enqueue(req)

    def reqs_finishing_inflight(self, reqs: list[Req]) -> list[Req]:
        """Overlap: those of reqs whose in-flight result reaches their length. They get no
        further decode step (SGLang's skip-finishing-decode)."""
        if not self.config.overlap or not self.inflight:
            return []
        # Req.next_output_finishes_by_length, inlined: this runs over the batch every step.
        near_end = [r for r in reqs if len(r.output_ids) + 1 >= r.max_new_tokens]
        if not near_end:
            return near_end
        queued = set(map(id, self.inflight[0].reqs))
        return [r for r in near_end if id(r) in queued]

    def drop_finishing_inflight(self, batch: ScheduleBatch) -> bool:
        """A decode step's first change to the batch: the requests whose in-flight result
        finishes them leave it (merge_last_prefill has just dropped finished and retracted
        ones), and it is then no longer full. Whether any left."""
        finishing = self.reqs_finishing_inflight(batch.reqs)
        if finishing:
            batch.filter_batch(exclude=tuple(finishing))
            batch.batch_is_full = False
        return bool(finishing)

    def update_running_batch(self) -> ScheduleBatch | None:
        """Prepare the running batch's next decode step; None skips decoding this step."""
        batch = self.running_batch
        initial_bs = batch.batch_size()
        finishing = self.drop_finishing_inflight(batch)
        if batch.is_empty():
            batch.batch_is_full = False
            return None
        batch.num_retracted = 0
        if not batch.check_decode_mem():
            if finishing:
                # Their in-flight result frees KV at the end of this step: decode the rest next step.
                batch.batch_is_full = False
                return None
            retracted, ratio = batch.retract_decode()
            self.new_token_ratio = ratio
            for r in retracted:
                self._requeue_retracted(r)
        else:
            self.new_token_ratio = self.ratio_decay.step(self.new_token_ratio)
        if batch.batch_size() < initial_bs:
            batch.batch_is_full = False
        if batch.is_empty():
            return None
        batch.prepare_for_decode()
        return batch

    def on_idle(self) -> None:
        """Nothing to run: once fully idle the decode estimate starts over, as SGLang does."""
        if self.is_fully_idle():
            self.new_token_ratio = self.config.init_new_token_ratio

    # -- launch and results -------------------------------------------------------
    def launch(self, batch: ScheduleBatch, now: float, overlap: bool) -> LaunchedBatch:
        """Freeze the batch for its forward; in overlap mode name its outputs by future indices."""
        plan = batch.plan
        assert plan is not None
        reqs = list(batch.reqs)
        if overlap:
            self.future.assign(plan, reqs)
        if plan.mode is not ForwardMode.DECODE:
            for r in reqs:
                if r.scheduled_time is None:
                    r.scheduled_time = now
        launched = LaunchedBatch(reqs, plan, batch.chunked_req, batch.num_retracted, batch.cache_hit_tokens, batch.num_extend_reqs)
        if overlap:
            self.inflight.append(launched)
        return launched

    def process_batch_result(self, launched: LaunchedBatch, next_token_ids: list[int], now: float) -> None:
        if self.inflight and self.inflight[0] is launched:
            self.inflight.pop(0)
        plan = launched.plan
        is_decode = plan.mode is ForwardMode.DECODE
        num_extend = 0 if is_decode else launched.num_extend_reqs
        future = plan.future_indices
        for i, req in enumerate(launched.reqs):
            if req.is_retracted:
                continue  # retracted while this forward ran: its token is dropped
            if i < num_extend and not plan.sample[i]:
                req.is_chunked -= 1  # a non-final chunk samples nothing
                continue
            if req.finished_reason is not None:
                continue  # overlap: it stopped (EOS) one step earlier; this token is the extra one
            if future is not None and req.pending_token == -future[i]:
                req.pending_token = None
            req.take_token(next_token_ids[i], now)
            if req.finished_reason is not None:
                self.finish(req, now)
            elif i < num_extend:
                self.tree_cache.cache_unfinished_req(req)
