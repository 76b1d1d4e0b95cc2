"""`testbed compare`: metrics of two real run folders (made by sim replays) side by side.

The CLI runs in a subprocess once testbed/cli.py registers `compare`; until then the
handler runs in-process behind a parser built with runs_cli.register.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd
import pytest

from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs import cli as runs_cli
from testbed.runs.compare import METRIC_KEYS, compare_runs, differences, rel_err
from testbed.runs.folder import load_run
from testbed.traces.gen import GenConfig, generate_trace

REPO = Path(__file__).resolve().parents[3]
# Shared system prompts, so that the cache hit rate is above 0.
SMALL = {
    "num_requests": 40,
    "rate": 20.0,
    "input_len": "uniform:50,300",
    "output_len": "uniform:10,60",
    "system_prompts": 2,
    "shared_fraction": 0.8,
}


def _cli_has_compare() -> bool:
    from testbed.cli import build_parser

    actions = build_parser()._actions
    return any(isinstance(a, argparse._SubParsersAction) and "compare" in a.choices for a in actions)


def _compare(*args) -> tuple[int, str, str]:
    """`testbed compare ARGS...` -> (exit code, stdout, stderr)."""
    argv = ["compare", *map(str, args)]
    if _cli_has_compare():
        p = subprocess.run([sys.executable, "-m", "testbed.cli", *argv], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
        return p.returncode, p.stdout, p.stderr
    parser = argparse.ArgumentParser(prog="testbed")
    runs_cli.register(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = ns.func(ns)
    return rc, out.getvalue(), err.getvalue()


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())["summary"]


def _edit_meta(src: Path, dst: Path, edit) -> Path:
    """A copy of run folder src whose run.json went through edit(meta)."""
    shutil.copytree(src, dst)
    meta = json.loads((dst / "run.json").read_text())
    edit(meta)
    (dst / "run.json").write_text(json.dumps(meta))
    return dst


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("compare")
    t1, t2 = d / "t1.json", d / "t2.json"
    generate_trace(GenConfig(**SMALL, seed=1)).write(t1)
    generate_trace(GenConfig(**SMALL, seed=2)).write(t2)
    out = {"t1": t1, "t2": t2}
    for name, trace, opts in (
        ("base", t1, ReplayOptions()),
        ("again", t1, ReplayOptions()),
        ("no_overlap", t1, ReplayOptions(overlap=False)),
        ("other_trace", t2, ReplayOptions()),
        ("h200_kv", t1, ReplayOptions(hardware="h200", kv_tokens=100_000, mem_fraction_static=0.5)),
        ("h100_kv", t1, ReplayOptions(kv_tokens=100_000)),
    ):
        out[name] = replay(str(trace), opts, out=d / name).run_dir

    def interrupt(p) -> None:
        if p.done >= 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replay(str(t1), ReplayOptions(), out=d / "incomplete", progress=interrupt)
    out["incomplete"] = d / "incomplete"
    return out


def test_same_run_with_itself_and_a_rerun_is_exact(runs):
    a = load_run(runs["base"])
    for b in (a, load_run(runs["again"])):
        assert differences(a, b) == []
        rows = compare_runs(a, b)
        assert [r.name for r in rows] == list(METRIC_KEYS) and len(rows) == 21
        assert all(r.rel_err == 0 for r in rows), [r for r in rows if r.rel_err != 0]
    rc, out, err = _compare(runs["base"], runs["again"])
    assert rc == 0, err
    rel = [line.split()[-1] for line in out.splitlines() if line.startswith("  ")]
    assert len(rel) == 16 and set(rel) == {"+0.0%"}


def test_overlap_on_off_refused_naming_overlap(runs):
    rc, out, err = _compare(runs["base"], runs["no_overlap"])
    assert rc == 2 and out == ""
    lines = err.splitlines()
    assert lines[0] == "testbed compare: runs differ:"
    assert any("overlap" in line for line in lines[1:-1])
    assert "--force" in lines[-1] and "Traceback" not in err


def test_different_traces_refused_naming_both_paths(runs):
    rc, _, err = _compare(runs["base"], runs["other_trace"])
    assert rc == 2
    trace_lines = [line for line in err.splitlines() if "trace" in line and "sha256" in line]
    assert len(trace_lines) == 1
    assert str(runs["t1"]) in trace_lines[0] and str(runs["t2"]) in trace_lines[0]


def test_force_json_has_the_differences_and_the_summaries(runs):
    rc, out, err = _compare(runs["base"], runs["no_overlap"], "--force", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["forced"] is True
    assert len(doc["differences"]) == 1 and "overlap" in doc["differences"][0]
    assert "overlap" in err  # also warned about
    assert doc["a"]["path"] == str(runs["base"]) and doc["b"]["path"] == str(runs["no_overlap"])
    assert doc["a"]["mode"] == "sim" and doc["a"]["model"] == "llama-3.1-8b" and doc["a"]["hardware"] == "h100"
    sa, sb = _summary(runs["base"]), _summary(runs["no_overlap"])
    assert set(doc["metrics"]) == set(METRIC_KEYS)
    for key, m in doc["metrics"].items():
        assert m["a"] == sa[key] and m["b"] == sb[key], key
        assert m["rel_err"] == pytest.approx((sb[key] - sa[key]) / sa[key]), key


def test_force_text_warns_and_table_equals_run_json(runs):
    rc, out, _ = _compare(runs["base"], runs["no_overlap"], "--force")
    assert rc == 0
    assert "warning" in out and "overlap" in out
    assert f"A: {runs['base']}  (sim, llama-3.1-8b, h100)" in out
    sa, sb = _summary(runs["base"]), _summary(runs["no_overlap"])
    group, seen = None, 0
    for line in out.splitlines():
        if line.endswith("(ms)") and line.split()[0] in ("TTFT", "TPOT", "ITL", "E2E"):
            group = line.split()[0].lower()
        elif line.startswith("  ") and group:
            stat, va, vb, e = line.split()
            key = f"{stat}_{group}_ms"
            assert float(va.replace(",", "")) == pytest.approx(sa[key], abs=0.051), key
            assert float(vb.replace(",", "")) == pytest.approx(sb[key], abs=0.051), key
            assert float(e.rstrip("%")) == pytest.approx((sb[key] / sa[key] - 1) * 100, abs=0.051), key
            seen += 1
        elif line.startswith("output throughput"):
            assert float(line.split()[3].replace(",", "")) == pytest.approx(sa["output_throughput"], abs=0.051)
        elif line.startswith("cache hit rate"):
            assert float(line.split()[3].rstrip("%")) == pytest.approx(sa["cache_hit_rate"] * 100, abs=0.0051)
        elif line.startswith("completed"):
            assert line.split()[2:4] == [str(sa["completed"]), str(sb["completed"])]
    assert seen == 16


def test_rel_err_hand_checked(runs, tmp_path):
    base = _summary(runs["base"])

    def edit(meta):  # B: TTFT mean 25% higher, p99 E2E 10% lower
        meta["summary"]["mean_ttft_ms"] = base["mean_ttft_ms"] * 1.25
        meta["summary"]["p99_e2e_ms"] = base["p99_e2e_ms"] * 0.9

    b = _edit_meta(runs["base"], tmp_path / "b", edit)
    rows = {r.name: r for r in compare_runs(load_run(runs["base"]), load_run(b))}
    assert rows["mean_ttft_ms"].rel_err == pytest.approx(0.25)
    assert rows["p99_e2e_ms"].rel_err == pytest.approx(-0.10)
    rc, out, _ = _compare(runs["base"], b)
    assert rc == 0
    lines = out.splitlines()
    ttft_mean = lines[lines.index("TTFT (ms)") + 1]
    assert ttft_mean.split()[0] == "mean" and ttft_mean.endswith("+25.0%")
    e2e_p99 = lines[lines.index("E2E (ms)") + 4]
    assert e2e_p99.split()[0] == "p99" and e2e_p99.endswith("-10.0%")
    # A is the reference: no relative error against 0 or a missing value.
    assert rel_err(0, 5) is None and rel_err(None, 5) is None and rel_err(2.0, None) is None
    assert rel_err(4.0, 3.0) == -0.25


@pytest.mark.slow
def test_incomplete_run_refused_unless_forced(runs):
    assert load_run(runs["incomplete"]).status == "incomplete"
    rc, _, err = _compare(runs["base"], runs["incomplete"])
    assert rc == 2
    line = next(line for line in err.splitlines() if "incomplete" in line)
    assert "run B" in line and str(runs["incomplete"]) in line
    rc, out, err = _compare(runs["incomplete"], runs["base"], "--force", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["a"]["status"] == "incomplete"
    assert any("run A" in d and "incomplete" in d for d in doc["differences"])
    assert doc["metrics"]["completed"]["a"] < doc["metrics"]["completed"]["b"]


@pytest.mark.slow
def test_not_a_run_folder_exits_2(runs, tmp_path):
    rc, out, err = _compare(runs["base"], tmp_path)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert err.strip().count("\n") == 0 and "not a run folder" in err and str(tmp_path) in err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "run.json").write_text("{not json")
    rc, _, err = _compare(bad, runs["base"], "--json")
    assert rc == 2 and "bad JSON" in err and "Traceback" not in err


def test_what_is_not_a_difference(runs, tmp_path):
    # Hardware and mem_fraction_static do not matter when the KV pool is the same size.
    a, b = load_run(runs["h100_kv"]), load_run(runs["h200_kv"])
    assert differences(a, b) == []

    def as_real(meta):  # the same run, as a real run on a GPU would record it
        meta["mode"] = meta["options"]["mode"] = "real"
        meta["hardware"] = "NVIDIA H100 80GB HBM3"
        meta.pop("cost_model")
        meta["options"] |= {
            "device": "cuda",
            "dtype": "bfloat16",
            "attention_backend": "flashinfer",
            "load_format": "dummy",
            "kv_memory_gb": 4.0,
            "format": "native",
        }
        meta |= {"device": "CUDA", "dtype": "bfloat16", "attention_backend": "flashinfer", "load_format": "dummy"}

    real = load_run(_edit_meta(runs["base"], tmp_path / "real", as_real))
    assert differences(real, load_run(runs["base"])) == []
    # A different KV pool is a difference, named as such.
    diffs = differences(load_run(runs["base"]), a)
    assert len(diffs) == 1 and diffs[0].startswith("kv_tokens:")


def test_by_arrival_finds_the_group_that_drifts(runs, tmp_path):
    # B: the same run but its first 20 arrivals got their first token (and every later one) 50 ms later:
    # their TTFT grows by 50 ms, their TPOT not; the other 20 are as in A.
    shutil.copytree(runs["base"], tmp_path / "b")
    requests = pd.read_parquet(tmp_path / "b" / "requests.parquet")
    early = requests["arrival"].rank(method="first") <= 20
    for column in ("first_token", "finish"):
        requests.loc[early, column] += 0.05
    requests.to_parquet(tmp_path / "b" / "requests.parquet")
    rc, out, err = _compare(runs["base"], tmp_path / "b", "--by-arrival", "2", "--json")
    assert rc == 0, err
    first, second = json.loads(out)["by_arrival"]
    assert first["requests"] == [1, 20] and second["requests"] == [21, 40]
    a = load_run(runs["base"]).requests.sort_values("arrival")
    ttft_a = ((a["first_token"] - a["arrival"]) * 1e3).to_numpy()
    assert first["mean_ttft_ms"]["a"] == pytest.approx(ttft_a[:20].mean())
    assert first["mean_ttft_ms"]["b"] == pytest.approx(ttft_a[:20].mean() + 50)
    assert first["mean_ttft_ms"]["rel_err"] == pytest.approx(50 / ttft_a[:20].mean())
    assert second["mean_ttft_ms"]["rel_err"] == pytest.approx(0, abs=1e-12)
    assert first["mean_tpot_ms"]["rel_err"] == pytest.approx(0, abs=1e-9) and second["mean_tpot_ms"]["rel_err"] == pytest.approx(
        0, abs=1e-12
    )
    assert second["from_s"] == pytest.approx(a["arrival"].iloc[20] - a["arrival"].iloc[0])
    # The table says the same, one row a group.
    rc, out, _ = _compare(runs["base"], tmp_path / "b", "--by-arrival", "2")
    rows = out[out.index("by arrival:") :].splitlines()
    assert rows[3].split()[0] == "1-20" and rows[3].split()[4] == f"{50 / ttft_a[:20].mean() * 100:+.1f}%"
    assert rows[4].split()[0] == "21-40" and rows[4].split()[4] == "+0.0%"


def test_by_arrival_more_groups_than_requests_and_a_bad_count(runs):
    rc, out, _ = _compare(runs["base"], runs["again"], "--by-arrival", "100", "--json")
    groups = json.loads(out)["by_arrival"]
    assert rc == 0 and len(groups) == 40 and all(g["requests"][0] == g["requests"][1] for g in groups)
    rc, out, err = _compare(runs["base"], runs["again"], "--by-arrival", "0")
    assert rc == 2 and out == "" and "--by-arrival" in err and "Traceback" not in err
