"""EventLoop.forget_history: a loop that runs as long as a server (testbed serve) drops its step
log and the finished requests now and then, and every request still ends as it would have."""

from __future__ import annotations

import pytest

from scheduler.core.req import Req
from scheduler.core.sampling import SamplingParams
from scheduler.loop.event_loop import EventLoop
from scheduler.model_config import load_model_config
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.scheduler import Scheduler
from scheduler.vllm.config import VllmSchedulerConfig
from scheduler.vllm.scheduler import VllmScheduler
from simulator.costs.roofline import RooflineCostModel
from simulator.driver.sim_driver import SimDriver
from simulator.hardware.specs import load_hardware


def _reqs(n: int) -> list[Req]:
    return [
        Req(str(i), 30 + i, (lambda i=i: list(range(i, i + 30 + i))), SamplingParams(max_new_tokens=20 + i % 7), 0.01 * i, index=i)
        for i in range(n)
    ]


@pytest.mark.parametrize("scheduler", ["sglang", "vllm"])
@pytest.mark.parametrize("overlap", [False, True])
def test_forgetting_history_changes_no_request_and_bounds_what_is_kept(scheduler, overlap):
    def run(forget: bool) -> tuple[list[Req], EventLoop]:
        if scheduler == "vllm":
            sched = VllmScheduler(VllmSchedulerConfig(kv_tokens=4000, context_len=4096, overlap=overlap))
        else:
            sched = Scheduler(SchedulerConfig(kv_tokens=4000, context_len=4096, overlap=overlap))
        driver = SimDriver(RooflineCostModel(load_model_config("tiny-llama"), load_hardware("h100")), fast_forward=False)
        reqs = _reqs(40)
        loop = None

        def after_step(_done: int) -> None:
            if forget and len(loop.steps) >= 10:
                loop.forget_history()

        loop = EventLoop(sched, iter(reqs), driver.clock, overlap, after_step)
        driver.run(loop)
        return reqs, loop

    kept, full = run(False)
    forgot, loop = run(True)
    assert [(len(r.output_ids), r.finish_time) for r in forgot] == [(len(r.output_ids), r.finish_time) for r in kept]
    assert all(r.finished() for r in forgot)
    assert len(loop.steps) < 10 and len(loop.received) < 40 and len(loop.scheduler.done) < 40
    assert len(full.steps) > 40  # (the run did take more steps than the bound)
