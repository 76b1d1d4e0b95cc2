"""Input a fuzzer (or a hand-edited trace) gives: refused up front, in one line naming file, line
and field; or accepted, where it is a reasonable way to write a trace.

Run as a user runs them: `testbed replay` in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error

from testbed.runs.folder import load_run

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "testbed"]
GOOD = '{"arrival": 0.0, "input_len": 10, "output_len": 5}'
BIG = 2**63  # one past int64


def _testbed(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _write(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


# --- refused before anything runs -----------------------------------------------------------------

INT64_CASES = {
    # name: (file name, lines, line of the fault, field)
    "native-input_len": ("t.jsonl", [GOOD, f'{{"arrival": 1.0, "input_len": {BIG}, "output_len": 5}}'], 2, "input_len"),
    "native-output_len": ("t.jsonl", [GOOD, GOOD, f'{{"arrival": 1.0, "input_len": 3, "output_len": {2**70}}}'], 3, "output_len"),
    "native-priority-high": ("t.jsonl", [GOOD, f'{{"arrival": 1.0, "input_len": 3, "output_len": 4, "priority": {BIG}}}'], 2, "priority"),
    "native-priority-low": (
        "t.jsonl",
        [GOOD, f'{{"arrival": 1.0, "input_len": 3, "output_len": 4, "priority": {-BIG - 1}}}'],
        2,
        "priority",
    ),
    "mooncake-input_length": (
        "m.jsonl",
        [
            '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}',
            f'{{"timestamp": 5, "input_length": {BIG}, "output_length": 5, "hash_ids": [1]}}',
        ],
        2,
        "input_length",
    ),
    "azure-ContextTokens": (
        "a.csv",
        ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03.98,10,5", f"2023-11-16 18:17:04.0,{BIG},5"],
        3,
        "ContextTokens",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(INT64_CASES))
def test_integers_past_int64_are_refused_naming_the_line(tmp_path, case):
    name, lines, lineno, field = INT64_CASES[case]
    path = _write(tmp_path / name, *lines)
    out = tmp_path / "run"
    line = assert_clean_error(_testbed("replay", path, "--out", out, "-q"), f"{path}:{lineno}", field)
    assert "2**63" in line
    assert not out.exists()  # refused before the run started, not after simulating it


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl", "json"])
def test_an_arrival_that_time_scale_makes_infinite_is_refused_naming_the_line(tmp_path, fmt):
    lines = [GOOD, '{"arrival": 1e300, "input_len": 3, "output_len": 4}', '{"arrival": 1e308, "input_len": 3, "output_len": 4}']
    path = tmp_path / f"t.{fmt}"
    if fmt == "jsonl":
        _write(path, *lines)
    else:
        _write(path, '{"requests": [', lines[0] + ",", lines[1] + ",", lines[2], "]}")
    out = tmp_path / "run"
    assert _testbed("replay", path, "--out", out, "-q").returncode == 0  # finite at --time-scale 1
    lineno = 3 if fmt == "jsonl" else 4
    line = assert_clean_error(
        _testbed("replay", path, "--time-scale", 10, "--out", tmp_path / "run2", "-q"), f"{path}:{lineno}", "arrival", "--time-scale 10"
    )
    assert "finite" in line
    assert not (tmp_path / "run2").exists()


def test_rate_on_a_trace_with_arrival_times_is_refused(tmp_path):
    path = _write(tmp_path / "t.jsonl", GOOD)
    assert_clean_error(_testbed("replay", path, "--rate", 4, "--out", tmp_path / "run", "-q"), "--rate 4", str(path), "--time-scale")
    assert not (tmp_path / "run").exists()


# --- accepted -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_requests_object_without_format_key_is_the_native_format(tmp_path):
    one_line = _write(
        tmp_path / "one.json", json.dumps({"requests": [json.loads(GOOD), {"arrival": 0.5, "input_len": 7, "output_len": 2}]})
    )
    spread = _write(tmp_path / "spread.json", '{"requests": [', GOOD + ",", '{"arrival": 0.5, "input_len": 7, "output_len": 2}', "]}")
    for path in (one_line, spread):
        out = tmp_path / f"run-{path.stem}"
        proc = _testbed("replay", path, "--out", out, "-q")
        assert proc.returncode == 0, proc.stderr
        run = load_run(out)
        assert run.meta["trace"]["format"] == "native"
        assert run.requests["input_tokens"].tolist() == [10, 7] and run.summary["completed"] == 2


@pytest.mark.slow
def test_a_csv_with_the_native_keys_is_the_native_format(tmp_path):
    path = _write(tmp_path / "t.csv", "arrival,input_len,output_len,id,priority", "0.0,10,5,first,1", "0.25,20,3,,0", "1.5,7,2,third,")
    out = tmp_path / "run"
    proc = _testbed("replay", path, "--out", out, "--policy", "priority", "-q")
    assert proc.returncode == 0, proc.stderr
    run = load_run(out)
    assert run.meta["trace"]["format"] == "native"
    r = run.requests
    assert r["arrival"].tolist() == [0.0, 0.25, 1.5] and r["input_tokens"].tolist() == [10, 20, 7]
    assert r["output_tokens"].tolist() == [5, 3, 2] and r["rid"].tolist() == ["first", "1", "third"]
    assert r["priority"].tolist() == [1, 0, 0]
    # Checked as the JSON form is: the line and the field.
    bad = _write(tmp_path / "bad.csv", "arrival,input_len,output_len", "0.0,10,5", "0.5,ten,5")
    assert_clean_error(_testbed("replay", bad, "--out", tmp_path / "run2", "-q"), f"{bad}:3", "input_len")


# --- rejections -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_rejections_are_counted_by_reason_in_the_summary(tmp_path):
    # tiny-llama's context is 4096 tokens. SGLang's rules: a prompt must leave 6 tokens of the
    # smaller of context and KV pool; a longer output is cut to fit, not refused.
    lines = [
        GOOD,
        '{"arrival": 0.1, "input_len": 5000, "output_len": 5}',
        '{"arrival": 0.2, "input_len": 6000, "output_len": 5}',
        '{"arrival": 0.3, "input_len": 1000, "output_len": 1000}',
        '{"arrival": 0.4, "input_len": 2000, "output_len": 2500}',
    ]
    path = _write(tmp_path / "t.jsonl", *lines)
    proc = _testbed("replay", path, "--model", "tiny-llama", "--kv-tokens", 8000, "--out", tmp_path / "run", "-q")
    assert proc.returncode == 0, proc.stderr
    rejected = [line for line in proc.stdout.splitlines() if line.startswith("rejected:")]
    assert rejected == ["rejected: 2 leave no room for output: prompts must be under 4090 tokens (context length 4096 less 6)"], proc.stdout
    # The 2,500-token output after 2,000 prompt tokens is cut to the context: said in the summary.
    assert "requests: 3 completed (1 with the output cut to fit), 2 rejected" in proc.stdout
    assert load_run(tmp_path / "run").summary["truncated"] == 1
    proc = _testbed("replay", path, "--model", "tiny-llama", "--kv-tokens", 1500, "--out", tmp_path / "run2", "-q")
    line = next(line for line in proc.stdout.splitlines() if line.startswith("rejected:"))
    assert line == "rejected: 3 leave no room for output: prompts must be under 1494 tokens (KV pool 1500 less 6)", proc.stdout


def test_a_run_where_every_request_is_rejected_fails_with_the_reasons(tmp_path):
    path = _write(
        tmp_path / "t.jsonl", '{"arrival": 0.0, "input_len": 5000, "output_len": 5}', '{"arrival": 0.2, "input_len": 6000, "output_len": 5}'
    )
    out = tmp_path / "run"
    proc = _testbed("replay", path, "--model", "tiny-llama", "--out", out, "-q")
    line = assert_clean_error(proc, "every request was rejected", "2 leave no room for output: prompts must be under 4090 tokens", str(out))
    assert "TTFT" not in proc.stdout and line.startswith("testbed: error:")
    assert load_run(out).summary["rejected"] == 2  # the run folder says so too
