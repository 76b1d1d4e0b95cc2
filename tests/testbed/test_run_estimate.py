"""What a real replay says about its cost: the work up front, the wall time left, a busy machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.replay import ReplayProgress
from testbed.run_estimate import TimeLeft, busy_cpu_note, describe_work, format_duration

REPO = Path(__file__).resolve().parents[2]


def test_durations_read_as_a_person_says_them():
    assert [format_duration(s) for s in (0.4, 45, 60, 200, 3600, 3900)] == ["0 s", "45 s", "1 min", "3 min 20 s", "1 h", "1 h 5 min"]


def test_time_left_is_the_work_left_at_the_measured_rate():
    left = TimeLeft(arrival_span_s=None)
    assert left.update(ReplayProgress(0, 100, 0, 10_000), now=0.0) is None  # nothing measured yet
    assert left.update(ReplayProgress(10, 100, 1_000, 10_000), now=1.0) is None  # start-up: too early
    # 2,500 tokens of finished requests in 5 s: 500 tok/s, 7,500 tokens left: 15 s.
    assert left.update(ReplayProgress(25, 100, 2_500, 10_000), now=5.0) == "500 tok/s here, ~15 s left"


def test_time_left_waits_for_the_last_arrival():
    """An engine faster than the trace's load still ends after its last request arrives."""
    left = TimeLeft(arrival_span_s=120.0)
    left.update(ReplayProgress(0, 100, 0, 10_000), now=0.0)
    assert left.update(ReplayProgress(50, 100, 5_000, 10_000), now=10.0) == "500 tok/s here, ~1 min 50 s left"


def test_the_estimate_is_remade_at_most_once_a_second():
    left = TimeLeft(arrival_span_s=None)
    left.update(ReplayProgress(0, 100, 0, 10_000), now=0.0)
    first = left.update(ReplayProgress(25, 100, 2_500, 10_000), now=5.0)
    assert left.update(ReplayProgress(90, 100, 9_000, 10_000), now=5.5) == first
    assert left.update(ReplayProgress(90, 100, 9_000, 10_000), now=6.0) != first


def test_a_busy_machine_is_said_only_for_a_cpu_engine_beside_other_work():
    cpu = {"cpu_threads": 2}
    assert busy_cpu_note(cpu, load_1min=1.2, cores=2) is None
    note = busy_cpu_note(cpu, load_1min=4.0, cores=2)
    assert note is not None and "load 4.0 on 2 cores" in note and "OMP_NUM_THREADS=1" in note
    assert "OMP_NUM_THREADS" not in busy_cpu_note({"cpu_threads": 1}, load_1min=4.0, cores=2)
    assert busy_cpu_note({}, load_1min=40.0, cores=2) is None  # a GPU engine


@pytest.mark.slow
def test_a_real_replay_says_its_work_before_it_starts(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"arrival": {i * 0.5}, "input_len": 40, "output_len": 8}}\n' for i in range(6)))
    proc = subprocess.run(
        [sys.executable, "-m", "testbed", "replay", str(trace), "--mode", "real", "--out", str(tmp_path / "run")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "6 requests: 240 prompt + 48 output tokens, arriving over 2 s" in proc.stderr
    run = json.loads((tmp_path / "run" / "run.json").read_text())  # what the line is made from
    assert (run["trace"]["prompt_tokens"], run["trace"]["output_tokens"], run["trace"]["arrival_span_s"]) == (240, 48, 2.5)
    assert describe_work(run["trace"]) in proc.stderr
    assert run["cpu_threads"] >= 1
