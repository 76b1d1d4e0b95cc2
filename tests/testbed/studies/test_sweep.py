"""`testbed sweep`: the cross product of replay options, one run folder per point, sweep.parquet.

The sweeps run as a user runs them (the CLI in a subprocess, local processes); usage
errors run in-process through testbed.cli.main, which is the same code minus the
interpreter start.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.cli import main
from testbed.errors import ConfigError
from testbed.options import ReplayOptions, recorded_options, resolved_options
from testbed.studies.sweep import GridAxis, load_sweep, parse_grid, point_name
from testbed.traces.gen import GenConfig, generate_trace

REPO = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "testbed.cli"]
N = 30  # requests per replay: every point is a small sim
GRID = ["--grid", "policy=fcfs,lpm", "--grid", "chunked-prefill-size=64,8192", "--grid", "overlap=on,off"]
RUN_FILES = ("run.json", "requests.parquet", "steps.parquet")  # wall.json is what differs between two runs


def _testbed(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sweep_trace") / "t.json"
    # Shared system prompts (the cache matters to lpm), long enough prompts that a 64-token chunk splits them.
    cfg = GenConfig(
        num_requests=N, rate=20.0, input_len="uniform:50,300", output_len="uniform:10,60", system_prompts=2, shared_fraction=0.8
    )
    generate_trace(cfg).write(path)
    return path


@pytest.fixture(scope="module")
def sweep(trace, tmp_path_factory) -> tuple[Path, dict]:
    """The 8-point sweep (policy x chunked-prefill-size x overlap) and its --json output."""
    out = tmp_path_factory.mktemp("sweep") / "s"
    proc = _ok(_testbed("sweep", trace, *GRID, "--max-requests", N, "--seed", 3, "--out", out, "--workers", 2, "--json", "-q"))
    return out, json.loads(proc.stdout)


def _error_line(argv: list[str], capsys) -> str:
    """main(argv) must exit 2 with exactly one line on stderr; returns it."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("testbed: error: "), err
    return lines[0]


@pytest.mark.slow
def test_points_are_the_cross_product_with_their_options(sweep):
    out, printed = sweep
    df, meta = load_sweep(out / "sweep.parquet")
    axes = {"policy": ["fcfs", "lpm"], "chunked_prefill_size": [64, 8192], "overlap": [True, False]}
    assert len(df) == 8 and set(df["status"]) == {"complete"} and df["error"].isna().all()
    assert sorted(zip(df["policy"], df["chunked_prefill_size"], df["overlap"])) == sorted(itertools.product(*axes.values()))
    assert [a["name"] for a in meta["axes"]] == list(axes) and [a["values"] for a in meta["axes"]] == list(axes.values())
    for row in df.to_dict("records"):
        # Every option of the row is the base options (--max-requests, --seed) with the row's axis values.
        expected = recorded_options(
            resolved_options(
                ReplayOptions(
                    max_requests=N, seed=3, policy=row["policy"], chunked_prefill_size=row["chunked_prefill_size"], overlap=row["overlap"]
                )
            )
        )
        assert {k: _none(row[k]) for k in meta["option_columns"]} == expected
        # The metrics are the point's run.json summary.
        run = json.loads((out / row["run_dir"] / "run.json").read_text())
        assert run["status"] == "complete" and run["options"] == expected
        for column, key in meta["metric_columns"].items():
            assert _none(row[column]) == run["summary"][key], column
        assert row["run_dir"] == f"points/{row['point']}"
    # The points differ: chunking and overlap change the timeline.
    assert df["p90_ttft_ms"].nunique() > 1 and df["num_steps"].nunique() > 1
    # --json prints the same rows as the table holds.
    assert [r["point"] for r in printed["points"]] == list(df["point"])
    assert [r["p90_tpot_ms"] for r in printed["points"]] == list(df["p90_tpot_ms"])


def _none(value):
    """pandas reads a missing value of a numeric column as NaN; run.json has None."""
    return None if isinstance(value, float) and value != value else value


