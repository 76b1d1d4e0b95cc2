"""Closed-loop load (`testbed replay TRACE --concurrency N`): N clients, each sending its next
request when its previous one is done, as `vllm bench serve --max-concurrency` does.

What a user checks in the requests table: never more than N requests in flight; the first N
arrive at 0 and request k + N arrives exactly when an earlier one finishes (the arrival column
is when it was sent, so TTFT counts from then); with N at least the number of requests every
request arrives at 0. Fast-forward gives the run that stepping gives (both schedulers, overlap
on and off), and takes stretches at all. Bad input is one line and exit code 2; a real-engine
run on the tiny CPU model keeps the bound too. CL_EXAMPLES=500 runs a longer fuzz of the
fast-forward property (30 examples under --hypothesis-profile=deep, 8 under the default ci
profile: hypothesis_profiles.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from cli_helpers import assert_clean_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from loop_helpers import CountingLoop, run_closed_loop

from scheduler.core.req import Req
from scheduler.core.sampling import SamplingParams
from scheduler.loop.arrivals import ClosedLoopArrivals
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.scheduler import Scheduler
from scheduler.vllm.config import VllmSchedulerConfig
from scheduler.vllm.scheduler import VllmScheduler
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import load_run
from testbed.traces.schema import Trace, TraceRequest

REPO = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "testbed.cli"]
EXAMPLE = str(REPO / "traces" / "a.json")


def _testbed(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)


def _trace(n: int = 30, seed: int = 0, spread_s: float = 5.0) -> Trace:
    """n requests spread over spread_s seconds (times a closed loop ignores), half of them behind
    one of two shared prompts, outputs from 1 to 300 tokens."""
    rnd = np.random.default_rng(seed)
    prefixes = [list(range(10_000 * (k + 1), 10_000 * (k + 1) + 200)) for k in range(2)]
    reqs = []
    for i in range(n):
        tail = list(range(100_000 + 1000 * i, 100_000 + 1000 * i + int(rnd.integers(10, 400))))
        prompt = prefixes[i % 2] + tail if i % 3 else tail
        out = int(rnd.choice([1, 2, 30, 120, 300]))
        reqs.append(TraceRequest(spread_s * i / n, len(prompt), out, input_ids=prompt))
    return Trace(reqs)


def _write(trace: Trace, path: Path) -> Path:
    trace.write(path)
    return path


def _closed_replay(trace_path: Path, out: Path, concurrency: int, **opts):
    result = replay(str(trace_path), ReplayOptions(concurrency=concurrency, **opts), out=out)
    return result, load_run(out)


def max_in_flight(requests: pd.DataFrame) -> int:
    """The most requests between their arrival and their finish at any moment ([arrival, finish):
    a request that finishes at t is no longer in flight when the one it releases arrives at t)."""
    events = sorted([(t, 1) for t in requests["arrival"]] + [(t, -1) for t in requests["finish"]])  # -1 before +1 at a tie
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def assert_closed_loop(requests: pd.DataFrame, n: int) -> None:
    """The bound, and the arrivals: the first n at 0, then each at the finish that released it."""
    assert not requests["finish"].isna().any(), "every request is done"
    reqs = requests.sort_values("index")
    arrivals = reqs["arrival"].to_numpy()
    total = len(reqs)
    peak = max_in_flight(reqs)
    assert peak <= n
    if not (reqs["status"] == "rejected").any():  # (a rejected request is in flight for no time)
        assert peak == min(n, total)
    assert np.all(arrivals[: min(n, total)] == 0.0)
    # Request n + j arrives at the j-th finish (finished or rejected), exactly: the very float.
    finishes = np.sort(reqs["finish"].to_numpy())
    assert np.array_equal(arrivals[n:], finishes[: max(0, total - n)])
    assert np.all(np.diff(arrivals) >= 0), "requests are sent in trace order"
    # TTFT counts from the arrival, i.e. from when the request was sent.
    finished = reqs[reqs["status"] == "finished"]
    assert np.all(finished["first_token"] >= finished["arrival"])


# --- the bound and the arrivals -------------------------------------------------------------


@pytest.mark.parametrize("scheduler", ["sglang", "vllm"])
@pytest.mark.parametrize("overlap", [False, True])
def test_never_more_than_n_in_flight_and_each_request_arrives_when_one_finishes(tmp_path, scheduler, overlap):
    path = _write(_trace(40), tmp_path / "t.json")
    result, run = _closed_replay(path, tmp_path / "run", 4, scheduler=scheduler, overlap=overlap)
    assert result.status == "complete" and run.summary["completed"] == 40
    assert_closed_loop(run.requests, 4)
    assert run.meta["options"]["concurrency"] == 4
    assert "closed loop: 4 clients" in run.meta["arrivals"] and "ignored" in run.meta["arrivals"]


def test_with_n_at_least_the_requests_every_request_arrives_at_zero(tmp_path):
    path = _write(_trace(12), tmp_path / "t.json")
    for n in (12, 50):
        _, run = _closed_replay(path, tmp_path / f"n{n}", n)
        assert (run.requests["arrival"] == 0.0).all()
        assert_closed_loop(run.requests, n)


def test_one_client_sends_one_request_at_a_time(tmp_path):
    path = _write(_trace(10), tmp_path / "t.json")
    _, run = _closed_replay(path, tmp_path / "run", 1)
    reqs = run.requests.sort_values("index")
    assert np.array_equal(reqs["arrival"].to_numpy()[1:], reqs["finish"].to_numpy()[:-1])
    assert_closed_loop(reqs, 1)


def test_a_rejected_request_frees_its_client_at_once(tmp_path):
    """Requests longer than the KV pool are rejected at arrival: the client sends its next
    request at that moment, and the bound holds."""
    reqs = [
        TraceRequest(
            0.1 * i, 3000 if i % 4 == 1 else 50 + i, 20, input_ids=list(range(1000 * i, 1000 * i + (3000 if i % 4 == 1 else 50 + i)))
        )
        for i in range(16)
    ]
    path = _write(Trace(reqs), tmp_path / "t.json")
    result, run = _closed_replay(path, tmp_path / "run", 3, kv_tokens=2000)
    assert result.summary["rejected"] == 4 and result.summary["completed"] == 12
    rejected = run.requests[run.requests["status"] == "rejected"]
    assert (rejected["finish"] == rejected["arrival"]).all()
    assert_closed_loop(run.requests, 3)


@pytest.mark.slow
def test_the_trace_arrival_times_do_not_matter(tmp_path):
    """The same requests, arriving over 5 s or over an hour: the same closed-loop run."""
    a = _closed_replay(_write(_trace(20, spread_s=5.0), tmp_path / "a.json"), tmp_path / "a", 3)[1]
    b = _closed_replay(_write(_trace(20, spread_s=3600.0), tmp_path / "b.json"), tmp_path / "b", 3)[1]
    assert a.summary == b.summary
    pd.testing.assert_frame_equal(a.requests, b.requests)


def test_arrival_source_hands_out_the_first_n_then_one_per_request_done():
    def req(i: int) -> Req:
        return Req(str(i), 4, lambda: [1, 2, 3, 4], SamplingParams(max_new_tokens=2), arrival_time=100.0 + i, index=i)

    source = ClosedLoopArrivals(iter([req(i) for i in range(4)]), 2)
    assert source.next_arrival() == 0.0 and source.sends_on_finish
    first = [source.pop_arrived(0.0), source.pop_arrived(0.0)]
    assert [r.rid for r in first] == ["0", "1"] and source.pop_arrived(1e9) is None and source.next_arrival() is None
    first[1].finish_time = 2.5
    source.done(first[1])
    assert source.next_arrival() == 2.5 and source.pop_arrived(2.4) is None
    third = source.pop_arrived(2.5)
    assert third.rid == "2" and third.arrival_time == 2.5
    first[0].finish_time = 3.0
    source.done(first[0])  # sends the last request: no more to send after it
    assert not source.sends_on_finish and source.pop_arrived(3.0).rid == "3"
    with pytest.raises(ValueError):
        ClosedLoopArrivals(iter([]), 0)


# --- fast-forward equals stepping -------------------------------------------------------------

TIME_COLUMNS = ("token_times",)


def _assert_same_table(a: pd.DataFrame, b: pd.DataFrame, what: str) -> None:
    assert list(a.columns) == list(b.columns) and len(a) == len(b), what
    for c in a.columns:
        x, y = a[c], b[c]
        if c in TIME_COLUMNS:
            assert all(np.array_equal(p, q) for p, q in zip(x, y)), f"{what}.{c}"
        elif x.dtype.kind == "f":
            assert np.array_equal(x.to_numpy(), y.to_numpy(), equal_nan=True), f"{what}.{c}: max difference {np.nanmax(np.abs(x - y))}"
        else:
            assert x.tolist() == y.tolist(), f"{what}.{c}"


def _assert_ff_equals_stepping(trace_path: Path, tmp: Path, concurrency: int, **opts) -> None:
    step_res, step_run = _closed_replay(trace_path, tmp / "step", concurrency, fast_forward=False, **opts)
    ff_res, ff_run = _closed_replay(trace_path, tmp / "ff", concurrency, fast_forward=True, **opts)
    assert ff_res.summary == step_res.summary
    _assert_same_table(step_run.requests, ff_run.requests, "requests")
    _assert_same_table(step_run.steps, ff_run.steps, "steps")
    assert_closed_loop(ff_run.requests, concurrency)


@pytest.mark.slow
@pytest.mark.parametrize("scheduler,page_size", [("sglang", 1), ("sglang", 16), ("vllm", 16)])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("kv_tokens", [None, 2500])  # ample, and a pool the cache fills (evictions, retractions)
def test_fast_forward_gives_the_closed_loop_run_that_stepping_gives(tmp_path, scheduler, page_size, overlap, kv_tokens):
    path = _write(_trace(30, seed=1), tmp_path / "t.json")
    _assert_ff_equals_stepping(path, tmp_path, 5, scheduler=scheduler, page_size=page_size, overlap=overlap, kv_tokens=kv_tokens)


@st.composite
def _case(draw):
    n = draw(st.integers(1, 14))
    prefix = list(range(10_000, 10_000 + draw(st.integers(1, 120))))
    reqs = []
    for i in range(n):
        tail = list(range(50_000 + 1000 * i, 50_000 + 1000 * i + draw(st.integers(1, 150))))
        prompt = prefix + tail if draw(st.booleans()) else tail
        reqs.append(TraceRequest(0.01 * i, len(prompt), draw(st.sampled_from([1, 2, 5, 40, 120, 300])), input_ids=prompt))
    need = max(r.input_len + r.output_len for r in reqs)
    opts = {
        "scheduler": draw(st.sampled_from(["sglang", "vllm"])),
        "overlap": draw(st.booleans()),
        "page_size": draw(st.sampled_from([1, 16])),
        "kv_tokens": draw(st.sampled_from([need + 40, 2 * need + 64, 100_000])),
        "disable_radix_cache": draw(st.booleans()),
    }
    if opts["scheduler"] == "vllm":
        opts["max_num_seqs"] = draw(st.sampled_from([2, 256]))
        opts["max_num_batched_tokens"] = draw(st.sampled_from([64, 8192]))
    else:
        opts["policy"] = draw(st.sampled_from(["fcfs", "lpm"]))
        opts["chunked_prefill_size"] = draw(st.sampled_from([0, 64]))
        opts["max_running_requests"] = draw(st.sampled_from([None, 3]))
    return Trace(reqs), draw(st.sampled_from([1, 2, 3, 6, 100])), opts


@pytest.mark.slow
@settings(
    max_examples=int(os.environ.get("CL_EXAMPLES", 0)) or examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=_case())
def test_fast_forward_equals_stepping_on_random_closed_loops(case, tmp_path_factory):
    trace, concurrency, opts = case
    tmp = tmp_path_factory.mktemp("cl")
    _assert_ff_equals_stepping(_write(trace, tmp / "t.json"), tmp, concurrency, **opts)


def _direct_run(fast_forward: bool, overlap: bool, scheduler: str) -> tuple[CountingLoop, Scheduler | VllmScheduler]:
    if scheduler == "vllm":
        sched = VllmScheduler(VllmSchedulerConfig(kv_tokens=200_000, context_len=8192, overlap=overlap, page_size=16))
    else:
        sched = Scheduler(SchedulerConfig(kv_tokens=200_000, context_len=8192, overlap=overlap))
    return run_closed_loop(sched, fast_forward, overlap), sched


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["sglang", "vllm"])
@pytest.mark.parametrize("overlap", [False, True])
def test_fast_forward_takes_stretches_between_the_finishes_of_a_closed_loop(scheduler, overlap):
    """Not vacuous: the closed loop's stretches cover most steps (they end at each finish while
    requests are left to send, so the equality above is the stretches' and not stepping's)."""
    step_loop, step_sched = _direct_run(False, overlap, scheduler)
    ff_loop, ff_sched = _direct_run(True, overlap, scheduler)
    assert len(ff_loop.steps) == len(step_loop.steps) > 1500
    assert ff_loop.num_stretches >= 15  # about one between two finishes (20 requests sent on finishes)
    assert ff_loop.waits * 20 < step_loop.waits, (ff_loop.waits, step_loop.waits)
    for name, col in step_loop.steps.cols.items():
        assert list(ff_loop.steps.cols[name]) == list(col), name
    assert [(r.rid, r.arrival_time, r.finish_time, list(r.token_times)) for r in ff_sched.done] == [
        (r.rid, r.arrival_time, r.finish_time, list(r.token_times)) for r in step_sched.done
    ]


# --- the command line ----------------------------------------------------------------------


def test_replay_says_once_that_arrival_times_are_ignored(tmp_path):
    proc = _testbed("replay", EXAMPLE, "--concurrency", "8", "--max-requests", "40", "--out", tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "arrival times are ignored" in line]
    assert len(notes) == 1 and notes[0].startswith("closed loop: 8 clients")
    assert "closed loop of 8 clients" in proc.stdout  # the summary's title
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["options"]["concurrency"] == 8 and meta["arrivals"] == notes[0]
    assert_closed_loop(load_run(tmp_path / "run").requests, 8)


@pytest.mark.slow
@pytest.mark.parametrize(
    "value,needle",
    [
        ("0", "must be a positive integer, got 0"),
        ("-3", "got -3"),
        ("2.5", "invalid positive_int value: '2.5'"),
        ("x", "invalid positive_int value: 'x'"),
    ],
)
def test_a_bad_concurrency_is_one_line(tmp_path, value, needle):
    proc = _testbed("replay", EXAMPLE, f"--concurrency={value}", "--out", tmp_path / "run")
    assert_clean_error(proc, "--concurrency", needle)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("other", [["--time-scale", "2"], ["--rate", "4"]])
def test_concurrency_with_an_option_that_shapes_arrivals_is_refused(tmp_path, other):
    proc = _testbed("replay", EXAMPLE, "--concurrency", "4", *other, "--out", tmp_path / "run")
    assert_clean_error(proc, "--concurrency 4", other[0], "give one of them")


def test_a_sharegpt_trace_needs_no_rate_in_a_closed_loop(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n" + "".join(f"{20 + i},{5 + i}\n" for i in range(10)))
    proc = _testbed("replay", path, "--concurrency", "3", "--out", tmp_path / "run", "-q")
    assert proc.returncode == 0, proc.stderr
    assert_closed_loop(load_run(tmp_path / "run").requests, 3)


@pytest.mark.slow
def test_a_sweep_takes_concurrency_as_an_axis(tmp_path):
    out = tmp_path / "sweep"
    proc = _testbed(
        "sweep", EXAMPLE, "--max-requests", "30", "--grid", "concurrency=1,4,none", "--workers", "1", "--out", out, "-q", timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if "arrival times are ignored" in line]) == 1
    table = pq.read_table(out / "sweep.parquet").to_pandas()
    assert table["point"].tolist() == ["concurrency=1", "concurrency=4", "concurrency=none"]
    assert table["concurrency"].tolist()[:2] == [1, 4] and pd.isna(table["concurrency"].tolist()[2])
    for n in (1, 4):
        assert_closed_loop(load_run(out / "points" / f"concurrency={n}").requests, n)
    # One client at a time serves the trace slower than four.
    assert table["request_throughput"][0] < table["request_throughput"][1]


@pytest.mark.parametrize("args", [["--concurrency", "4"], ["--grid", "concurrency=1,4"]])
def test_capacity_refuses_a_closed_loop(tmp_path, args):
    proc = _testbed("capacity", EXAMPLE, "--slo", "p90_ttft_ms=500", *args, "--out", tmp_path / "cap")
    assert_clean_error(proc, "concurrency", "closed loop", "testbed sweep --grid concurrency=")


# --- the real engine ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_closed_loop_replay_keeps_the_bound(tmp_path):
    """On the CPU with the tiny model (dummy weights), as tests/engine/test_engine_replay.py runs it."""
    reqs = [TraceRequest(10.0 * i, 12 + 3 * i, 2 + i % 4) for i in range(6)]  # (10 s apart: ignored)
    path = _write(Trace(reqs), tmp_path / "t.json")
    proc = _testbed(
        "replay",
        path,
        "--mode",
        "real",
        "--device",
        "cpu",
        "--model",
        "tiny-llama",
        "--kv-tokens",
        "2048",
        "--concurrency",
        "2",
        "--out",
        tmp_path / "run",
        "-q",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    run = load_run(tmp_path / "run")
    assert run.meta["mode"] == "real" and run.meta["options"]["concurrency"] == 2
    assert run.summary["completed"] == 6
    assert_closed_loop(run.requests, 2)
    assert run.summary["duration_s"] < 30  # not the trace's 50 s of arrivals
