"""The dashboard's pure parts on run folders made here: the runs index, latency samples,
downsampling, figures, the Perfetto timeline, the compare table, What-if grids, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from dashboard_helpers import BROKEN, INCOMPLETE, NOT_A_RUN, RETRACT, RUNS, make_runs, make_trace, status, summary

from dashboard import charts
from dashboard.compare_table import compare_frame, rel_err_column
from dashboard.downsample import MAX_POINTS, cdf_points, step_series
from dashboard.latency import latencies_ms, latency_cdfs
from dashboard.runs_index import ERROR_STATUS, HEADLINE_KEYS, comparable_pair, display_frame, filter_runs, scan_runs
from dashboard.timeline import INTERVALS, intervals, overlap_stats, trace_events, trace_json
from dashboard.whatif import WhatIfGrid, parse_values, run_variants, split_runnable, variants
from testbed.options import ReplayOptions
from testbed.runs.cli import fmt_rel_err
from testbed.runs.compare import METRIC_KEYS, STATS, compare_runs
from testbed.runs.folder import load_run
from testbed.runs.metrics import LATENCIES

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("dash")
    return make_runs(d / "runs", make_trace(d / "trace.json"))


@pytest.fixture(scope="module")
def index(runs) -> pd.DataFrame:
    return scan_runs(runs["sim-fcfs"].parent)


# --- the runs index ----------------------------------------------------------------------


def test_index_lists_every_folder_with_run_json_numbers(runs, index):
    assert sorted(index["name"]) == sorted(runs)
    for name in [*RUNS, RETRACT, INCOMPLETE]:
        row = index[index["name"] == name].iloc[0]
        s = summary(runs[name])
        for key in HEADLINE_KEYS:
            assert row[key] == s[key], (name, key)
        assert row["status"] == status(runs[name])
        assert row["error"] is None or pd.isna(row["error"])
    fcfs = index[index["name"] == "sim-fcfs"].iloc[0]
    assert (fcfs["mode"], fcfs["policy"], fcfs["model"], fcfs["hardware"]) == ("sim", "fcfs", "llama-3.1-8b", "h100")
    assert bool(fcfs["overlap"]) is True
    assert fcfs["kv_tokens"] == summary(runs["sim-fcfs"])["kv_tokens"]
    assert not bool(index[index["name"] == "sim-no-overlap"].iloc[0]["overlap"])


def test_index_marks_incomplete_and_lists_broken_folders_with_their_error(index):
    by_name = index.set_index("name")
    assert by_name.loc[INCOMPLETE, "status"] == "incomplete"
    assert by_name.loc[BROKEN, "status"] == ERROR_STATUS
    assert "bad JSON" in by_name.loc[BROKEN, "error"] and "run.json" in by_name.loc[BROKEN, "error"]
    assert by_name.loc[NOT_A_RUN, "status"] == ERROR_STATUS
    assert "not a run folder" in by_name.loc[NOT_A_RUN, "error"]
    # The rest still shows, with its numbers.
    assert by_name.loc["sim-lpm", "completed"] == 50


def test_index_catches_a_truncated_table_and_a_missing_dir(tmp_path, runs):
    import shutil

    bad = tmp_path / "truncated"
    shutil.copytree(runs["sim-fcfs"], bad)
    data = (bad / "steps.parquet").read_bytes()
    (bad / "steps.parquet").write_bytes(data[: len(data) // 2])
    row = scan_runs(tmp_path).iloc[0]
    assert row["status"] == ERROR_STATUS and "steps.parquet" in row["error"]
    assert scan_runs(tmp_path / "nowhere").empty


def test_index_finds_nested_run_folders(tmp_path, runs):
    import shutil

    shutil.copytree(runs["sim-lpm"], tmp_path / "sweep-1" / "point-a")
    index = scan_runs(tmp_path)
    assert list(index["name"]) == ["sweep-1/point-a"]
    assert index["status"].iloc[0] == "complete"


def test_a_folder_of_cost_profiles_is_not_listed_as_a_broken_run(tmp_path, runs):
    """`testbed calibrate` writes profiles under runs/profiles/ by default: the index leaves that folder
    out quietly, while a folder that lost its run.json is still listed with its error."""
    import shutil

    shutil.copytree(runs["sim-lpm"], tmp_path / "a-run")
    (tmp_path / "profiles").mkdir()
    shutil.copy(REPO / "profiles" / "h100_sxm-sglang-llama-3.1-8b-tp1.json", tmp_path / "profiles")
    (tmp_path / "lost").mkdir()
    (tmp_path / "lost" / "requests.parquet").write_bytes(b"")
    index = scan_runs(tmp_path)
    assert sorted(index["name"]) == ["a-run", "lost"]
    assert index.set_index("name").loc["lost", "status"] == "error"


def test_filter_and_display(index):
    assert list(filter_runs(index, "LPM")["name"]) == ["sim-lpm"]
    assert set(filter_runs(index, status=["incomplete"])["name"]) == {INCOMPLETE}
    assert set(filter_runs(index, "bad json")["name"]) == {BROKEN}
    shown = display_frame(index)
    assert "path" not in shown.columns and "TTFT mean (ms)" in shown.columns
    assert "profile" not in shown.columns and "profile" in display_frame(index, drop_empty=False).columns  # no run has one
    pd.testing.assert_series_equal(shown["TTFT mean (ms)"], index["mean_ttft_ms"], check_names=False)


# --- latency samples, downsampling ----------------------------------------------------------


@pytest.mark.parametrize("name", ["sim-fcfs", RETRACT, INCOMPLETE])
def test_latency_samples_give_run_json_percentiles(runs, name):
    lat = latencies_ms(load_run(runs[name]).requests)
    s = summary(runs[name])
    for metric in LATENCIES:
        assert np.mean(lat[metric]) == pytest.approx(s[f"mean_{metric}_ms"], rel=1e-9)
        for stat in STATS[1:]:
            assert np.percentile(lat[metric], int(stat[1:])) == pytest.approx(s[f"{stat}_{metric}_ms"], rel=1e-9)


def test_cdf_points_lie_on_the_empirical_cdf():
    rng = np.random.default_rng(0)
    values = np.round(rng.lognormal(size=100_000), 2)  # rounding makes ties
    x, p = cdf_points(values, max_points=500)
    assert len(x) <= 500 and x[0] == values.min() and x[-1] == values.max() and p[-1] == 1.0
    assert np.all(np.diff(x) >= 0) and np.all(np.diff(p) >= 0)
    for xi, pi in zip(x[::50], p[::50]):
        assert pi == np.mean(values <= xi)
    small_x, small_p = cdf_points(np.array([3.0, 1.0, 2.0]))
    assert small_x.tolist() == [1.0, 2.0, 3.0] and small_p.tolist() == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_step_series_bins_long_runs_and_keeps_peaks():
    n = 150_000  # about a whole Mooncake run
    t = np.sort(np.random.default_rng(1).uniform(0, 8000, n))
    queue = np.zeros(n, dtype=np.int64)
    queue[77_777] = 999
    df = pd.DataFrame({"t": t, "queue": queue, "tokens": np.ones(n)})
    out = step_series(df, "t", {"queue": "max", "tokens": "sum"}, max_points=2000)
    assert len(out) <= 2000
    assert out["queue"].max() == 999 and out["tokens"].sum() == n
    assert out["time"].is_monotonic_increasing
    short = step_series(df.iloc[:100], "t", {"queue": "max"}, max_points=2000)
    assert short["time"].tolist() == t[:100].tolist()


def test_kv_chart_never_stacks_above_the_pool_on_a_long_run():
    """A long run's KV chart is binned: used and evictable come from the same step (the one whose
    sum peaks in the bin), so the stack is a pool state that happened, never more than the pool."""
    pool, n = 10_000, 50_000
    rng = np.random.default_rng(2)
    used = rng.integers(0, pool, n)
    cached = rng.integers(0, pool - used + 1)  # every step: used + cached <= pool, each swinging over it all
    steps = pd.DataFrame(
        {
            "schedule_start": np.arange(n) * 0.01,
            "kv_used_tokens": used,
            "kv_cached_tokens": cached,
            "mode": "decode",
            "num_tokens": 1,
            "cache_hit_tokens": 0,
        }
    )
    fig = charts.kv_figure(steps, pool)
    stacked = {t.name: np.asarray(t.y, dtype=float) for t in fig.data if t.name in ("KV used", "KV evictable cache")}
    assert 0 < len(stacked["KV used"]) <= MAX_POINTS
    assert (stacked["KV used"] + stacked["KV evictable cache"]).max() <= pool
    # Each drawn pair is a step of the run, the fullest of its bin.
    pairs = set(zip(used.tolist(), cached.tolist()))
    assert all((u, c) in pairs for u, c in zip(stacked["KV used"], stacked["KV evictable cache"]))
    assert (stacked["KV used"] + stacked["KV evictable cache"]).max() == (used + cached).max()


# --- figures --------------------------------------------------------------------------------


def _names(fig) -> set[str]:
    return {trace.name for trace in fig.data}


def test_figures_of_a_run(runs):
    run = load_run(runs["sim-fcfs"])
    cdfs = latency_cdfs(run.requests)
    cdf = charts.latency_cdf_figure({"a": cdfs, "b": cdfs})
    assert len(cdf.data) == 8 and _names(cdf) == {"a", "b"}
    assert max(cdf.data[0].y) == 1.0
    bars = charts.percentile_bars_figure({"a": run.summary})
    assert list(bars.data[0].y) == [run.summary[f"{s}_ttft_ms"] for s in STATS]
    assert _names(charts.throughput_queue_figure(run.requests, run.steps)) == {"output tok/s", "finished req/s", "running", "waiting"}
    batch = charts.batch_figure(run.steps)
    assert _names(batch) == {"prefill tokens", "decode tokens", "batch size"}
    # Step by step for a short run: the tokens drawn are the tokens computed.
    assert sum(batch.data[0].y) + sum(batch.data[1].y) == run.steps["num_tokens"].sum()
    assert {"KV used", "cumulative hit rate"} <= _names(charts.kv_figure(run.steps, run.summary["kv_tokens"]))
    window = run.steps.iloc[:40]
    tl = {t.name: t for t in charts.timeline_figure(intervals(window)).data}
    assert {n: len(tl[n].base) for n in ("schedule", "launch", "process")} == {"schedule": 40, "launch": 40, "process": 40}
    assert len(tl["forward (extend)"].base) == (window["mode"] == "extend").sum() > 0
    assert len(tl["forward (decode)"].base) == (window["mode"] == "decode").sum() > 0
    assert set(tl["forward (decode)"].y) == {"device"} and set(tl["schedule"].y) == {"CPU"}
    np.testing.assert_allclose(np.asarray(tl["schedule"].base, dtype=float), window["schedule_start"] * 1000)


def test_cumulative_cache_hit_rate_ends_at_run_json(runs):
    for name in ("sim-fcfs", RETRACT):
        hits = charts.cache_hit_series(load_run(runs[name]).steps)
        assert hits["cumulative_hit_rate"].iloc[-1] == pytest.approx(summary(runs[name])["cache_hit_rate"], rel=1e-12)


def test_retraction_figure_counts_every_retraction(runs):
    run = load_run(runs[RETRACT])
    assert run.summary["num_retractions"] > 0
    fig = charts.retraction_figure(run.steps)
    assert sum(fig.data[0].y) == run.summary["num_retractions"]
    assert fig.data[1].y[-1] == run.summary["num_retractions"]


# --- the timeline -----------------------------------------------------------------------------


def test_perfetto_json_has_one_event_per_interval_in_microseconds(runs):
    steps = load_run(runs["sim-fcfs"]).steps
    doc = json.loads(trace_json(steps, "sim-fcfs"))
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(INTERVALS) * len(steps)
    for name, _lane in INTERVALS:
        label = (lambda e: e["name"].startswith("forward")) if name == "device" else (lambda e, n=name: e["name"] == n)
        mine = sorted((e for e in events if label(e)), key=lambda e: e["args"]["step"])
        assert [e["args"]["step"] for e in mine] == steps["step"].tolist()
        np.testing.assert_allclose([e["ts"] for e in mine], steps[f"{name}_start"] * 1e6)
        np.testing.assert_allclose([e["dur"] for e in mine], (steps[f"{name}_end"] - steps[f"{name}_start"]) * 1e6, atol=1e-6)
    lanes = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert lanes == {"CPU", "device"}
    assert trace_events(steps.iloc[:0])["traceEvents"][0]["ph"] == "M"


def test_overlap_shows_as_cpu_work_while_the_device_runs(runs):
    on = overlap_stats(load_run(runs["sim-fcfs"]).steps)
    off = overlap_stats(load_run(runs["sim-no-overlap"]).steps)
    assert on.cpu_hidden_fraction > 0.5
    assert off.cpu_hidden_fraction == pytest.approx(0.0, abs=1e-9)
    assert 0 < off.device_busy_fraction <= on.device_busy_fraction <= 1.0 + 1e-9


# --- compare --------------------------------------------------------------------------------


def test_compare_table_is_testbed_compare(runs):
    a, b, c = (load_run(runs[n]) for n in ("sim-fcfs", "sim-no-overlap", "sim-lpm"))
    table = compare_frame(a, [b, c], ["A", "B", "C"])
    assert list(table.index) == list(METRIC_KEYS)
    for label, other in (("B", b), ("C", c)):
        rows = compare_runs(a, other)
        assert table[label].tolist() == [r.b for r in rows]
        assert table[rel_err_column(label)].tolist() == [fmt_rel_err(r.rel_err) for r in rows]
    assert table["A"].tolist() == [r.a for r in compare_runs(a, b)]
    assert table.loc["mean_ttft_ms", "metric"] == "TTFT mean (ms)"
    # Overlap changes the numbers: the table is not all zeros.
    assert any(e not in ("+0.0%", "-0.0%", "-") for e in table[rel_err_column("B")])


# --- what-if --------------------------------------------------------------------------------


def test_whatif_grid_is_every_combination():
    grid = WhatIfGrid(policies=("fcfs", "lpm"), chunk_sizes=(8192, 512), load_scales=(1.0, 2.0))
    vs = variants(ReplayOptions(max_requests=5), grid)
    assert len(vs) == grid.size() == 8
    assert len({v.label for v in vs}) == 8
    assert vs[-1].label == "lpm, chunk 512, load x2"
    assert vs[-1].opts.time_scale == 0.5 and vs[-1].opts.mode == "sim" and vs[-1].opts.max_requests == 5
    profiled = variants(ReplayOptions(), WhatIfGrid(profiles=(None, str(REPO / "profiles/cpu-tiny-llama.json"))))
    assert [v.opts.model for v in profiled] == [None, "tiny-llama"]
    assert parse_values("8192, 2048 512", int) == (8192, 2048, 512)
    assert parse_values(" ", int, None) == (None,) and parse_values("default,100", int) == (None, 100)
    with pytest.raises(ValueError, match="x12"):
        parse_values("1, x12", int)


def test_whatif_grid_of_both_schedulers_skips_what_vllm_has_not():
    """lpm is SGLang's: in a grid of both policies and both schedulers, lpm with vLLM is skipped
    with why, and the others run; vLLM's prefills are chunked to its step token budget."""
    grid = WhatIfGrid(policies=("fcfs", "lpm"), schedulers=("sglang", "vllm"), chunk_sizes=(512,))
    todo, skipped = split_runnable(variants(ReplayOptions(), grid))
    assert [v.label for v in todo] == ["fcfs, sglang", "fcfs, vllm", "lpm, sglang"]
    assert [(v.label, "is SGLang's" in why) for v, why in skipped] == [("lpm, vllm", True)]
    sglang, vllm = todo[0].opts, todo[1].opts
    assert (sglang.scheduler, sglang.chunked_prefill_size, sglang.max_num_batched_tokens) == ("sglang", 512, None)
    assert (vllm.scheduler, vllm.chunked_prefill_size, vllm.max_num_batched_tokens) == ("vllm", ReplayOptions().chunked_prefill_size, 512)


