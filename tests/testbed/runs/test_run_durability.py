"""A run folder survives whatever stops the replay: SIGKILL, SIGTERM, Ctrl-C (once, twice, at any moment).

Real `testbed replay` processes and real signals, timed by polling the run folder: the
journals (steps.journal.arrows, requests.journal.arrows) show when rows have reached disk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from dashboard.runs_index import scan_runs
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import (
    DIED_ERROR,
    REQUESTS_FILE,
    REQUESTS_JOURNAL,
    STEP_SCHEMA,
    STEPS_FILE,
    STEPS_JOURNAL,
    load_run,
    writer_alive,
)
from testbed.runs.journal import TableJournal, is_locked, read_journal
from testbed.runs.metrics import REQUESTS_SCHEMA, summarize
from testbed.studies.sweep import load_sweep

REPO = Path(__file__).resolve().parents[3]
MOONCAKE = REPO.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
CLI = [sys.executable, "-m", "testbed"]  # what the console script runs
REQUESTS = 8000  # Mooncake's first 8000: a run of several seconds (1.4 s for 3000 made a kill after the first 1 s flush land at the run's very end)


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    if not MOONCAKE.exists():
        pytest.skip(f"shared trace {MOONCAKE} is absent")
    path = tmp_path_factory.mktemp("trace") / "mooncake-first.jsonl"
    with open(MOONCAKE, "rb") as f:
        path.write_bytes(b"".join(islice(f, REQUESTS)))
    return path


@pytest.fixture(scope="module")
def whole_run(trace, tmp_path_factory):
    """The same replay, run to the end: what every killed run's rows must equal."""
    out = tmp_path_factory.mktemp("whole") / "run"
    replay(str(trace), ReplayOptions(), out=out)
    return load_run(out)


def _start(trace: Path, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*CLI, "replay", str(trace), "--out", str(out), "-q", *extra], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for_flushed_rows(proc: subprocess.Popen, out: Path, timeout: float = 60) -> None:
    """Until both journals hold rows (the first flush with a finished request, a second or two in)."""
    deadline = time.monotonic() + timeout
    while len(read_journal(out / STEPS_JOURNAL, STEP_SCHEMA)) == 0 or len(read_journal(out / REQUESTS_JOURNAL, REQUESTS_SCHEMA)) == 0:
        assert proc.poll() is None, f"replay ended before its first flush: {proc.communicate()}"
        assert time.monotonic() < deadline, "no rows reached the journals"
        time.sleep(0.05)


def _when_the_cli_answers_signals(proc: subprocess.Popen, timeout: float = 60) -> float:
    """Wait until the CLI has set its signal handlers (testbed/__main__.py, first thing): a
    signal before that falls into the interpreter's own start-up (runpy finding the package),
    which no code of the project's runs in (with SIGINT inherited ignored, it is lost; else a
    traceback). Under load that start-up has taken over 0.4 s. Linux: SIGTERM appears in
    /proc/<pid>/status's SigCgt. Returns the seconds waited."""
    t0 = time.monotonic()
    status = Path(f"/proc/{proc.pid}/status")
    if not status.exists():
        return 0.0
    deadline = t0 + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            text = status.read_text()
        except OSError:  # (it has just exited)
            break
        caught = next((line.split()[1] for line in text.splitlines() if line.startswith("SigCgt:")), "0")
        if int(caught, 16) & (1 << (signal.SIGTERM - 1)):
            break
        time.sleep(0.005)
    return time.monotonic() - t0


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    return lines[0]