def test_a_point_is_the_run_replay_makes_file_for_file(sweep, trace, tmp_path):
    out, _ = sweep
    direct = tmp_path / "direct"
    _ok(
        _testbed(
            "replay",
            trace,
            "--policy",
            "lpm",
            "--chunked-prefill-size",
            64,
            "--no-overlap",
            "--max-requests",
            N,
            "--seed",
            3,
            "--out",
            direct,
            "-q",
        )
    )
    point = out / "points" / "policy=lpm,chunked_prefill_size=64,overlap=off"
    for name in RUN_FILES:
        assert (point / name).read_bytes() == (direct / name).read_bytes(), name


def test_a_failing_point_is_a_row_with_its_error_and_the_others_complete(trace, tmp_path):
    out = tmp_path / "s"
    # A model that loads but does not fit on one H100 (a name that loads nothing is refused up front, exit 2).
    proc = _testbed(
        "sweep", trace, "--grid", "model=llama-3.2-1b,llama-3.1-70b", "--grid", "overlap=on,off", "--max-requests", 20, "--out", out, "-q"
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    df, _ = load_sweep(out)
    assert len(df) == 4
    failed = df[df["model"] == "llama-3.1-70b"]
    assert list(failed["status"]) == ["failed", "failed"]
    assert all("does not fit" in e for e in failed["error"]) and failed["p90_ttft_ms"].isna().all()
    ok = df[df["model"] == "llama-3.2-1b"]
    assert list(ok["status"]) == ["complete", "complete"] and ok["error"].isna().all()
    assert (ok["completed"] == 20).all()
    assert "2 complete, 2 failed" in proc.stdout and "llama-3.1-70b" in proc.stdout


def test_points_whose_options_cannot_run_together_are_skipped_and_the_others_run(trace, tmp_path):
    """lpm is SGLang's: a grid of both policies and both schedulers runs three points and lists
    the fourth as skipped, with why (exit 0: nothing failed)."""
    out = tmp_path / "s"
    proc = _ok(
        _testbed("sweep", trace, "--grid", "policy=fcfs,lpm", "--grid", "scheduler=sglang,vllm", "--max-requests", 10, "--out", out, "-q")
    )
    df, _ = load_sweep(out)
    assert dict(zip(df["point"], df["status"])) == {
        "policy=fcfs,scheduler=sglang": "complete",
        "policy=fcfs,scheduler=vllm": "complete",
        "policy=lpm,scheduler=sglang": "complete",
        "policy=lpm,scheduler=vllm": "skipped",
    }
    skipped = df[df["status"] == "skipped"]
    assert "is SGLang's" in skipped["error"].item() and skipped["p90_ttft_ms"].isna().all()
    assert sorted(p.name for p in (out / "points").iterdir()) == sorted(df.loc[df["status"] == "complete", "point"])
    assert "4 points, 3 complete, 1 skipped, 0 failed" in proc.stdout
    assert "skipped: policy=lpm,scheduler=vllm: --policy lpm is SGLang's" in proc.stdout


@pytest.mark.parametrize(
    "grid, base, needle",
    [
        (["--grid", "policy=fcfs,lpm"], ["--scheduler", "vllm"], "--grid policy=lpm: no point with it can run"),
        (["--grid", "policy=lpm"], ["--scheduler", "vllm"], "--policy lpm is SGLang's"),
    ],
)
def test_a_grid_value_no_point_can_run_with_is_refused(grid, base, needle, trace, tmp_path, capsys):
    line = _error_line(["sweep", str(trace), *grid, *base, "--out", str(tmp_path / "s"), "-q"], capsys)
    assert needle in line
    assert not (tmp_path / "s").exists()


def _walls(out: Path) -> dict[str, bytes]:
    return {p.name: (p / "wall.json").read_bytes() for p in (out / "points").iterdir()}


@pytest.mark.slow
def test_resume_runs_only_the_missing_points(sweep, trace, tmp_path, capsys):
    src, _ = sweep
    out = tmp_path / "s"
    shutil.copytree(src, out)
    before = _walls(out)
    table, _ = load_sweep(out)
    args = ["sweep", trace, *GRID, "--max-requests", N, "--seed", 3, "--out", out, "-q"]

    # Without --resume an earlier sweep is not overwritten.
    line = _error_line(list(map(str, args)), capsys)
    assert "--resume" in line and str(out) in line

    # A finished sweep: nothing runs (every wall.json is the old one), the table is the same.
    proc = _ok(_testbed(*args, "--resume"))
    assert "8 complete (8 resumed), 0 failed" in proc.stdout
    assert _walls(out) == before
    again, _ = load_sweep(out)
    assert again.drop(columns="wall_s").equals(table.drop(columns="wall_s"))

    # One point deleted: only that one runs again, into the same files.
    gone = "policy=fcfs,chunked_prefill_size=8192,overlap=on"
    shutil.rmtree(out / "points" / gone)
    proc = _ok(_testbed(*args, "--resume"))
    assert "8 complete (7 resumed), 0 failed" in proc.stdout
    after = _walls(out)
    assert {k: v for k, v in after.items() if k != gone} == {k: v for k, v in before.items() if k != gone}
    for name in RUN_FILES:
        assert (out / "points" / gone / name).read_bytes() == (src / "points" / gone / name).read_bytes()

    # Other base options are other runs: --resume keeps none of these points.
    proc = _ok(_testbed("sweep", trace, *GRID, "--max-requests", N, "--seed", 4, "--out", out, "-q", "--resume"))
    assert "8 complete, 0 failed" in proc.stdout
    assert {json.loads((p / "run.json").read_text())["options"]["seed"] for p in (out / "points").iterdir()} == {4}


@pytest.mark.parametrize(
    "grid, needle",
    [
        ("polcy=fcfs,lpm", "polcy"),
        ("chunked-prefill-size=abc", "chunked-prefill-size=abc"),
        ("overlap=maybe", "overlap=maybe"),
        ("policy=fcfs,nope", "policy=nope"),
        ("page_size=0", "page_size=0"),
        ("policy", "--grid policy"),
        ("policy=fcfs,,lpm", "policy"),
        ("policy=fcfs,fcfs", "fcfs"),
    ],
)
def test_bad_grid_exits_2_naming_axis_and_value(grid, needle, trace, tmp_path, capsys):
    line = _error_line(["sweep", str(trace), "--grid", grid, "--out", str(tmp_path / "s"), "-q"], capsys)
    assert needle in line
    assert not (tmp_path / "s").exists()  # nothing ran


def test_same_axis_twice_is_refused(trace, tmp_path, capsys):
    line = _error_line(["sweep", str(trace), "--grid", "policy=fcfs", "--grid", "policy=lpm", "--out", str(tmp_path / "s")], capsys)
    assert "policy" in line and "twice" in line


def test_grid_values_take_each_option_type_and_both_spellings():
    axes = parse_grid(
        [
            "chunked-prefill-size=2048,-1",
            "overlap=On,false",
            "kv_tokens=none,100000",
            "time-scale=0.5,2",
            "policy=lpm",
            "disable-radix-cache=true",
        ]
    )
    assert axes == [
        GridAxis("chunked_prefill_size", (2048, -1)),
        GridAxis("overlap", (True, False)),
        GridAxis("kv_tokens", (None, 100000)),
        GridAxis("time_scale", (0.5, 2.0)),
        GridAxis("policy", ("lpm",)),
        GridAxis("disable_radix_cache", (True,)),
    ]


def test_overlap_off_and_false_are_the_same_value():
    with pytest.raises(ConfigError, match="overlap=on,off,false: value 'false' of overlap is listed twice"):
        parse_grid(["overlap=on,off,false"])


def test_point_names_are_the_axis_values_and_safe_as_folder_names():
    assert point_name([("policy", "lpm"), ("overlap", False), ("time_scale", 2.0), ("kv_tokens", None)]) == (
        "policy=lpm,overlap=off,time_scale=2,kv_tokens=none"
    )
    assert point_name([]) == "base"
    a, b = point_name([("model", "/models/a/b")]), point_name([("model", "/models/a_b")])
    assert "/" not in a and a != b
