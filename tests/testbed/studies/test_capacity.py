"""`testbed capacity`: the highest rate (the trace's arrivals scaled) that meets every SLO.

The found rate is checked the way a user would: replaying the trace at it meets the SLOs,
replaying at the failing rate just above it (within the resolution) does not.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.cli import main
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.studies.capacity import MAX_MULTIPLIER, MIN_MULTIPLIER, SLO_KEYS
from testbed.studies.sweep import load_sweep
from testbed.traces.gen import GenConfig, generate_trace

REPO = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "testbed.cli"]
N = 40


def _capacity(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([*CLI, "capacity", *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("capacity_trace") / "t.json"
    cfg = GenConfig(
        num_requests=N, rate=10.0, input_len="uniform:50,300", output_len="uniform:10,60", system_prompts=2, shared_fraction=0.8
    )
    generate_trace(cfg).write(path)
    return path


@pytest.fixture(scope="module")
def limit(trace, tmp_path_factory) -> float:
    """A p90 TTFT bound twice what the trace gets at its own rate: met at x1, missed once
    requests queue (so the test does not hang on the cost model's absolute numbers)."""
    r = replay(str(trace), ReplayOptions(), out=tmp_path_factory.mktemp("x1") / "run")
    return 2 * r.summary["p90_ttft_ms"]


@pytest.mark.slow
def test_found_rate_passes_and_the_next_tested_rate_fails(trace, limit, tmp_path):
    out = tmp_path / "cap"
    proc = _capacity(trace, "--slo", f"p90_ttft_ms={limit}", "--slo", "p90_tpot_ms=1000", "--resolution", 0.1, "--out", out, "--json", "-q")
    report = json.loads(proc.stdout)
    [c] = report["configs"]
    assert c["status"] == "found", c["message"]
    m, m_fail = c["multiplier"], c["fail_multiplier"]
    assert m_fail > m and c["resolution"] == pytest.approx(m_fail / m - 1) and c["resolution"] <= 0.1
    # The rate is the trace's own (N - 1 gaps over its arrival span) times the multiplier.
    arrivals = [r["arrival"] for r in json.loads(trace.read_text())["requests"]]
    assert report["trace_rate"] == pytest.approx((N - 1) / (arrivals[-1] - arrivals[0]))
    assert c["rate"] == pytest.approx(m * report["trace_rate"])

    # Replay at both rates, as `testbed replay --time-scale 1/m` would.
    at = replay(str(trace), ReplayOptions(time_scale=1 / m), out=tmp_path / "at").summary
    above = replay(str(trace), ReplayOptions(time_scale=1 / m_fail), out=tmp_path / "above").summary
    assert at["p90_ttft_ms"] <= limit and at["p90_tpot_ms"] <= 1000
    assert above["p90_ttft_ms"] > limit
    assert c["summary"] == at  # the metrics reported at the capacity are that run's

    # Every tested rate is kept: a run folder and a row, x1 first, doubling until one fails.
    probes = c["probes"]
    assert c["sims"] == len(probes) == len(list((out / "points").iterdir()))
    assert probes[0]["multiplier"] == 1 and probes[0]["status"] == "pass"
    df, meta = load_sweep(out)
    assert sorted(df["point"]) == sorted(p["point"] for p in probes)
    assert sorted(df["time_scale"]) == sorted(1 / p["multiplier"] for p in probes)
    assert "time_scale" in meta["axis_columns"]
    assert json.loads((out / "capacity.json").read_text()) == report


@pytest.mark.slow
def test_table_output_prints_every_tested_rate_and_the_capacity(trace, limit, tmp_path):
    proc = _capacity(trace, "--slo", f"p90_ttft_ms={limit}", "--resolution", 0.2, "--out", tmp_path / "cap", "-q")
    report = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    [c] = report["configs"]
    tested = [line for line in proc.stdout.splitlines() if line.startswith("  x")]
    assert len(tested) == c["sims"]
    assert sum(" pass " in line for line in tested) + sum(" fail " in line for line in tested) == c["sims"]
    assert f"capacity {c['rate']:.4g} req/s offered, served {c['summary']['request_throughput']:.4g}" in proc.stdout
    assert "p90_ttft_ms" in proc.stdout and "TTFT" in proc.stdout  # the summary at the capacity


@pytest.mark.slow
def test_no_rate_meets_the_slo(trace, tmp_path):
    proc = _capacity(trace, "--slo", "p90_ttft_ms=0.001", "--out", tmp_path / "cap", "-q")
    assert "meets no SLO even at" in proc.stdout
    [c] = json.loads((tmp_path / "cap" / "capacity.json").read_text())["configs"]
    assert c["status"] == "none" and c["multiplier"] is None and c["rate"] is None
    # Halved from x1 down to the lowest multiplier, failing each time.
    assert [p["multiplier"] for p in c["probes"]] == [2.0**-k for k in range(7)]
    assert c["probes"][-1]["multiplier"] == MIN_MULTIPLIER
    assert {p["status"] for p in c["probes"]} == {"fail"}
    assert f"{c['probes'][-1]['rate']:.4g} req/s" in proc.stdout


@pytest.mark.slow
def test_grid_ranks_the_configs_by_capacity(trace, limit, tmp_path):
    proc = _capacity(
        trace,
        "--slo",
        f"p90_ttft_ms={limit}",
        "--grid",
        "max-running-requests=1,none",
        "--resolution",
        0.2,
        "--out",
        tmp_path / "cap",
        "-q",
        "--workers",
        2,
    )
    configs = json.loads((tmp_path / "cap" / "capacity.json").read_text())["configs"]
    assert [c["axes"]["max_running_requests"] for c in configs] == [None, 1]  # one running request serves less
    assert configs[0]["status"] == "found" and configs[0]["rate"] > (configs[1]["rate"] or 0)
    # One search per config, each with its own tested rates.
    assert all(
        p["point"].startswith(f"max_running_requests={'none' if c['axes']['max_running_requests'] is None else 1},rate=x")
        for c in configs
        for p in c["probes"]
    )
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("rank "))
    assert lines[header + 2].split()[:2] == ["1", "none"] and lines[header + 3].split()[1] == "1"
    # sweep.parquet lists the tested rates round by round, the configs in grid order within a
    # round (not in the order two workers happened to finish them): the same search, the same table.
    points = list(load_sweep(tmp_path / "cap")[0]["point"])
    by_config = {c["axes"]["max_running_requests"]: [p["point"] for p in c["probes"]] for c in configs}
    rounds = itertools.zip_longest(by_config[1], by_config[None])
    assert points == [p for pair in rounds for p in pair if p is not None]


