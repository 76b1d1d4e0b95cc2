"""The `testbed` command line, run as a user runs it: in a subprocess.

Exit codes: 0 on success, 2 on a usage or input error (one line on stderr, no
traceback), 130 on Ctrl-C (the run folder is left marked "incomplete").
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error

from scheduler.model_config import bundled_model_names
from testbed.runs.folder import load_run

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "traces"
MOONCAKE = SHARED / "mooncake" / "conversation_trace.jsonl"
AZURE = SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
SHAREGPT = SHARED / "sharegpt" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
CLI = [sys.executable, "-m", "testbed.cli"]


def _testbed(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared trace {path} is absent")
    return path


def _head(src: Path, dst: Path, lines: int) -> Path:
    """The first `lines` lines of src, byte for byte (CRLF kept)."""
    with open(src, "rb") as f:
        dst.write_bytes(b"".join(islice(f, lines)))
    return dst


def _num(text: str) -> float | None:
    return None if text == "-" else float(text.replace(",", ""))


# --- the example everyone runs ------------------------------------------------------------


def test_replay_example_trace_prints_summary_and_writes_folder(tmp_path):
    out = tmp_path / "run"
    # The console script of the environment running the tests (not whatever `testbed` is on PATH).
    script = Path(sys.executable).with_name("testbed")
    cmd = [str(script)] if script.is_file() else CLI
    proc = subprocess.run(
        [*cmd, "replay", "traces/a.json", "--mode", "sim", "--out", str(out), "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    run = load_run(out)
    assert run.status == "complete"
    assert run.summary["completed"] == len(run.requests) == 300
    rows = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if parts and parts[0] in ("TTFT", "TPOT", "ITL", "E2E"):
            rows[parts[0]] = parts[1:]
    assert set(rows) == {"TTFT", "TPOT", "ITL", "E2E"}, proc.stdout
    # The printed table shows run.json's numbers (mean, p50, p90, p99 in ms).
    for name, cells in rows.items():
        assert len(cells) == 4, f"{name} row: {cells}"
        for stat, cell in zip(("mean", "p50", "p90", "p99"), cells):
            want = run.summary[f"{stat}_{name.lower()}_ms"]
            assert _num(cell) == pytest.approx(want, rel=1e-3, abs=0.006), f"{name} {stat}: printed {cell}, run.json {want}"
    assert str(out) in proc.stdout


# --- bad traces: one line naming the file, the line and the field -------------------------------

HEADER = '{"format": "testbed-trace", "version": 1}'
GOOD = '{"arrival": 0.0, "input_len": 10, "output_len": 5}'
GOOD2 = '{"arrival": 0.5, "input_len": 12, "output_len": 4}'

MALFORMED = {
    # name: (file name, lines, line number of the fault, field or None)
    "bad-json": ("t.jsonl", [HEADER, GOOD, '{"arrival": 0.5, "input_len": 12, "output_len": 4'], 3, None),
    "missing-output_len": ("t.jsonl", [HEADER, GOOD, '{"arrival": 0.5, "input_len": 12}'], 3, "output_len"),
    "negative-length": ("t.jsonl", [HEADER, GOOD, GOOD2, '{"arrival": 1.0, "input_len": -7, "output_len": 4}'], 4, "input_len"),
    "unsorted-arrivals": ("t.jsonl", [HEADER, GOOD, GOOD2, '{"arrival": 0.25, "input_len": 9, "output_len": 3}'], 4, "arrival"),
    "non-numeric-time": ("t.jsonl", [HEADER, GOOD, '{"arrival": "soon", "input_len": 12, "output_len": 4}'], 3, "arrival"),
    "json-form-missing-output_len": (
        "t.json",
        ['{"format": "testbed-trace", "version": 1, "requests": [', GOOD + ",", GOOD2 + ",", '{"arrival": 0.9, "input_len": 3}', "]}"],
        4,
        "output_len",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_trace_exits_2_with_one_line_naming_file_line_and_field(tmp_path, case):
    name, lines, lineno, field = MALFORMED[case]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    proc = _testbed("replay", path, "--mode", "sim", "--out", tmp_path / "run", "-q")
    needles = [f"{path}:{lineno}"] + ([field] if field else [])
    assert_clean_error(proc, *needles)


def test_sharegpt_without_rate_exits_2_and_asks_for_it(tmp_path):
    path = _head(_need(SHAREGPT), tmp_path / "sg.csv", 21)
    proc = _testbed("replay", path, "--out", tmp_path / "run", "-q")
    assert_clean_error(proc, str(path), "--rate")


# --- models ----------------------------------------------------------------------------------


def test_unknown_model_exits_2_listing_bundled_models(tmp_path):
    proc = _testbed("replay", "traces/a.json", "--model", "no-such-model-7b", "--out", tmp_path / "run", "-q")
    line = assert_clean_error(proc, "no-such-model-7b")
    for name in bundled_model_names():
        assert name in line, f"bundled model {name} is not listed: {line}"


def test_model_folder_without_config_json_exits_2(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "README.md").write_text("weights elsewhere\n")
    proc = _testbed("replay", "traces/a.json", "--model", folder, "--out", tmp_path / "run", "-q")
    assert_clean_error(proc, "config.json")


# --- trace gen, then replay ----------------------------------------------------------------------


@pytest.mark.slow
def test_trace_gen_then_replay(tmp_path):
    trace = tmp_path / "gen.jsonl"
    proc = _testbed(
        "trace",
        "gen",
        "--out",
        trace,
        "-n",
        "25",
        "--rate",
        "20",
        "--input-len",
        "uniform:50,300",
        "--output-len",
        "uniform:5,50",
        "--system-prompts",
        "2",
        "--shared-fraction",
        "0.5",
        "--seed",
        "3",
    )
    assert proc.returncode == 0, proc.stderr
    assert trace.is_file()
    out = tmp_path / "run"
    proc = _testbed("replay", trace, "--out", out, "--policy", "lpm", "--no-overlap", "--page-size", "16", "-q")
    assert proc.returncode == 0, proc.stderr
    run = load_run(out)
    assert run.status == "complete" and run.summary["completed"] == 25
    assert run.meta["options"]["policy"] == "lpm" and run.meta["options"]["overlap"] is False
    assert run.meta["options"]["page_size"] == 16


# --- each importer replays -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt,src,lines,extra",
    [
        ("mooncake", MOONCAKE, 50, []),
        ("azure", AZURE, 51, []),  # header + 50 rows
        ("sharegpt", SHAREGPT, 51, ["--rate", "5"]),
    ],
    ids=["mooncake", "azure", "sharegpt"],
)
def test_importer_formats_replay(tmp_path, fmt, src, lines, extra):
    path = _head(_need(src), tmp_path / f"slice{src.suffix}", lines)
    out = tmp_path / "run"
    proc = _testbed("replay", path, "--out", out, "-q", *extra)
    assert proc.returncode == 0, proc.stderr
    run = load_run(out)
    assert run.status == "complete"
    assert run.meta["trace"]["format"] == fmt
    assert len(run.requests) == 50
    s = run.summary
    assert s["completed"] + s["rejected"] == 50 and s["completed"] > 0
    if fmt == "sharegpt":
        # Poisson arrivals at 5 req/s: 50 requests span roughly 10 s.
        span = run.requests["arrival"].max()
        assert 4 < span < 25


# --- Ctrl-C ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_exits_130_and_leaves_an_incomplete_folder(tmp_path):
    path = _head(_need(MOONCAKE), tmp_path / "mooncake3000.jsonl", 3000)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [*CLI, "replay", str(path), "--out", str(out), "-q"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (out / "run.json").exists():
            assert proc.poll() is None, f"replay ended before it started: {proc.communicate()}"
            assert time.monotonic() < deadline, "run.json never appeared"
            time.sleep(0.05)
        time.sleep(1.0)  # let the simulation get going
        assert proc.poll() is None, "the replay finished before Ctrl-C; use a larger workload"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, f"exit {proc.returncode}\n{stderr}"
    assert "Traceback" not in stderr and "Traceback" not in stdout
    assert "incomplete" in stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "incomplete"
    run = load_run(out)
    assert run.status == "incomplete"
    assert len(run.requests) > 0 and len(run.steps) > 0
    assert (run.requests["status"] == "unfinished").any()


def test_default_folders_named_in_one_second_do_not_collide(tmp_path, monkeypatch):
    """Default run and study folders are named to the second: two commands in one second (a
    quick replay, then another; two small capacity studies) get two folders, not one."""
    from datetime import datetime

    import testbed.replay_result as replay_mod  # (where default_run_dir lives)
    import testbed.studies.cli as studies_cli
    from testbed.options import ReplayOptions

    class OneSecond(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 11, 25, 5, 18, 16)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(replay_mod, "datetime", OneSecond)
    monkeypatch.setattr(studies_cli, "datetime", OneSecond)
    for make in (
        lambda: replay_mod.default_run_dir("traces/a.json", ReplayOptions()),
        lambda: studies_cli._default_out("capacity", "traces/a.json"),
    ):
        folders = []
        for _ in range(3):
            folders.append(make())
            folders[-1].mkdir(parents=True)  # (the command writes it)
        assert len(set(folders)) == 3, folders
        assert folders[1].name == folders[0].name + "-2"
