"""Our VllmScheduler (scheduler/vllm/) on the same logical clock as the vLLM oracle: its own
event loop driven by scheduler.loop.step_clock (a launched forward advances the clock by one, an
idle wait moves it to the next arrival), forwards "sampling" the scenario's tokens, and at each
launch the same per-step record the oracle makes (conformance.vllm_scenario.VllmStep).

The scheduler is only observed: get_next_batch_to_run and _preempt are wrapped on the
instance to see the batch (its cache hits) and the preemption order."""

from __future__ import annotations

from conformance.ours import make_req
from conformance.scenario import sampled_token
from conformance.vllm_scenario import VllmRun, VllmScenario, VllmStep
from scheduler.core.forward_plan import ForwardPlan
from scheduler.core.req import FinishReason
from scheduler.loop.event_loop import DeadlockError, EventLoop, ForwardResult
from scheduler.loop.step_clock import StepClockDriver
from scheduler.vllm.config import VllmSchedulerConfig
from scheduler.vllm.scheduler import VllmScheduler


def config_for(sc: VllmScenario) -> VllmSchedulerConfig:
    return VllmSchedulerConfig(
        kv_tokens=sc.kv_tokens,
        context_len=sc.context_len,
        page_size=sc.block_size,
        max_num_batched_tokens=sc.max_num_batched_tokens,
        max_num_seqs=sc.max_num_seqs,
        policy=sc.policy,
        enable_prefix_caching=sc.enable_prefix_caching,
        overlap=sc.async_scheduling,
    )


class _Driver(StepClockDriver):
    """The step clock, recording a VllmStep at each launch."""

    def __init__(self, sched: VllmScheduler, token_fn) -> None:
        super().__init__(sched, token_fn)
        self.records: list[VllmStep] = []
        self.batch = None
        self.preempted: list[str] = []
        self._done_seen = 0
        get_next, preempt = sched.get_next_batch_to_run, sched._preempt

        def get_next_batch_to_run():
            self.batch = get_next()
            return self.batch

        def logged_preempt(req):
            self.preempted.append(req.rid)
            preempt(req)

        sched.get_next_batch_to_run = get_next_batch_to_run
        sched._preempt = logged_preempt
        self.kv_error: str | None = None  # the first block freed while free
        pool = sched.kv.pool
        pool_free = pool.free_blocks

        def checked_free(ordered):
            twice = ordered[pool._ref[ordered] <= 0]
            if self.kv_error is None and len(twice):
                self.kv_error = f"kv accounting: block {int(twice.min())} freed while free, before step {len(self.records)}"
            pool_free(ordered)

        pool.free_blocks = checked_free

    def _finished_since(self) -> list[str]:
        done = self.scheduler.done
        new = [r.rid for r in done[self._done_seen :] if r.finished_reason != FinishReason.REJECTED]
        self._done_seen = len(done)
        return sorted(new)

    def _launch(self, plan: ForwardPlan) -> ForwardResult:
        sched, batch = self.scheduler, self.batch
        assert batch is not None and batch.plan is plan
        self.records.append(
            VllmStep(
                reqs=[(r.rid, n) for r, n in zip(batch.reqs, plan.extend_lens)],
                preempted=list(self.preempted),
                finished=self._finished_since(),
                free_blocks=sched.kv.pool.num_free_blocks(),
                cache_hit_tokens=batch.cache_hit_tokens,
                num_running=len(sched.running),
                num_waiting=len(sched.waiting_queue),
                evicted=sched.kv.pool.num_evicted,
            )
        )
        self.preempted.clear()
        self.steps.append(None)  # the base class counts steps for max_steps
        tokens = [self.token_fn(r, s - r.input_len) for r, s in zip(batch.reqs, plan.seq_lens)]
        return ForwardResult(tokens, self.now, self.now + 1)


def run_ours(sc: VllmScenario, max_steps: int = 20_000) -> VllmRun:
    sched = VllmScheduler(config_for(sc))
    order = sc.arrival_order()
    reqs = [make_req(sc.requests[i], pos) for pos, i in enumerate(order)]
    by_rid = {r.rid: r for r in sc.requests}
    driver = _Driver(sched, lambda req, k: sampled_token(by_rid[req.rid], k))
    loop = EventLoop(sched, iter(reqs), driver.clock, sc.async_scheduling)
    error = None
    try:
        driver.run(loop, max_steps)
    except DeadlockError as e:
        error = f"stuck: {e}"
    if error is None:
        error = driver.kv_error or kv_accounting_error(sched)
    rejected = [r.rid for r in loop.received if r.finished_reason == FinishReason.REJECTED]
    outputs = {r.rid: len(r.output_ids) for r in loop.received if r.finished_reason != FinishReason.REJECTED}
    return VllmRun(driver.records, rejected, outputs, error)


def kv_accounting_error(sched: VllmScheduler) -> str | None:
    """At the end of a run every block is free, once, and the cache agrees with the blocks."""
    try:
        sched.check_invariants()
    except AssertionError as e:
        return f"kv accounting: {e}"
    return None
