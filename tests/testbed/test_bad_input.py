"""Bad input is one line and exit 2, never a traceback or a hang: what an adversarial user tried.

Each case is a command as a user types it, on a file made here: numbers too large for any clock or
index, JSON nested past what Python reads, size options past their bounds, --out that cannot be a
folder, imports whose fields are out of range, an axis value that names nothing. Then a fuzz test
over malformed request objects and option values (hypothesis): each is taken or refused with a
user error, which the CLI prints as one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.errors import USER_ERRORS
from testbed.options import SIZE_LIMITS, ReplayOptions, check_options
from testbed.traces.formats import load_trace

REPO = Path(__file__).resolve().parents[2]
HUGE = 2**70
OK_TRACE = {"format": "testbed-trace", "version": 1, "requests": [{"arrival": 0, "input_len": 5, "output_len": 1}]}


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "testbed.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )


def write(path: Path, obj) -> Path:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    lss = {
        "request_id": "a",
        "input_toks": 10,
        "output_toks": 3,
        "arrival_time": 1.0,
        "queued_ts": 5.0,
        "scheduled_ts": 5.1,
        "first_token_ts": 5.2,
        "last_token_ts": 5.4,
    }
    bench = {
        "backend": "sglang",
        "dataset_name": "sharegpt",
        "request_rate": 2.0,
        "input_lens": [100],
        "output_lens": [3],
        "ttfts": [0.3],
        "itls": [[0.05, 0.05]],
        "errors": [""],
    }
    return {
        "ok": write(tmp_path / "ok.json", OK_TRACE),
        "afile": write(tmp_path / "afile", "x"),
        "arrival": write(tmp_path / "arrival.json", '{"requests": [{"arrival": ' + "1" * 400 + ', "input_len": 5, "output_len": 1}]}'),
        "ids": write(tmp_path / "ids.json", {"requests": [{"arrival": 0, "input_ids": [2**64], "output_len": 1}]}),
        "deep": write(tmp_path / "deep.json", "[" * 100_000 + "]" * 100_000),
        "lss_in": write(tmp_path / "lss_in.jsonl", json.dumps(lss) + "\n" + json.dumps(lss | {"input_toks": HUGE}) + "\n"),
        "lss_out": write(tmp_path / "lss_out.jsonl", json.dumps(lss) + "\n" + json.dumps(lss | {"output_toks": HUGE}) + "\n"),
        "rate_str": write(tmp_path / "rate_str.jsonl", json.dumps(bench | {"request_rate": "fast"}) + "\n"),
        "rate_zero": write(tmp_path / "rate_zero.jsonl", json.dumps(bench | {"request_rate": 0}) + "\n"),
        "bench": write(tmp_path / "bench.jsonl", json.dumps(bench) + "\n"),
        "csv_underscore": write(tmp_path / "us.csv", "arrival,input_len,output_len\n0,1_000,5\n"),
        "csv_nbsp": write(tmp_path / "nbsp.csv", "arrival,input_len,output_len\n0,100\u00a0,5\n"),
        "csv_extra": write(tmp_path / "extra.csv", "arrival,input_len,output_len\n0,100,5,7\n"),
        "csv_twice": write(tmp_path / "twice.csv", "arrival,input_len,output_len,input_len\n0,100,5,7\n"),
        "only_run_json": _only_run_json(tmp_path / "only-run-json"),
        "off_clock": write(
            tmp_path / "off_clock.jsonl",
            "".join(
                json.dumps(
                    lss
                    | {
                        "request_id": str(i),
                        "arrival_time": 1e9 + i,
                        "queued_ts": 5000.0 + i,
                        "scheduled_ts": 5000.1 + i,
                        "first_token_ts": 5000.2 + i,
                        "last_token_ts": 5000.4 + i,
                    }
                    | ({"queued_ts": 0.0} if i == 2 else {})
                )
                + "\n"
                for i in range(5)
            ),
        ),
    }


def _only_run_json(folder: Path) -> Path:
    folder.mkdir()
    write(folder / "run.json", {"status": "running", "mode": "sim", "summary": None, "options": {}})
    return folder


CASES = {
    "arrival of 400 digits": (["replay", "{arrival}", "-q", "--out", "{tmp}/r"], ["arrival.json:1", "'arrival'"]),
    "input_ids holding 2**64": (["replay", "{ids}", "-q", "--out", "{tmp}/r"], ["ids.json:1", "'input_ids'", "2**63"]),
    "JSON nested 100,000 deep": (["replay", "{deep}", "-q", "--out", "{tmp}/r"], ["deep.json", "nested too deeply"]),
    "JSON nested, trace info": (["trace", "info", "{deep}"], ["deep.json", "nested too deeply"]),
    "--chunked-prefill-size 2**64": (
        ["replay", "{ok}", "-q", "--chunked-prefill-size", str(2**64), "--out", "{tmp}/r"],
        ["--chunked-prefill-size", "at most 2,147,483,647"],
    ),
    "--max-num-seqs 2**64": (
        ["replay", "{ok}", "-q", "--scheduler", "vllm", "--max-num-seqs", str(2**64), "--out", "{tmp}/r"],
        ["--max-num-seqs", "at most 1,048,576"],
    ),
    "--kv-tokens 2**64": (["replay", "{ok}", "-q", "--kv-tokens", str(2**64), "--out", "{tmp}/r"], ["--kv-tokens", "at most"]),
    "--schedule-conservativeness inf": (
        ["replay", "{ok}", "-q", "--schedule-conservativeness", "inf", "--out", "{tmp}/r"],
        ["--schedule-conservativeness", "finite"],
    ),
    "--out a file": (["replay", "{ok}", "-q", "--out", "{afile}"], ["--out", "is a file"]),
    "--out under a file": (["replay", "{ok}", "-q", "--out", "{afile}/sub"], ["--out", "is a file"]),
    "--out empty": (["replay", "{ok}", "-q", "--out", ""], ["--out ''"]),
    "import --seed -1": (["run", "import", "{bench}", "--seed", "-1", "--out", "{tmp}/i"], ["--seed -1"]),
    "import --out a file": (["run", "import", "{bench}", "--out", "{afile}"], ["--out", "is a file"]),
    "import input length 2**70": (
        ["run", "import", "{lss_in}", "--format", "llmservingsim", "--out", "{tmp}/i"],
        ["lss_in.jsonl:2", "'input_toks'"],
    ),
    "import output length 2**70": (
        ["run", "import", "{lss_out}", "--format", "llmservingsim", "--out", "{tmp}/i"],
        ["lss_out.jsonl:2", "'output_toks'"],
    ),
    "import request_rate 'fast'": (["run", "import", "{rate_str}", "--out", "{tmp}/i"], ["rate_str.jsonl:1", "'request_rate'", "'fast'"]),
    "import request_rate 0": (["run", "import", "{rate_zero}", "--out", "{tmp}/i"], ["rate_zero.jsonl:1", "'request_rate'"]),
    "gen uniform past any context": (
        ["trace", "gen", "--out", "{tmp}/g.json", "-n", "5", "--input-len", f"uniform:1,{HUGE}"],
        ["--input-len", "HI <= 16,777,216"],
    ),
    "sweep model=nope": (["sweep", "{ok}", "--grid", "model=nope", "--out", "{tmp}/s", "-q"], ["--grid model=nope", "unknown model"]),
    "sweep hardware=nope": (["sweep", "{ok}", "--grid", "hardware=nope", "--out", "{tmp}/s", "-q"], ["--grid hardware=nope"]),
    "sweep profile=nope.json": (["sweep", "{ok}", "--grid", "profile=nope.json", "--out", "{tmp}/s", "-q"], ["--grid profile=nope.json"]),
    "CSV number 1_000": (["trace", "info", "{csv_underscore}"], ["us.csv:2", "'input_len'", "1_000"]),
    "CSV non-breaking space": (["trace", "info", "{csv_nbsp}"], ["nbsp.csv:2", "'input_len'"]),
    "CSV extra cells": (["trace", "info", "{csv_extra}"], ["extra.csv:2", "expected 3 columns"]),
    "CSV column twice": (["trace", "info", "{csv_twice}"], ["twice.csv:1", "'input_len'", "twice"]),
    "import a queued_ts off the run's clock": (
        ["run", "import", "{off_clock}", "--format", "llmservingsim", "--out", "{tmp}/i"],
        ["off_clock.jsonl:3", "'queued_ts'", "not on the run's clock"],
    ),
    "compare a folder of run.json alone": (["compare", "{only_run_json}", "{only_run_json}"], ["only-run-json", "no requests table"]),
    "sweep chunked-prefill-size=2**64": (
        ["sweep", "{ok}", "--grid", f"chunked-prefill-size=64,{2**64}", "--out", "{tmp}/s", "-q"],
        ["--chunked-prefill-size", "at most"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_exit_2(case, files, tmp_path):
    args, needles = CASES[case]
    names = {k: str(v) for k, v in files.items()} | {"tmp": str(tmp_path)}
    proc = run(*(a.format(**names) for a in args), cwd=tmp_path)
    assert_clean_error(proc, *needles)
    assert not list(tmp_path.glob("*.parquet")) and not (tmp_path / "run.json").exists(), "nothing written where it ran"


# --- fuzz -------------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
FIELDS = ("arrival", "input_len", "output_len", "input_ids", "block_hashes", "block_size", "id", "priority")


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=len(FIELDS)))
def test_any_request_object_is_read_or_refused_as_a_user_error(request, tmp_path):
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps({"requests": [request]}))
    try:
        trace = load_trace(path)
    except USER_ERRORS:
        return
    r = trace.requests[0]
    assert r.arrival >= 0 and r.input_len >= 1 and r.output_len >= 1


SIZE_OPTIONS = tuple(SIZE_LIMITS)


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(SIZE_OPTIONS), value=st.integers(min_value=1, max_value=2**80))
def test_a_size_option_within_its_bound_is_taken_and_past_it_refused(name, value):
    opts = ReplayOptions(**{name: value, **({"scheduler": "vllm"} if name in ("max_num_seqs", "max_num_batched_tokens") else {})})
    limit = SIZE_LIMITS[name][0]
    if value > limit:
        with pytest.raises(USER_ERRORS):
            check_options(opts)
    else:
        try:
            check_options(opts)
        except USER_ERRORS as e:  # refused for another reason (an option of the other scheduler): never the bound
            assert "at most" not in str(e)


def test_a_sweep_folder_without_its_table_says_what_it_holds(tmp_path):
    from testbed.studies.sweep import load_sweep

    (tmp_path / "points" / "a").mkdir(parents=True)
    (tmp_path / "points" / "a" / "run.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"no sweep.parquet: it holds points/; 1 point folder"):
        load_sweep(tmp_path)