@pytest.mark.slow
def test_whatif_runs_land_as_run_folders(tmp_path, runs):
    trace = str(runs["sim-fcfs"].parent.parent / "trace.json")
    todo = variants(ReplayOptions(max_requests=20), WhatIfGrid(policies=("fcfs", "lof"), page_sizes=(1, 0)))
    calls = []
    results = run_variants(trace, todo, tmp_path, progress=lambda i, n, done, total: calls.append((i, n, done, total)))
    assert len(results) == 4
    ok = [r for r in results if r.error is None]
    bad = [r for r in results if r.error is not None]
    assert len(ok) == 2 and len(bad) == 2  # page size 0 is refused before the replay starts; the others still run
    assert all("page_size" in r.error and r.run_dir is None for r in bad)
    index = scan_runs(tmp_path).set_index("path")
    for r in ok:
        assert status(r.run_dir) == "complete" and summary(r.run_dir)["completed"] == 20
        assert index.loc[str(r.run_dir), "policy"] == r.variant.opts.policy
    assert {i for i, *_ in calls} >= {0, 2} and all(n == 4 and total == 20 for _, n, _, total in calls)


def test_compare_opens_on_the_newest_complete_real_run_and_a_sim_of_the_same_workload():
    def row(name, mode, status="complete", model="tiny-llama", policy="fcfs", trace="t1", time_scale=1.0):
        return {
            "name": name,
            "mode": mode,
            "status": status,
            "model": model,
            "policy": policy,
            "trace_sha256": trace,
            "overlap": False,
            "chunked_prefill_size": 8192,
            "page_size": 1,
            "kv_tokens": 4096,
            "time_scale": time_scale,
            "max_requests": None,
        }

    index = pd.DataFrame(
        [  # newest first, as scan_runs sorts it
            row("real-killed", "real", status="incomplete"),
            row("sim-other-model", "sim", model="llama-3.1-8b"),
            row("sim-other-policy", "sim", policy="lpm"),
            row("sim-other-trace", "sim", trace="t2"),
            row("real-ok", "real"),
            row("sim-same", "sim"),
            row("sim-same-older", "sim"),
        ]
    )
    assert comparable_pair(index) == ["real-ok", "sim-same"]
    # No sim of the same options: the real run and the newest sim of the same trace, model and load.
    assert comparable_pair(index[~index["name"].str.startswith("sim-same")]) == ["real-ok", "sim-other-policy"]
    # An imported run is measured too; a capacity point (another load) is not its pair.
    index = pd.DataFrame([row("capacity-x2", "sim", time_scale=0.5), row("imported", "imported"), row("sim-lpm", "sim", policy="lpm")])
    assert comparable_pair(index) == ["imported", "sim-lpm"]
    # Nothing shares a trace, model and load: nothing is picked (the page asks).
    index = pd.DataFrame([row("real", "real"), row("capacity-x2", "sim", time_scale=0.5), row("other", "sim", trace="t2")])
    assert comparable_pair(index) == []