@pytest.mark.slow
def test_sigkill_leaves_every_flushed_step_and_finished_request(trace, whole_run, tmp_path):
    out = tmp_path / "run"
    proc = _start(trace, out)
    _wait_for_flushed_rows(proc, out)
    assert writer_alive(out)
    proc.send_signal(signal.SIGKILL)
    _finish(proc)
    assert proc.returncode == -signal.SIGKILL
    assert json.loads((out / "run.json").read_text())["status"] == "running"  # what the killed process left
    assert not writer_alive(out)

    run = load_run(out)
    assert run.status == "incomplete" and run.meta["error"] == DIED_ERROR
    steps, requests = run.steps, run.requests
    assert 0 < len(steps) < len(whole_run.steps)
    # Every step up to the last flush, exactly as the run that was not killed has it.
    pd.testing.assert_frame_equal(steps, whole_run.steps.iloc[: len(steps)], check_dtype=False)
    # The requests finished by a flush, row for row as in the whole run, none missing: each flush
    # appends the steps, then the requests done by the same moment (a kill between the two
    # leaves the requests one flush behind, never ahead).
    assert len(requests) > 0 and (requests["status"] == "finished").all() and requests["index"].is_monotonic_increasing
    assert requests["finish"].max() < steps["process_end"].iloc[-1]
    whole = whole_run.requests.set_index("index")
    assert sorted(requests["index"]) == sorted(whole.index[whole["finish"] <= requests["finish"].max()])
    pd.testing.assert_frame_equal(requests.set_index("index"), whole.loc[requests["index"]], check_dtype=False)
    assert run.summary["completed"] == len(requests) and run.summary["num_steps"] == len(steps)

    # compare and the dashboard read it as it is.
    proc = subprocess.run([*CLI, "compare", str(out), str(out), "--force"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "incomplete" in proc.stdout
    index = scan_runs(tmp_path)
    assert index.loc[index["name"] == "run", "status"].tolist() == ["incomplete"]


def _assert_incomplete_with_tables(out: Path, line: str) -> None:
    assert str(out) in line and "incomplete" in line, line
    assert json.loads((out / "run.json").read_text())["status"] == "incomplete"
    assert (out / REQUESTS_FILE).is_file() and (out / STEPS_FILE).is_file()
    assert not (out / STEPS_JOURNAL).exists() and not (out / REQUESTS_JOURNAL).exists()
    run = load_run(out)
    assert run.status == "incomplete" and len(run.steps) > 0
    assert (run.requests["status"] == "unfinished").any()  # the final write has every request received


@pytest.mark.slow
def test_sigterm_is_handled_as_ctrl_c(trace, tmp_path):
    out = tmp_path / "run"
    proc = _start(trace, out)
    _wait_for_flushed_rows(proc, out)
    proc.send_signal(signal.SIGTERM)
    _, stderr = _finish(proc)
    assert proc.returncode == 130, stderr
    _assert_incomplete_with_tables(out, _one_line(stderr))


@pytest.mark.slow
@pytest.mark.parametrize("gap_s", [0.0, 0.02, 0.1])
def test_a_second_ctrl_c_waits_for_the_final_write(trace, tmp_path, gap_s):
    out = tmp_path / "run"
    proc = _start(trace, out)
    _wait_for_flushed_rows(proc, out)
    proc.send_signal(signal.SIGINT)
    time.sleep(gap_s)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    _, stderr = _finish(proc)
    assert proc.returncode == 130, stderr
    _assert_incomplete_with_tables(out, _one_line(stderr))


@pytest.fixture(scope="module")
def slow_to_load(tmp_path_factory) -> Path:
    """Mooncake ten times over, one after the other (120k requests): seconds to load."""
    if not MOONCAKE.exists():
        pytest.skip(f"shared trace {MOONCAKE} is absent")
    lines = MOONCAKE.read_text().splitlines()
    last = json.loads(lines[-1])["timestamp"]
    path = tmp_path_factory.mktemp("big") / "mooncake-x10.jsonl"
    with open(path, "w") as f:
        for k in range(10):
            for line in lines:
                obj = json.loads(line)
                obj["timestamp"] += k * (last + 1)
                f.write(json.dumps(obj) + "\n")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("after_s", [0.3, 1.5, 3.0, 6.0])
def test_an_interrupt_at_any_moment_is_one_line_and_leaves_nothing_half_written(slow_to_load, tmp_path, sig, after_s):
    """From the imports through the trace's loading to the simulation: exit 130, one line, and a
    folder that is either not there or loads."""
    out = tmp_path / "run"
    proc = _start(slow_to_load, out)
    time.sleep(max(0.0, after_s - _when_the_cli_answers_signals(proc)))
    assert proc.poll() is None, f"the replay ended before the signal: {proc.communicate()}"
    proc.send_signal(sig)
    _, stderr = _finish(proc)
    assert proc.returncode == 130, stderr
    line = _one_line(stderr)
    if (out / "run.json").exists():
        assert str(out) in line
        assert load_run(out).status == "incomplete"
    else:
        assert "nothing was" in line and ("while starting" in line or str(out) in line), line


def test_a_replay_started_in_the_background_answers_sigint_while_it_imports(slow_to_load, tmp_path):
    """A shell starts a background job with SIGINT ignored, and Python keeps it so: the CLI sets
    its handler first, so `kill -INT` during its imports stops it too (it ran on before)."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [*CLI, "replay", str(slow_to_load), "--out", str(out), "-q"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    time.sleep(max(0.0, 0.15 - _when_the_cli_answers_signals(proc)))  # (the imports take about half a second)
    assert proc.poll() is None, f"the replay ended before the signal: {proc.communicate()}"
    proc.send_signal(signal.SIGINT)
    _, stderr = _finish(proc)
    assert proc.returncode == 130, stderr
    line = _one_line(stderr)
    assert "nothing was" in line, line


def test_the_entry_points_interrupted_exit_code_is_the_clis():
    from testbed import __main__ as entry
    from testbed.errors import EXIT_INTERRUPTED

    assert entry.EXIT_INTERRUPTED == EXIT_INTERRUPTED


# --- sweeps --------------------------------------------------------------------------------------

SWEEP_GRID = ["--grid", "policy=fcfs,lpm", "--grid", "overlap=on,off", "--grid", "time-scale=0.5,1"]  # 8 points


def _complete_points(out: Path) -> set[str]:
    """The points whose run finished writing: run.json says complete, and wall.json, which the
    writer writes just after it (testbed/runs/writer.py), is there too. On run.json alone the
    kill below once fell between the two writes (one full run in eight, on two busy workers),
    and a point counted as finished had no wall.json to compare."""
    done = set()
    for point in (out / "points").glob("*"):
        try:
            if json.loads((point / "run.json").read_text())["status"] == "complete" and (point / "wall.json").is_file():
                done.add(point.name)
        except (OSError, ValueError):
            pass  # not there yet, or being replaced
    return done


@pytest.mark.slow
def test_a_killed_sweep_resumes_from_what_reached_disk(tmp_path):
    """SIGKILL to the sweep and its workers (an OOM kill, a lost machine): --resume keeps every
    point that finished, reruns the rest, and the table ends complete."""
    out = tmp_path / "sweep"
    args = ["sweep", "traces/a.json", *SWEEP_GRID, "--workers", "1", "--out", str(out), "-q"]
    proc = subprocess.Popen([*CLI, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(_complete_points(out)) < 2:
            assert proc.poll() is None, f"the sweep ended first: {proc.communicate()}"
            assert time.monotonic() < deadline, "no point finished"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    finished = _complete_points(out)
    assert 2 <= len(finished) < 8
    walls = {p: (out / "points" / p / "wall.json").read_text() for p in finished}
    table, _ = load_sweep(out)  # written as points finished: what the sweep had when it died
    assert set(table.loc[table["status"] == "complete", "point"]) <= finished
    assert len(table) == 8

    proc = subprocess.run([*CLI, *args, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"8 complete ({len(finished)} resumed), 0 failed" in proc.stdout
    assert {p: (out / "points" / p / "wall.json").read_text() for p in finished} == walls  # not run again
    table, _ = load_sweep(out)
    assert (table["status"] == "complete").all()
    for point in table["point"]:
        run = load_run(out / "points" / point)
        assert run.status == "complete" and run.summary["completed"] == 300


def test_sigterm_stops_a_sweep_as_ctrl_c_does(tmp_path):
    out = tmp_path / "sweep"
    proc = subprocess.Popen(
        [*CLI, "sweep", "traces/a.json", *SWEEP_GRID, "--workers", "1", "--out", str(out), "-q"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not _complete_points(out):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # to the sweep only, as a job scheduler sends it
    _, stderr = _finish(proc)
    assert proc.returncode == 130, stderr
    line = _one_line(stderr)
    assert str(out / "sweep.parquet") in line and "--resume" in line
    table, _ = load_sweep(out)
    assert (table["status"] == "complete").sum() >= 1 and (table["status"] == "pending").any()


def _point_statuses(out: Path) -> dict[str, str]:
    """What each point folder holds: its run.json status."""
    return {d.name: json.loads((d / "run.json").read_text())["status"] for d in (out / "points").glob("*") if (d / "run.json").is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("group", [False, True], ids=["SIGTERM-to-the-sweep", "Ctrl-C-to-the-process-group"])
def test_a_stopped_sweep_starts_no_new_point_and_its_table_says_what_each_folder_holds(trace, tmp_path, group):
    """Two points running (7 s each) of four on two workers, then a stop: the sweep ends in
    seconds, no third point starts, the two end "incomplete", and sweep.parquet says so."""
    out = tmp_path / "sweep"
    grid = ["--grid", "policy=fcfs,lpm", "--grid", "chunked-prefill-size=4096,8192"]
    proc = subprocess.Popen(
        [*CLI, "sweep", str(trace), *grid, "--workers", "2", "--out", str(out), "-q"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while list(_point_statuses(out).values()) != ["running", "running"]:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    running = set(_point_statuses(out))
    stopped_at = time.monotonic()
    if group:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
    else:
        proc.send_signal(signal.SIGTERM)  # to the sweep only, as a job scheduler sends it
    _, stderr = _finish(proc)
    assert proc.returncode == 130, stderr
    assert time.monotonic() - stopped_at < 30
    line = _one_line(stderr)
    assert "2 stopped mid-run (incomplete), 2 not started" in line and "--resume" in line
    assert _point_statuses(out) == {name: "incomplete" for name in running}  # no new point started
    table, _ = load_sweep(out)
    held = _point_statuses(out)
    assert dict(zip(table["point"], table["status"])) == {p: held.get(p, "pending") for p in table["point"]}


def test_a_journal_batch_cut_short_by_a_kill_is_left_out(tmp_path):
    """What a kill in the middle of an append leaves: the batches before it read, the torn one not."""
    path = tmp_path / "steps.journal.arrows"
    journal = TableJournal(path, STEP_SCHEMA)
    rows = {f.name: (["decode"] * 3 if f.name == "mode" else list(range(3))) for f in STEP_SCHEMA}
    journal.append(rows)
    whole = path.stat().st_size
    journal.append(rows)
    assert is_locked(path) and len(read_journal(path, STEP_SCHEMA)) == 6
    journal.close()
    assert not is_locked(path)
    data = path.read_bytes()
    for cut in (whole + 1, whole + 40, len(data) - 9):
        path.write_bytes(data[:cut])
        assert read_journal(path, STEP_SCHEMA).column("step").to_pylist() == [0, 1, 2]
    for cut in (0, 5):
        path.write_bytes(data[:cut])
        assert len(read_journal(path, STEP_SCHEMA)) == 0


def test_a_run_killed_under_an_older_testbed_still_loads(tmp_path):
    """A requests journal written before a column existed (`queued`, the scheduler's intake) reads with
    the columns it has, and the run's summary comes from them."""
    old = pa.schema([f for f in REQUESTS_SCHEMA if f.name != "queued"])
    journal = TableJournal(tmp_path / "requests.journal.arrows", old)
    given = {"rid": ["r0", "r1"], "status": ["finished"] * 2, "reason": ["length"] * 2, "token_times": [[0.5], [1.5, 2.0]]}
    journal.append({f.name: given.get(f.name, [0.0, 1.0] if f.type == pa.float64() else [0, 1]) for f in old})
    journal.close()
    table = read_journal(tmp_path / "requests.journal.arrows", REQUESTS_SCHEMA)
    assert table.num_rows == 2 and "queued" not in table.column_names
    assert summarize(table.to_pandas())["completed"] == 2
