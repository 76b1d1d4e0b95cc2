"""replay() and its run folder: run.json, requests.parquet, steps.parquet.

The tables are checked against each other and against the trace, and the summary is
recomputed from requests.parquet by the definitions serving benchmarks use.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from scheduler.loop.step_log import STEP_COLUMNS
from testbed.options import OPTION_FIELDS, ReplayOptions, recorded_options
from testbed.replay import ReplayProgress, replay
from testbed.runs.folder import load_run
from testbed.traces.gen import GenConfig, generate_trace
from testbed.traces.schema import Trace

LATENCY_KEYS = [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", "p50", "p90", "p99")]
SUMMARY_KEYS = ["completed", "duration_s", "request_throughput", "output_throughput", *LATENCY_KEYS, "cache_hit_rate"]
REQUEST_COLUMNS = [
    "arrival",
    "queued",
    "scheduled",
    "first_token",
    "finish",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "status",
]


def _trace(n: int = 40, rate: float = 30.0, seed: int = 11) -> Trace:
    return generate_trace(
        GenConfig(
            num_requests=n,
            rate=rate,
            input_len="uniform:30,400",
            output_len="uniform:1,80",
            system_prompts=2,
            system_prompt_len=256,
            shared_fraction=0.7,
            multi_turn_fraction=0.3,
            block_size=16,
            seed=seed,
        )
    )


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory) -> tuple[Path, Trace]:
    trace = _trace()
    path = tmp_path_factory.mktemp("trace") / "t.json"
    trace.write(path)
    return path, trace


@pytest.fixture(scope="module", params=[True, False], ids=["overlap", "normal"])
def run(request, trace_file, tmp_path_factory):
    """One complete run per mode: (options, ReplayResult, Run, trace path, trace)."""
    path, trace = trace_file
    opts = ReplayOptions(overlap=request.param, page_size=16, chunked_prefill_size=256, seed=1)
    out = tmp_path_factory.mktemp("run") / "folder"
    calls: list[ReplayProgress] = []
    result = replay(str(path), opts, out=out, progress=calls.append)
    return opts, result, load_run(out), path, trace, calls


# --- run.json --------------------------------------------------------------------------


def test_run_json_records_status_options_versions_and_trace(run):
    opts, result, r, path, trace, _ = run
    assert result.status == "complete" and r.status == "complete"
    meta = json.loads((r.path / "run.json").read_text())
    assert meta["status"] == "complete"
    # run.json records the options that ran: a default model and hardware are resolved to their
    # names, the memory fraction to SGLang's for the device (an H100 with 256-token chunks: 0.874).
    # Every option.
    resolved = {"model": opts.model or "llama-3.1-8b", "hardware": opts.hardware or "h100", "mem_fraction_static": 0.874}
    assert meta["options"] == json.loads(json.dumps(recorded_options(opts) | resolved))
    assert set(meta["options"]) == set(OPTION_FIELDS)
    assert meta["mode"] == "sim"
    assert meta["model"] == resolved["model"] and meta["hardware"] == resolved["hardware"]
    sched = meta["scheduler"]
    assert sched["page_size"] == 16 and sched["chunked_prefill_size"] == 256 and sched["overlap"] == opts.overlap
    assert sched["follows"] == "sglang 0.5.23"
    assert sched["kv_tokens"] == r.summary["kv_tokens"] > 0
    versions = meta["versions"]
    for pkg in ("python", "testbed", "simpy", "pandas"):
        assert versions.get(pkg), f"versions lacks {pkg}"
    t = meta["trace"]
    assert t["path"] == str(path)
    assert t["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert t["num_requests"] == len(trace)
    assert t["format"] == "native"
    wall = json.loads((r.path / "wall.json").read_text())
    assert wall["wall_s"] >= 0 and wall["created_at"]


def test_summary_has_every_key(run):
    _, result, r, *_ = run
    for key in SUMMARY_KEYS:
        assert key in r.summary, f"summary lacks {key}"
        assert r.summary[key] is not None, f"summary {key} is None"
    assert result.summary == r.summary
    assert r.summary["completed"] == len(r.requests)


# --- requests.parquet --------------------------------------------------------------------


def test_requests_table_one_row_per_request_with_ordered_times(run):
    opts, _, r, _, trace, _ = run
    df = r.requests
    for col in REQUEST_COLUMNS:
        assert col in df.columns, f"requests.parquet lacks {col}"
    assert len(df) == len(trace)
    assert df["index"].tolist() == list(range(len(trace)))
    assert df["rid"].tolist() == [t.rid for t in trace.requests]
    assert (df["status"] == "finished").all()
    t0 = trace.requests[0].arrival_s
    assert np.allclose(df["arrival"], [(t.arrival_s - t0) * opts.time_scale for t in trace.requests])
    assert df["input_tokens"].tolist() == [t.input_len for t in trace.requests]
    assert df["output_tokens"].tolist() == [t.output_len for t in trace.requests]
    times = df[["arrival", "queued", "scheduled", "first_token", "finish"]]
    assert not times.isna().any().any()
    assert (df["arrival"] <= df["queued"]).all() and (df["queued"] <= df["scheduled"]).all()
    # Taken in by a schedule (a step's start), else on arrival at an idle loop.
    starts = set(r.steps["schedule_start"])
    assert all(q in starts or q == a for q, a in zip(df["queued"], df["arrival"]))
    assert (df["queued"] > df["arrival"]).any()  # some arrived while a step ran
    assert (df["scheduled"] <= df["first_token"]).all()
    assert (df["first_token"] <= df["finish"]).all()
    assert (df["cached_tokens"] >= 0).all() and (df["cached_tokens"] < df["input_tokens"]).all()
    for row in df.itertuples():
        tt = np.asarray(row.token_times)
        assert len(tt) == row.output_tokens
        assert tt[0] == row.first_token and tt[-1] == row.finish and np.all(np.diff(tt) >= 0)


# --- steps.parquet -----------------------------------------------------------------------


def test_steps_table_intervals_and_kv(run):
    opts, _, r, *_ = run
    st = r.steps
    assert list(st.columns) == [*STEP_COLUMNS, "instance"]
    assert (st["instance"] == 0).all()  # one instance
    assert len(st) == r.summary["num_steps"] > 0
    assert st["step"].tolist() == list(range(1, len(st) + 1))
    assert set(st["mode"]) <= {"extend", "decode", "mixed"}
    for a, b in (("schedule", "schedule"), ("launch", "launch"), ("device", "device"), ("process", "process")):
        assert (st[f"{a}_start"] <= st[f"{b}_end"]).all(), f"{a}_start > {a}_end"
    # The order of one step: schedule, launch, (device), process.
    assert (st["schedule_end"] <= st["launch_start"]).all()
    assert (st["launch_start"] <= st["device_start"]).all()
    assert (st["launch_end"] <= st["device_end"]).all()
    assert (st["device_end"] <= st["process_start"]).all()
    # One device stream: forwards never overlap, and run in step order.
    ds, de = st["device_start"].to_numpy(), st["device_end"].to_numpy()
    assert np.all(ds[1:] >= de[:-1] - 1e-12), "two forwards overlap on the device"
    # One CPU thread: no two CPU intervals (of any steps) overlap.
    cpu = np.concatenate([st[[f"{s}_start", f"{s}_end"]].to_numpy() for s in ("schedule", "launch", "process")])
    cpu = cpu[np.lexsort((cpu[:, 1], cpu[:, 0]))]
    assert np.all(cpu[1:, 0] >= cpu[:-1, 1] - 1e-12), "two CPU intervals overlap"
    if not opts.overlap:
        assert np.all(st["schedule_start"].to_numpy()[1:] >= st["process_end"].to_numpy()[:-1])
    kv = r.summary["kv_tokens"]
    assert (st["kv_used_tokens"] >= 0).all() and (st["kv_used_tokens"] <= kv).all()
    assert (st["kv_used_tokens"] + st["kv_cached_tokens"] <= kv).all()
    assert (st["batch_size"] > 0).all() and (st["num_tokens"] >= st["batch_size"]).all()
    decode = st[st["mode"] == "decode"]
    assert (decode["num_tokens"] == decode["batch_size"]).all()
    # Cost features: a decode attends to every cached token plus its own; the longest
    # sequence is at least the mean one and at most all of them.
    assert (decode["attention_pairs"] == decode["prefix_tokens"] + decode["num_tokens"]).all()
    seq = st["prefix_tokens"] + st["num_tokens"]
    assert (st["max_seq_len"] * st["batch_size"] >= seq).all() and (st["max_seq_len"] <= seq).all()
    # Causal attention of an extend: at least the new tokens' triangle, at most new x (prefix + new).
    ext = st[st["mode"] != "decode"]
    assert (ext["attention_pairs"] >= ext["num_tokens"]).all()
    assert (ext["attention_pairs"] <= ext["num_tokens"] * (ext["prefix_tokens"] + ext["num_tokens"])).all()
    assert st["process_end"].max() == pytest.approx(r.summary["simulated_s"])


def test_requests_and_steps_agree(run):
    """Token times are the moments results were processed; admissions are launches; the
    cache hits of the steps add up to the cached tokens of the requests."""
    _, _, r, *_ = run
    df, st = r.requests, r.steps
    processed = set(st["process_start"].tolist())
    for row in df.itertuples():
        assert set(np.asarray(row.token_times).tolist()) <= processed, f"{row.rid}: a token time is no step's result"
    launched = set(st[st["mode"] != "decode"]["schedule_end"].tolist())
    assert set(df["scheduled"].tolist()) <= launched
    assert st["cache_hit_tokens"].sum() == df["cached_tokens"].sum()
    extend = st[st["mode"] != "decode"]
    assert extend["num_tokens"].sum() == (df["input_tokens"] - df["cached_tokens"]).sum()


# --- the summary, recomputed -------------------------------------------------------------


def _pct(values: np.ndarray) -> dict:
    return {
        "mean": float(np.mean(values)),
        "p50": float(np.percentile(values, 50)),
        "p90": float(np.percentile(values, 90)),
        "p99": float(np.percentile(values, 99)),
    }


def test_summary_matches_numbers_recomputed_from_requests(run):
    _, _, r, _, trace, _ = run
    df, s = r.requests, r.summary
    done = df[df["status"] == "finished"]
    assert s["completed"] == len(done) == len(trace)
    duration = done["finish"].max() - df["arrival"].min()
    assert s["duration_s"] == pytest.approx(duration)
    assert s["request_throughput"] == pytest.approx(len(done) / duration)
    total_out = sum(t.output_len for t in trace.requests)
    assert s["output_throughput"] == pytest.approx(total_out / duration)

    ttft = (done["first_token"] - done["arrival"]).to_numpy() * 1000
    e2e = (done["finish"] - done["arrival"]).to_numpy() * 1000
    multi = done[done["output_tokens"] > 1]
    tpot = ((multi["finish"] - multi["first_token"]) / (multi["output_tokens"] - 1)).to_numpy() * 1000
    itl = np.concatenate([np.diff(np.asarray(tt)) for tt in done["token_times"] if len(tt) > 1]) * 1000
    assert len(itl) == (done["output_tokens"] - 1).sum()
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        for stat, v in _pct(values).items():
            assert s[f"{stat}_{name}_ms"] == pytest.approx(v, rel=1e-9, abs=1e-9), f"{stat}_{name}_ms"
    # No retractions here, so each prompt was admitted once: hit rate = cached / prompt tokens.
    assert s["num_retractions"] == 0
    assert s["cache_hit_rate"] == pytest.approx(df["cached_tokens"].sum() / df["input_tokens"].sum())
    assert 0 < s["cache_hit_rate"] < 1


# --- determinism ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
def test_same_inputs_give_byte_identical_files(trace_file, tmp_path, overlap):
    path, _ = trace_file
    opts = ReplayOptions(policy="random", overlap=overlap, page_size=16, chunked_prefill_size=128, kv_tokens=3000, seed=42)
    replay(str(path), opts, out=tmp_path / "a")
    replay(str(path), opts, out=tmp_path / "b")
    for name in ("run.json", "requests.parquet", "steps.parquet"):
        a, b = (tmp_path / "a" / name).read_bytes(), (tmp_path / "b" / name).read_bytes()
        assert a == b, f"{name} differs between two identical replays"


# --- interruption ----------------------------------------------------------------------------


def _interrupting(after: int):
    seen: list[tuple[int, int]] = []

    def progress(p: ReplayProgress) -> None:
        seen.append((p.done, p.total))
        if p.done >= after:
            raise KeyboardInterrupt

    return progress, seen


@pytest.mark.parametrize("overlap,after", [(True, 10), (False, 10), (False, 1)], ids=["overlap-10", "normal-10", "normal-1"])
def test_interrupted_run_is_marked_incomplete_and_loads(tmp_path, overlap, after):
    # Arrivals all through the run, so that requests still run when the interrupt lands (a
    # decode stretch reports progress once, and finishes every request when nothing arrives).
    trace = _trace(n=120, rate=40.0, seed=5)
    path = tmp_path / "t.json"
    trace.write(path)
    out = tmp_path / "run"
    progress, seen = _interrupting(after=after)
    with pytest.raises(KeyboardInterrupt):
        replay(str(path), ReplayOptions(overlap=overlap), out=out, progress=progress)
    assert seen and all(total == len(trace) for _, total in seen)
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "incomplete"
    r = load_run(out)
    assert r.status == "incomplete"
    df = r.requests
    finished, unfinished = df[df["status"] == "finished"], df[df["status"] == "unfinished"]
    assert len(finished) >= after and len(unfinished) > 0
    # One row per request the scheduler had received when it stopped: none twice, none lost.
    dups = df[df["index"].duplicated(keep=False)]
    assert dups.empty, f"{len(dups)} duplicate rows: {dups[['rid', 'status']].values.tolist()[:6]}"
    assert df["index"].is_monotonic_increasing
    received = df["arrival"].max()
    last_schedule = r.steps["schedule_start"].max()
    t0 = trace.requests[0].arrival_s
    expected = [i for i, t in enumerate(trace.requests) if t.arrival_s - t0 <= last_schedule]
    missing = sorted(set(expected) - set(df["index"]))
    assert not missing, f"requests {missing[:10]} had arrived but have no row"
    assert received <= r.summary["simulated_s"]
    assert (finished["output_tokens"] == [trace.requests[i].output_len for i in finished["index"]]).all()
    assert finished["finish"].notna().all() and unfinished["finish"].isna().all()
    assert (unfinished["output_tokens"] < unfinished["max_new_tokens"]).all()
    assert r.summary["completed"] == len(finished)
    assert r.summary["unfinished"] == len(unfinished)
    assert len(r.steps) == r.summary["num_steps"] > 0


def test_rerun_into_an_interrupted_folder_replaces_it(tmp_path):
    trace = _trace(n=60, rate=200.0, seed=6)
    path = tmp_path / "t.json"
    trace.write(path)
    out = tmp_path / "run"
    progress, _ = _interrupting(after=5)
    with pytest.raises(KeyboardInterrupt):
        replay(str(path), ReplayOptions(), out=out, progress=progress)
    assert load_run(out).status == "incomplete"
    result = replay(str(path), ReplayOptions(), out=out)
    r = load_run(out)
    assert result.status == r.status == "complete"
    assert len(r.requests) == len(trace) and (r.requests["status"] == "finished").all()


def test_progress_reports_every_request_of_a_complete_run(run):
    _, _, r, _, trace, calls = run
    assert calls, "progress was never called"
    assert all(p.total == len(trace) for p in calls)
    dones = [p.done for p in calls]
    assert dones == sorted(dones) and dones[-1] == len(trace)
    # The work behind the finished requests: every prompt and output token of the trace at the end.
    tokens = [p.tokens_done for p in calls]
    assert tokens == sorted(tokens) and tokens[0] == 0
    assert tokens[-1] == calls[-1].tokens_total == sum(t.input_len + t.output_len for t in trace.requests)


# --- options that shape the workload -----------------------------------------------------------


def test_max_requests_and_time_scale(trace_file, tmp_path):
    path, trace = trace_file
    result = replay(str(path), ReplayOptions(max_requests=7, time_scale=3.0), out=tmp_path / "run")
    r = load_run(tmp_path / "run")
    assert result.status == "complete"
    assert len(r.requests) == 7 and r.summary["completed"] == 7
    t0 = trace.requests[0].arrival_s
    assert np.allclose(r.requests["arrival"], [(t.arrival_s - t0) * 3.0 for t in trace.requests[:7]])
