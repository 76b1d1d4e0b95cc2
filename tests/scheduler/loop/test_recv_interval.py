"""SGLang's --scheduler-recv-interval (scheduler/loop/recv_skipper.py): the scheduler takes in new
requests once every N decode steps, at once after a prefill or when idle.

What a user of `testbed replay --scheduler-recv-interval N` checks: a request sent while others
decode waits for the interval's decode steps before its prefill, so TTFT grows with N and TPOT
does not; fast-forward gives the run that stepping gives; vLLM's scheduler refuses the flag, and a
bad value is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_clean_error
from loop_helpers import CountingLoop, assert_same_run, run_closed_loop

from scheduler.core.forward_plan import ForwardMode
from scheduler.loop.recv_skipper import RecvSkipper
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.scheduler import Scheduler

REPO = Path(__file__).resolve().parents[3]


def test_the_counter_is_sglangs():
    """SchedulerRecvSkipper.handle: decodes add 1, any other mode 1000; receive at the interval."""
    skipper = RecvSkipper(3)
    decodes = [skipper.should_receive(ForwardMode.DECODE) for _ in range(7)]
    assert decodes == [False, False, True, False, False, True, False]
    assert skipper.should_receive(ForwardMode.EXTEND)  # after a prefill, at once
    assert skipper.should_receive(ForwardMode.MIXED)
    assert not skipper.should_receive(ForwardMode.DECODE)
    assert skipper.should_receive(None)  # idle: at once
    skipper.skip_decode_iterations(5)  # 5 decodes that received nothing: 2 into the next interval
    assert skipper.counter == 2 and skipper.should_receive(ForwardMode.DECODE)


def _closed_loop(interval: int, fast_forward: bool, overlap: bool) -> tuple[CountingLoop, Scheduler]:
    sched = Scheduler(SchedulerConfig(kv_tokens=200_000, context_len=8192, overlap=overlap, scheduler_recv_interval=interval))
    return run_closed_loop(sched, fast_forward, overlap), sched


def _ttft_and_tpot(sched: Scheduler) -> tuple[float, float]:
    ttft = [r.token_times[0] - r.arrival_time for r in sched.done]
    tpot = [(r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1) for r in sched.done]
    return float(np.mean(ttft)), float(np.mean(tpot))


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True])
def test_a_request_sent_during_decodes_waits_for_the_interval(overlap):
    """The requests sent on a finish (20 of 24) arrive while the others decode: at interval 10
    each waits for up to 10 decode steps, so TTFT grows by several decode steps and TPOT barely
    moves (the prefills still share the decodes' steps)."""
    (_, every_step), (_, every_ten) = _closed_loop(1, True, overlap), _closed_loop(10, True, overlap)
    (ttft_1, tpot_1), (ttft_10, tpot_10) = _ttft_and_tpot(every_step), _ttft_and_tpot(every_ten)
    assert ttft_10 > ttft_1 + 2 * tpot_1
    assert ttft_10 < ttft_1 + 12 * tpot_10  # at most the interval's steps (and the one in flight) more
    assert tpot_10 == pytest.approx(tpot_1, rel=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True])
def test_fast_forward_gives_the_run_stepping_gives(overlap):
    ff_loop, ff_sched = _closed_loop(10, True, overlap)
    step_loop, step_sched = _closed_loop(10, False, overlap)
    assert ff_loop.num_stretches >= 10 and ff_loop.waits * 5 < step_loop.waits  # stretches were taken
    assert_same_run(ff_loop, ff_sched, step_loop, step_sched)


@pytest.mark.slow
def test_vllm_refuses_it_and_a_bad_value_is_one_line(tmp_path):
    def testbed(*args):
        cmd = [sys.executable, "-m", "testbed.cli", "replay", str(REPO / "traces" / "a.json"), "--max-requests", "5", *args]
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)

    assert_clean_error(testbed("--scheduler", "vllm", "--scheduler-recv-interval", "10"), "--scheduler-recv-interval", "every step")
    assert_clean_error(testbed("--scheduler-recv-interval", "0"), "--scheduler-recv-interval", "0")
    done = testbed("--scheduler-recv-interval", "10", "--out", tmp_path / "run")
    assert done.returncode == 0, done.stderr
