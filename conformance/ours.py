"""Our scheduler (scheduler/) on the same logical clock: its own event loop, driven here.

The loop (scheduler/loop.py) runs unchanged; this driver answers its waits as the
simulator does, with a clock that a launched forward advances by one and an idle wait
moves to the next arrival, and forwards that "sample" the scenario's tokens. At each
launch it records the decision the comparison needs.
"""

from __future__ import annotations

from typing import Any

from conformance.decision import RunResult, StepDecision
from conformance.scenario import EOS_TOKEN_ID, Scenario, ScenarioRequest, sampled_token
from scheduler.config import SchedulerConfig
from scheduler.forward_plan import ForwardPlan
from scheduler.loop import AwaitResult, CpuWork, DeadlockError, EventLoop, ForwardResult, Launch, WaitForArrival
from scheduler.req import FinishReason, Req
from scheduler.sampling import SamplingParams
from scheduler.scheduler import Scheduler


def config_for(sc: Scenario) -> SchedulerConfig:
    return SchedulerConfig(
        kv_tokens=sc.kv_tokens,
        context_len=sc.context_len,
        policy=sc.policy,
        page_size=sc.page_size,
        max_prefill_tokens=sc.max_prefill_tokens,
        chunked_prefill_size=sc.chunked_prefill_size,
        max_running_requests=sc.max_running_requests,
        disable_radix_cache=sc.disable_radix_cache,
        overlap=sc.overlap,
        schedule_conservativeness=sc.schedule_conservativeness,
        enable_mixed_chunk=sc.enable_mixed_chunk,
        enable_priority_scheduling=sc.enable_priority_scheduling,
        priority_scheduling_preemption_threshold=sc.priority_preemption_threshold,
    )


def make_req(r: ScenarioRequest, index: int) -> Req:
    prompt = list(r.prompt)
    return Req(
        rid=r.rid,
        input_len=len(prompt),
        input_ids_fn=lambda: prompt,
        sampling_params=SamplingParams(max_new_tokens=r.max_new_tokens, ignore_eos=r.ignore_eos),
        arrival_time=float(r.arrival_step),
        priority=r.priority,
        eos_token_ids=(EOS_TOKEN_ID,),
        index=index,
    )


class LogicalClockDriver:
    """Answers the loop's waits on a step clock, and records each launched batch."""

    def __init__(self, scheduler: Scheduler, by_rid: dict[str, ScenarioRequest]) -> None:
        self.scheduler = scheduler
        self.by_rid = by_rid
        self.now = 0.0
        self.steps: list[StepDecision] = []
        self._retractions: dict[str, int] = {}

    def clock(self) -> float:
        return self.now

    def run(self, loop: EventLoop, max_steps: int) -> None:
        self.loop = loop
        gen = loop.run()
        value: Any = None
        while len(self.steps) < max_steps:
            try:
                wait = gen.send(value)
            except StopIteration:
                return
            value = None
            if isinstance(wait, CpuWork):
                continue
            if isinstance(wait, Launch):
                value = self._launch(wait.plan)
                self.now += 1
            elif isinstance(wait, AwaitResult):
                value = wait.handle
            elif isinstance(wait, WaitForArrival):
                self.now = max(self.now, wait.until)

    def _launch(self, plan: ForwardPlan) -> ForwardResult:
        sched = self.scheduler
        batch = sched.last_batch
        assert batch is not None and batch.plan is plan
        reqs = batch.reqs
        retracted = []
        for r in self.loop.received:
            n = r.num_retractions
            if n != self._retractions.get(r.rid, 0):
                retracted.append(r.rid)
                self._retractions[r.rid] = n
        self.steps.append(
            StepDecision(
                mode=plan.mode.value,
                reqs=[(r.rid, n) for r, n in zip(reqs, plan.extend_lens)],
                retracted=sorted(retracted),
                new_token_ratio=round(sched.new_token_ratio, 9),
                kv_used=sched.kv_used_tokens(),
                kv_cached=sched.tree_cache.evictable_size(),
                num_waiting=len(sched.waiting_queue),
            )
        )
        # The token each request samples follows its last position, as on the oracle's side.
        tokens = [sampled_token(self.by_rid[r.rid], s - r.input_len) for r, s in zip(reqs, plan.seq_lens)]
        return ForwardResult(tokens, self.now, self.now + 1)


def run_ours(sc: Scenario, max_steps: int = 100_000) -> RunResult:
    sched = Scheduler(config_for(sc))
    order = sorted(range(len(sc.requests)), key=lambda i: sc.requests[i].arrival_step)
    reqs = [make_req(sc.requests[i], i) for i in order]
    by_rid = {r.rid: r for r in sc.requests}
    driver = LogicalClockDriver(sched, by_rid)
    loop = EventLoop(sched, iter(reqs), driver.clock, sc.overlap)
    error = None
    try:
        driver.run(loop, max_steps)
    except DeadlockError as e:
        error = f"stuck: {e}"
    rejected = [r.rid for r in loop.received if r.finished_reason == FinishReason.REJECTED]
    outputs = {r.rid: len(r.output_ids) for r in loop.received if r.finished_reason != FinishReason.REJECTED}
    return RunResult(driver.steps, rejected, outputs, error)
