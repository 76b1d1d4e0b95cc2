"""VllmScheduler: vLLM v1's scheduler (release 0.19.0) on this project's pools and radix cache.

There is no prefill phase and no decode phase: every request has tokens it knows
(prompt + outputs) and tokens whose KV is computed (Req.seq_len, vLLM's
num_computed_tokens); each step hands out one token budget (max_num_batched_tokens)
so that the computed tokens catch up. One step (vllm/v1/core/sched/scheduler.py,
Scheduler.schedule):

1. Running requests first, in admission order: each is scheduled for every token it
   has not computed (a decode: 1; a prefill: the rest of its prompt), capped by what
   is left of the budget. When its KV blocks cannot be allocated (free blocks plus
   evictable cached ones), the most recently admitted running request is preempted
   (priority policy: the lowest priority, latest arrival): its KV is freed, it goes
   back to the front of the waiting queue and is recomputed later from scratch (its
   cached full blocks may still hit). A request that would preempt itself waits.
2. Only if nothing was preempted: waiting requests in queue order, while budget is
   left and fewer than max_num_seqs run. Each reuses its longest cached prefix at
   block granularity (all tokens but the last at most), is admitted only if all its
   tokens fit the free KV (scheduler_reserve_full_isl), and is scheduled for
   min(uncomputed tokens, budget): a long prompt becomes a chunked prefill that the
   running pass continues next step.

KV memory is vLLM's own block pool (kv_blocks.py, block_pool.py): blocks come from the front
of one LRU queue of free blocks, a cached one among them is evicted then, a request frees its
blocks tail first, and full blocks are cached under a hash of their whole prefix, duplicates
included. Scheduled requests' full blocks enter the prefix cache in the step that allocates
them, as vLLM caches them: a request admitted later in the same step can hit them (running
requests' blocks after the running pass, so that a request preempted in that pass leaves
no block in the cache whose KV no forward computes: conformance/vllm_compare.py lists this).
A step mixes decodes and prefill chunks in one ForwardPlan (ForwardMode.MIXED).

Async scheduling is the loop's overlap mode (AsyncScheduler): a step is scheduled while
the previous one runs; a request whose in-flight token is its last is not scheduled
again, a request preempted while its token was in flight keeps that token, and each
output's processing caches the blocks its computed tokens fill, less the one in flight.

`python -m conformance.vllm_main` (make conformance) checks all of this step by step against
vLLM 0.19.0's own Scheduler and AsyncScheduler. Left out of vLLM 0.19: speculative decoding,
encoder inputs, LoRA, KV connectors, structured output, sliding windows (and with them the
null block), long_prefill_token_threshold and partial-prefill limits.
"""

from __future__ import annotations

from scheduler.core.future_indices import FutureIndices
from scheduler.core.ids import ids
from scheduler.core.invariants import InvariantError, end_of_run_errors
from scheduler.core.launched_batch import LaunchedBatch
from scheduler.core.req import Req
from scheduler.core.scheduler_base import SchedulerBase
from scheduler.memory.memory_pool import ReqToTokenPool
from scheduler.vllm.batch import VllmBatch
from scheduler.vllm.config import VllmSchedulerConfig
from scheduler.vllm.decode_stretches import VllmDecodeStretches
from scheduler.vllm.kv_blocks import VllmKVBlocks
from scheduler.vllm.queues import RunningQueue, WaitingQueue
from scheduler.vllm.step_rows import StepRows


