"""validate's journal (testbed/validate/journal.py): a validate stopped with Ctrl-C keeps the points
it finished in --out, and the same command resumes from them to the table an unbroken run prints;
a journal of other code, another points file or other options is never taken."""

from __future__ import annotations

import csv
import dataclasses
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.validate.journal import JOURNAL_NAME, Journal, JournalRecord, source_digest
from testbed.validate.points import default_points_path, load_points
from testbed.validate.report import PointResult

REPO = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "testbed.cli", "validate"]


def _points_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: v for k, v in r.items() if k != "sim_seconds"} for r in csv.DictReader(f)]  # a time, not a result


@pytest.fixture(scope="module")
def sglang_file(tmp_path_factory) -> Path:
    """24 real rows: SGLang Qwen3-32B on H100s (a fraction of a second each to simulate)."""
    with open(default_points_path(), newline="") as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader if r["system"] == "h100_sxm" and r["backend"] == "sglang" and r["mode"] == "agg"][:24]
        header = reader.fieldnames
    path = tmp_path_factory.mktemp("journal") / "points.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.mark.slow
def test_a_stopped_validate_resumes_where_it_stopped_to_the_unbroken_runs_table(sglang_file, tmp_path):
    args = [*CLI, "--points", str(sglang_file), "--no-aiconfigurator", "-j", "2"]
    unbroken = subprocess.run([*args, "-q", "--out", str(tmp_path / "unbroken")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert unbroken.returncode == 0, unbroken.stderr

    out = tmp_path / "stopped"
    proc = subprocess.Popen([*args, "-q", "--out", str(out)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = out / JOURNAL_NAME
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.is_file() and len(journal.read_text().splitlines()) >= 2:  # the record and a point at least
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.splitlines() == [
        f"validate: stopped; the points done are kept in {journal}: the same command resumes",
        "testbed: interrupted",
    ]
    kept = len(journal.read_text().splitlines()) - 1
    assert 0 < kept < 24, f"{kept} points kept: the stop came before the first or after the last"
    assert not (out / "points.csv").exists()

    resumed = subprocess.run([*args, "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"validate: resuming from {journal} ({kept} points done)" in resumed.stderr
    assert f"{kept} of them from {journal}" in resumed.stdout
    assert resumed.stdout.splitlines()[-1].split("   (")[0] == unbroken.stdout.splitlines()[-1].split("   (")[0]
    assert _points_csv(out / "points.csv") == _points_csv(tmp_path / "unbroken" / "points.csv")

    again = subprocess.run([*args, "-q", "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert "24 of them from" in again.stdout  # done: the same command prints the table from the journal


def _results(n: int) -> list[PointResult]:
    """Results of the default file's first n points, with figures of their own."""
    points = load_points(default_points_path())[:n]
    return [PointResult(p, sim_ttft_ms=100.0 + p.line / 7, sim_tpot_ms=p.line / 3, harness="fixed", sim_seconds=0.5) for p in points]


def test_a_journal_is_taken_only_with_the_record_it_was_written_under(tmp_path):
    record = JournalRecord.of(default_points_path(), "auto", "together", True)
    journal = Journal.open(tmp_path, record)
    assert not journal.kept and journal.started_afresh_because is None
    results = _results(5)
    journal.add(results[:3])
    points = [r.point for r in results]

    same = Journal.open(tmp_path, record).results_for(points)
    assert same == {i: results[i] for i in range(3)}  # every field as it was written, floats bit for bit

    for change, named in (({"phase": "spread"}, "--phase"), ({"source_sha256": "0" * 64}, "the simulator's source")):
        other = Journal.open(tmp_path, dataclasses.replace(record, **change))
        assert other.results_for(points) == {} and other.started_afresh_because == f"{named} changed since it was written"
        journal = Journal.open(tmp_path, record)  # the other record replaced it: nothing of the first is left
        assert journal.results_for(points) == {}
        journal.add(results[:3])


def test_a_line_cut_short_or_of_another_point_is_not_taken(tmp_path):
    record = JournalRecord.of(default_points_path(), "auto", "together", False)
    results = _results(4)
    Journal.open(tmp_path, record).add(results)
    path = tmp_path / JOURNAL_NAME
    lines = path.read_text().splitlines()
    lines[-1] = lines[-1][: len(lines[-1]) // 2]  # killed while it was written
    path.write_text("\n".join(lines) + "\n")
    points = [r.point for r in results]
    points[0] = dataclasses.replace(points[0], id="another point at its line")
    assert set(Journal.open(tmp_path, record).results_for(points)) == {1, 2}


def test_the_source_digest_follows_every_byte_of_the_packages(tmp_path):
    for package in ("scheduler", "simulator", "testbed"):
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "sub" / "costs.py").write_text("LAYER_S = 0.8e-3\n")
    before = source_digest(tmp_path)
    (tmp_path / "simulator" / "sub" / "__pycache__").mkdir()
    (tmp_path / "simulator" / "sub" / "__pycache__" / "costs.pyc").write_bytes(b"\0")
    assert source_digest(tmp_path) == before  # a cache is not the source
    (tmp_path / "simulator" / "sub" / "costs.py").write_text("LAYER_S = 0.9e-3\n")
    assert source_digest(tmp_path) != before
