"""Our scheduler (scheduler/) on the same logical clock: its own event loop, driven by
scheduler.step_clock (a launched forward advances the clock by one, an idle wait moves it to
the next arrival), forwards "sampling" the scenario's tokens."""

from __future__ import annotations

from conformance.decision import RunResult
from conformance.scenario import EOS_TOKEN_ID, Scenario, ScenarioRequest, sampled_token
from scheduler.core.req import FinishReason, Req
from scheduler.core.sampling import SamplingParams
from scheduler.loop.event_loop import DeadlockError, EventLoop
from scheduler.loop.step_clock import StepClockDriver
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.scheduler import Scheduler


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


def run_ours(sc: Scenario, max_steps: int = 100_000) -> RunResult:
    sched = Scheduler(config_for(sc))
    order = sorted(range(len(sc.requests)), key=lambda i: sc.requests[i].arrival_step)
    reqs = [make_req(sc.requests[i], i) for i in order]
    by_rid = {r.rid: r for r in sc.requests}
    driver = StepClockDriver(sched, lambda req, k: sampled_token(by_rid[req.rid], k))
    loop = EventLoop(sched, iter(reqs), driver.clock, sc.overlap)
    error = None
    try:
        driver.run(loop, max_steps)
    except DeadlockError as e:
        error = f"stuck: {e}"
    rejected = [r.rid for r in loop.received if r.finished_reason == FinishReason.REJECTED]
    outputs = {r.rid: len(r.output_ids) for r in loop.received if r.finished_reason != FinishReason.REJECTED}
    never = [r.rid for r in loop.received if (r.reject_reason or "").startswith("never admitted")]
    return RunResult(driver.steps, rejected, outputs, error, never)