class VllmScheduler(SchedulerBase):
    def __init__(self, config: VllmSchedulerConfig) -> None:
        self.config = config
        self.decode_stretches = VllmDecodeStretches(self)  # the simulator's fast-forward
        ps = self.page_size = config.page_size
        self.req_to_token_pool = ReqToTokenPool(config.max_num_seqs, journal=config.journal_row_writes)
        self.kv = VllmKVBlocks(self.req_to_token_pool, config.kv_tokens // ps, ps, config.enable_prefix_caching)
        self.waiting_queue = WaitingQueue(config.policy)
        self.running = RunningQueue()
        self.done: list[Req] = []  # finished and rejected requests, in finishing order
        self.num_requests = 0
        self.num_preemptions = 0
        self._carried_preemptions = 0  # preemptions of passes that launched nothing, for the next batch
        self._in_flight: LaunchedBatch | None = None  # the batch launched last, until its result is processed
        self.future = FutureIndices()

    @property
    def running_batch(self) -> RunningQueue:
        return self.running

    # -- admission ------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        self.num_requests += 1
        need = req.input_len + req.max_new_tokens
        kv_need = need - 1  # the last output token is never fed back
        if need > self.config.context_len:
            self._reject(
                req, f"input {req.input_len} + output {req.max_new_tokens} tokens exceed the context length {self.config.context_len}"
            )
        elif -(-kv_need // self.page_size) > self.kv.pool.num_blocks:
            pool_tokens = self.kv.pool.num_blocks * self.page_size
            self._reject(req, f"input {req.input_len} + output {req.max_new_tokens} tokens do not fit the KV pool of {pool_tokens} tokens")
        else:
            self.waiting_queue.add(req)

    def num_running(self) -> int:
        return len(self.running)

    def is_idle(self) -> bool:
        return not self.waiting_queue and not self.running

    def on_idle(self) -> None:
        pass  # vLLM keeps no estimate that an idle engine resets

    def finish(self, req: Req, now: float) -> None:
        """A request has its last token: its blocks are freed, its last block first (their cached
        ones stay in the cache, evictable), and its row."""
        self.kv.free(req)
        self.kv.forget(req)
        self._ended(req, now)

    def kv_used_tokens(self) -> int:
        return self.kv.used_tokens()

    def kv_cached_tokens(self) -> int:
        return self.kv.cached_free_tokens()

    def check_invariants(self) -> None:
        self.kv.flush_cache()
        errors = self.kv.pool.errors_when_idle() + end_of_run_errors(
            idle=self.is_idle(),
            waiting=self.waiting_queue,
            num_running=self.num_running(),
            req_to_token_pool=self.req_to_token_pool,
            done=self.done,
            num_requests=self.num_requests,
        )
        if errors:
            raise InvariantError("; ".join(errors))

    # -- one step -----------------------------------------------------------------
    def get_next_batch_to_run(self) -> VllmBatch | None:
        """One step's batch. A pass that only preempts schedules nothing (vLLM admits no
        waiting request in a step that preempted). vLLM's engine then schedules again, and so
        does this: at once, or, under async scheduling with a step in flight, after that step's
        output is processed (the engine waits for it when it has nothing new to launch), so this
        returns None then and the loop processes it first. Preemptions count toward the next
        batch that is launched."""
        num_preempted, self._carried_preemptions = self._carried_preemptions, 0
        while True:
            batch, preempted = self._schedule_once()
            num_preempted += preempted
            if batch is not None:
                batch.num_preempted = num_preempted
                return batch
            if not preempted or (self.config.overlap and self._in_flight is not None):
                self._carried_preemptions = num_preempted
                return None

    def _schedule_once(self) -> tuple[VllmBatch | None, int]:
        budget = self.config.max_num_batched_tokens
        rows = StepRows()
        num_preempted = 0
        running, kv = self.running, self.kv
        # (the loop runs once a running request a step: its calls bound once, min() spelled out)
        allocate_decode, add_decode = kv.allocate_decode, rows.add_decode
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            outs, token = req.output_ids, req.pending_token
            pending = token is not None
            if pending and len(outs) + 1 >= req.max_new_tokens:
                i += 1  # async: its token in flight is its last; no extra step
                continue
            before = req.seq_len
            known = req.input_len + len(outs) + pending
            num_new = known - before
            if num_new > budget:
                num_new = budget
            if num_new <= 0:
                i += 1
                continue
            if num_new == 1:
                loc = allocate_decode(req)
                if loc >= 0:
                    if before + 1 == known and before >= req.input_len:  # (most rows of a step)
                        add_decode(req, before, token if pending else outs[-1], loc)
                    else:
                        rows.add(req, before, 1, before + 1 == known, ids((loc,)))
                    budget -= 1
                    i += 1
                    continue
                locs = None
            else:
                locs = kv.allocate_slots(req, num_new, cache=False)
            while locs is None:
                victim = self._pick_victim()
                num_preempted += 1
                if victim is req:
                    self._preempt(req)
                    break
                done_before = rows.remove(victim)
                if done_before is not None:  # priority: it was scheduled earlier in this step
                    budget += done_before
                    i -= 1
                self._preempt(victim)
                locs = kv.allocate_slots(req, num_new, cache=False)
            if locs is None:
                break
            rows.add(req, before, num_new, before + num_new == known, locs)
            budget -= num_new
            i += 1
        # Their new full blocks enter the cache only now: a request preempted later in this
        # pass (priority) must not leave blocks in the cache whose KV no forward computes.
        kv.cache_known_blocks_of(rows.reqs)

        hits = 0
        if not num_preempted:
            hits = self._schedule_waiting(rows, budget)
        self.num_preemptions += num_preempted
        if not rows:
            return None, num_preempted
        plan = rows.plan(self.req_to_token_pool.take_journal())
        return VllmBatch(rows.reqs, plan, num_preempted, hits), num_preempted

    def _pick_victim(self) -> Req:
        """The request to preempt: the last admitted (FCFS), or the lowest priority, latest arrival."""
        running = self.running
        if self.config.policy == "priority":
            victim = max(running, key=lambda r: (r.priority, r.arrival_time, r.index))
            running.remove(victim)
            return victim
        return running.pop()

    def _schedule_waiting(self, rows: StepRows, budget: int) -> int:
        """Admit waiting requests into this step; return the prefix tokens they reuse."""
        waiting, running, kv, ps = self.waiting_queue, self.running, self.kv, self.page_size
        hits = 0
        while waiting and budget > 0 and len(running) < self.config.max_num_seqs:
            req = waiting.peek()
            if req.pending_token is not None:
                # Preempted while its token was in flight, and the loop asks again before that
                # result is processed (the first ask scheduled nothing): it waits for it.
                break
            known = req.input_len + len(req.output_ids)
            hit = kv.get_computed_blocks(req)
            computed = len(hit) * ps
            if self.config.reserve_full_prompt and not kv.can_fit_full_sequence(req, hit):
                break
            num_new = min(known - computed, budget)
            locs = kv.allocate_slots(req, num_new, hit)
            if locs is None:
                break
            waiting.pop()
            running.append(req)
            req.cached_tokens += computed
            req.prefill_tokens += known
            hits += computed
            rows.add(req, computed, num_new, computed + num_new == known, locs)
            budget -= num_new
        return hits

    # -- KV ---------------------------------------------------------------------------
    def _preempt(self, req: Req) -> None:
        """vLLM's preemption by recompute: free the KV, back to the front of the waiting queue."""
        self.kv.free(req)
        req.num_retractions += 1
        self.waiting_queue.prepend(req)

    # -- launch and results -------------------------------------------------------------
    def launch(self, batch: VllmBatch, now: float, overlap: bool) -> LaunchedBatch:
        plan, reqs = batch.plan, batch.reqs
        if overlap:
            self.future.assign(plan, reqs)
        for r in reqs:
            if r.scheduled_time is None:
                r.scheduled_time = now
        # num_extend_reqs is SGLang's row split of a mixed batch; this scheduler's results
        # tell prefill from decode rows by the request's own progress, not by position.
        launched = LaunchedBatch(reqs, plan, None, batch.num_preempted, batch.cache_hit_tokens, num_extend_reqs=0)
        self._in_flight = launched
        return launched

    def process_batch_result(self, launched: LaunchedBatch, next_token_ids: list[int], now: float) -> None:
        if launched is self._in_flight:
            self._in_flight = None
        plan = launched.plan
        future = plan.future_indices
        # AsyncScheduler: each output caches its request's blocks (nothing to do without caching).
        cache = self.config.overlap and self.kv.enable_caching
        finished_any = False
        for i, req in enumerate(launched.reqs):
            if not plan.sample[i]:
                continue  # a prefill chunk short of the prompt's end samples nothing
            if req.finished_reason is not None:
                continue  # async: it stopped (EOS) one step earlier; this token is the extra one, its slot already freed (finish)
            if future is not None and req.pending_token == -future[i]:
                req.pending_token = None
            req.take_token(next_token_ids[i], now)
            if cache and req.req_pool_idx is not None:
                # The blocks its computed tokens fill, less the one in flight.
                self.kv.cache_blocks(req, req.seq_len - (req.pending_token is not None))
            if req.finished_reason is None:
                continue
            if req.req_pool_idx is None:
                self.waiting_queue.remove(req)  # preempted while its last token was in flight
            self.finish(req, now)
            finished_any = True
        if finished_any:
            self.running[:] = [r for r in self.running if not r.finished()]
