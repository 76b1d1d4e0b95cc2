"""What a new user tripped on at the command line: usage errors, progress output, what the output names."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error

from testbed.runs.folder import load_run
from testbed.runs.summary_table import format_summary

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "testbed"]


def _testbed(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout)


# --- usage errors: one line and a hint, for every command -------------------------------------------

SUBCOMMANDS = [
    ["replay", "traces/a.json"],
    ["sweep", "traces/a.json"],
    ["capacity", "traces/a.json", "--slo", "p90_ttft_ms=100"],
    ["compare", "a", "b"],
    ["trace", "gen", "--out", "x.json"],
    ["trace", "convert", "a", "--out", "b"],
    ["trace", "info", "a"],
    ["dashboard"],
    ["calibrate"],
]


@pytest.mark.slow
@pytest.mark.parametrize("command", SUBCOMMANDS, ids=lambda c: " ".join(c[:2]))
def test_an_unknown_option_is_one_line_with_a_hint_to_help(command):
    line = assert_clean_error(_testbed(*command, "--no-such-option"), "--no-such-option")
    prog = "testbed " + " ".join(w for w in command[:2] if not w.startswith(("traces/", "a", "x", "b")))
    assert line.startswith("testbed: error: ") and line.endswith(f"(see {prog.strip()} --help)"), line


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, needle",
    [
        ([], "command"),
        (["replay"], "trace"),
        (["replay", "traces/a.json", "--policy", "nope"], "--policy"),
        (["replay", "traces/a.json", "--max-requests", "0"], "--max-requests"),
        (["trace"], "{gen,convert,info} (see testbed trace --help)"),
    ],
)
def test_missing_and_bad_values_are_one_line(args, needle):
    assert_clean_error(_testbed(*args), needle)


def test_version():
    proc = _testbed("--version")
    assert proc.returncode == 0 and re.fullmatch(r"testbed \d+\.\d+\.\d+\S*\n", proc.stdout), proc.stdout


# --- progress ---------------------------------------------------------------------------------------


def test_piped_progress_is_a_few_lines_not_every_redraw(tmp_path):
    proc = _testbed("replay", "traces/a.json", "--out", tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert 1 <= len(lines) <= 4 and lines[-1] == "replay sim: 300/300 req (100%)", proc.stderr


def _run_with_terminal_stderr(args: list[str]) -> tuple[int, str]:
    """Run with stderr on a pseudo-terminal (where the progress bar draws); returns (exit code, stderr)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a 120-column terminal
    proc = subprocess.Popen([*CLI, *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_no_progress_bar_before_the_input_is_checked(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"arrival": 0.0, "input_len": 10, "output_len": 5}\n{"arrival": 1.0, "input_len": -1, "output_len": 5}\n')
    code, err = _run_with_terminal_stderr(["replay", str(bad), "--out", str(tmp_path / "run")])
    assert code == 2
    assert "replay sim" not in err and "%|" not in err, err  # no bar drawn
    assert f"{bad}:2" in err
    code, err = _run_with_terminal_stderr(["replay", "traces/a.json", "--out", str(tmp_path / "ok")])
    assert code == 0 and "replay sim" in err and "300/300" in err  # the bar, once the inputs are good


# --- what the output names --------------------------------------------------------------------------


def test_the_title_names_mode_model_hardware_policy_and_overlap(tmp_path):
    proc = _testbed(
        "replay", "traces/a.json", "--model", "qwen2.5-0.5b", "--hardware", "a100", "--policy", "lpm", "--out", tmp_path / "r", "-q"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "traces/a.json (sim, qwen2.5-0.5b on a100, lpm, overlap on)"


@pytest.mark.slow
def test_a_real_cpu_run_names_its_model_and_device_and_records_cpu_as_hardware(tmp_path):
    proc = _testbed("replay", "traces/a.json", "--mode", "real", "--max-requests", "4", "--out", tmp_path / "r", "-q", timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("real engine: device CPU") for line in lines) == 1, proc.stdout
    assert "traces/a.json (real, tiny-llama on cpu, fcfs, overlap off)" in lines
    run = load_run(tmp_path / "r")
    assert run.meta["options"]["hardware"] == "cpu" and run.meta["hardware"] == "cpu"


def test_big_latencies_stay_apart_in_the_summary_table():
    s = {"completed": 1, "duration_s": 1.0, "request_throughput": 1.0, "output_throughput": 1.0, "cache_hit_rate": 0.0}
    s |= {
        f"{k}_{n}_ms": 3_046_054.4 + i
        for i, (k, n) in enumerate((k, n) for n in ("ttft", "tpot", "itl", "e2e") for k in ("mean", "p50", "p90", "p99"))
    }
    row = next(line for line in format_summary(s).splitlines() if line.startswith("TTFT"))
    assert row.split() == ["TTFT", "3,046,054.4", "3,046,055.4", "3,046,056.4", "3,046,057.4"]
    assert "4  3" in row  # at least two spaces between numbers