@pytest.mark.slow
def test_each_config_scales_its_own_arrivals_and_a_rate_above_the_range_says_so(trace, tmp_path):
    # --max-requests changes the trace a config sees, and so its x1 rate.
    proc = _capacity(trace, "--slo", "p99_e2e_ms=1e9", "--grid", "max-requests=10,40", "--out", tmp_path / "cap", "-q")
    configs = json.loads((tmp_path / "cap" / "capacity.json").read_text())["configs"]
    arrivals = [r["arrival"] for r in json.loads(trace.read_text())["requests"]]
    for c in configs:
        n = c["axes"]["max_requests"]
        assert c["trace_rate"] == pytest.approx((n - 1) / (arrivals[n - 1] - arrivals[0]))
        # Every rate passes: doubled up to the highest multiplier, and said to be a lower bound.
        assert c["status"] == "above_range" and c["multiplier"] == MAX_MULTIPLIER and c["fail_multiplier"] is None
        assert [p["multiplier"] for p in c["probes"]] == [2.0**k for k in range(7)]
        assert c["rate"] == pytest.approx(MAX_MULTIPLIER * c["trace_rate"])
    assert proc.stdout.count("meets the SLOs even at") == 2 and "(or more)" in proc.stdout


def _error_line(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("testbed: error: "), err
    return lines[0]


@pytest.mark.parametrize(
    "slo, needles",
    [
        ("p90_ttfx_ms=500", ["p90_ttfx_ms", *SLO_KEYS]),
        ("request_throughput=5", ["request_throughput", "p90_ttft_ms"]),
        ("p90_ttft_ms=fast", ["p90_ttft_ms=fast", "not a number"]),
        ("p90_ttft_ms=-1", ["p90_ttft_ms=-1", "positive"]),
        ("p90_ttft_ms", ["--slo p90_ttft_ms", "KEY=VALUE"]),
    ],
)
def test_bad_slo_exits_2_naming_it(slo, needles, trace, tmp_path, capsys):
    line = _error_line(["capacity", str(trace), "--slo", slo, "--out", str(tmp_path / "cap")], capsys)
    for needle in needles:
        assert needle in line
    assert not (tmp_path / "cap").exists()


def test_capacity_refuses_a_time_scale_it_would_override(trace, tmp_path, capsys):
    line = _error_line(["capacity", str(trace), "--slo", "p90_ttft_ms=50", "--time-scale", "2", "--out", str(tmp_path / "c")], capsys)
    assert "--time-scale" in line
    line = _error_line(
        ["capacity", str(trace), "--slo", "p90_ttft_ms=50", "--grid", "time_scale=1,2", "--out", str(tmp_path / "c")], capsys
    )
    assert "time_scale" in line
    line = _error_line(["capacity", str(trace), "--slo", "p90_ttft_ms=50", "--resolution", "0", "--out", str(tmp_path / "c")], capsys)
    assert "--resolution" in line


@pytest.mark.slow
def test_fewest_replicas_that_hold_the_slo_at_the_trace_rate(trace, limit, tmp_path):
    # At 15x the trace's rate one instance queues past the bound; more replicas share the load.
    heavy = tmp_path / "heavy.json"
    generate_trace(
        GenConfig(num_requests=N, rate=150.0, input_len="uniform:50,300", output_len="uniform:10,60", system_prompts=2, shared_fraction=0.8)
    ).write(heavy)
    proc = _capacity(
        heavy, "--slo", f"p90_ttft_ms={limit}", "--grid", "replicas=1,2,4", "--resolution", 0.2, "--out", tmp_path / "cap", "-q"
    )
    report = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    by_replicas = {c["axes"]["replicas"]: c["multiplier"] for c in report["configs"]}
    holding = sorted(n for n, m in by_replicas.items() if m is not None and m >= 1.0)
    assert holding and holding[0] > 1, by_replicas  # one instance does not hold at 15x; some number does
    (fewest,) = report["fewest_replicas"]
    assert fewest == {"axes": {}, "replicas": holding[0], "most_tried": 4}
    assert f"fewest replicas that meet the SLOs at the trace's rate (x1): {holding[0]} replicas" in proc.stdout


def test_a_gpu_budget_keeps_the_splits_of_it(trace, tmp_path):
    from testbed.studies.capacity import plan_capacity
    from testbed.studies.sweep import parse_grid

    axes = parse_grid(["prefill-replicas=1,2,3", "decode-replicas=1,2,3"])
    sweep = plan_capacity(str(trace), ReplayOptions(), axes, tmp_path / "cap", gpus=4)
    runnable = [dict(p.axes) for p in sweep.points if p.name not in sweep.skipped]
    assert runnable == [
        {"prefill_replicas": 1, "decode_replicas": 3},
        {"prefill_replicas": 2, "decode_replicas": 2},
        {"prefill_replicas": 3, "decode_replicas": 1},
    ]
    assert len(sweep.skipped) == 6
    assert sweep.skipped["prefill_replicas=3,decode_replicas=3"] == "it uses 6 GPUs, not the --gpus budget of 4"
