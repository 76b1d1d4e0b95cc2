"""With async scheduling, a vLLM decode stretch may start while the batch in flight ends a
prompt (a prefill or mixed step, scheduler/vllm/decode_stretches.py): its processing gives
each request its token as a decode's does, so the stretch's first step processes it in bulk.
Here requests arrive one by one while others decode, so that most stretches start so (the
step after each prefill), with blocks of 4 and 16 on a pool the cache fills; the run equals
stepping's."""

from __future__ import annotations

import pytest
from loop_helpers import assert_same_run, run_spaced_requests

from scheduler.core.forward_plan import ForwardMode
from scheduler.vllm.config import VllmSchedulerConfig
from scheduler.vllm.decode_stretches import VllmDecodeStretches
from scheduler.vllm.scheduler import VllmScheduler


@pytest.mark.parametrize("page_size", [4, 16])
@pytest.mark.parametrize("kv_tokens", [2000, 20000])
def test_stretches_from_a_prefill_in_flight_give_the_run_that_stepping_gives(page_size, kv_tokens, monkeypatch):
    seen = {"after_prefill": 0}
    ask = VllmDecodeStretches.decode_stretch

    def counting(self, inflight, token_id):
        stretch = ask(self, inflight, token_id)
        seen["after_prefill"] += stretch is not None and inflight is not None and inflight.plan.mode is not ForwardMode.DECODE
        return stretch

    monkeypatch.setattr(VllmDecodeStretches, "decode_stretch", counting)

    def run(fast_forward: bool):
        sched = VllmScheduler(VllmSchedulerConfig(kv_tokens=kv_tokens, context_len=8192, overlap=True, page_size=page_size))
        return run_spaced_requests(sched, 24, 0.5, 3, fast_forward, True), sched

    ff_loop, ff_sched = run(True)
    step_loop, step_sched = run(False)
    assert seen["after_prefill"] >= 10, seen
    assert_same_run(ff_loop, ff_sched, step_loop, step_sched)
