"""validate's journal: each point's result kept as it is done, so that a stopped run resumes.

With `--out DIR`, validate appends every finished point's result to DIR/validate-journal.jsonl (the
parent process writes it, a line a point, flushed as each worker's chunk comes back). The first
line records what the results depend on:

- the points file's bytes (sha256);
- `--harness`, `--phase` and whether AIConfigurator estimated the points;
- aiconfigurator-core's version (its kernel database and SDK);
- the simulator's own source: a sha256 of the scheduler, simulator and testbed packages' files.

A later validate with the same `--out` and the same record takes the recorded results and simulates
only the points not in it (a filter may differ: results are kept by the point's line in the file).
A journal of any other record, or none, starts afresh. The journal stays after the run, so the
same command again prints its tables at once; a change to the code, the file or the options
starts it anew. A line cut short by a kill is dropped on reading.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields
from importlib import metadata
from pathlib import Path

from testbed.interrupts import deferred_interrupts
from testbed.validate.points import MeasuredPoint
from testbed.validate.report import PointResult

JOURNAL_NAME = "validate-journal.jsonl"
SOURCE_PACKAGES = ("scheduler", "simulator", "testbed")  # what a simulated point's result is computed by
REPO_ROOT = Path(__file__).resolve().parents[2]  # where SOURCE_PACKAGES lie
RESULT_FIELDS = tuple(f.name for f in fields(PointResult) if f.name != "point")


def source_digest(root: Path = REPO_ROOT) -> str:
    """sha256 of the simulator's packages under root: every file, by path and bytes (no caches)."""
    h = hashlib.sha256()
    for package in SOURCE_PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class JournalRecord:
    """What a journal's results depend on (its first line)."""

    points_sha256: str
    harness: str
    phase: str
    aiconfigurator_estimate: bool
    aiconfigurator_core: str
    source_sha256: str

    @classmethod
    def of(cls, points_path: Path, harness: str, phase: str, with_estimate: bool) -> "JournalRecord":
        try:
            aic = metadata.version("aiconfigurator-core")
        except metadata.PackageNotFoundError:
            aic = "not installed"
        digest = hashlib.sha256(points_path.read_bytes()).hexdigest()
        return cls(digest, harness, phase, with_estimate, aic, source_digest())


class Journal:
    """An open journal: the results it held when opened, and where new ones are appended."""

    def __init__(self, path: Path, record: JournalRecord, kept: dict[int, dict], started_afresh_because: str | None) -> None:
        self.path = path
        self.record = record
        self.kept = kept  # point line -> its recorded result's fields (and id)
        self.started_afresh_because = started_afresh_because  # None: resumed, or there was none

    @classmethod
    def open(cls, out: Path, record: JournalRecord) -> "Journal":
        """The journal in `out`: resumed if its record is this one, else started afresh."""
        path = out / JOURNAL_NAME
        kept: dict[int, dict] = {}
        why = None
        if path.is_file():
            lines = path.read_text().splitlines()
            found = _record_of(lines[0]) if lines else None
            if found == record:
                kept = _results_of(lines[1:])
            else:
                why = _difference(found, record)
        if not kept:
            out.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(record)) + "\n")
            os.replace(tmp, path)
        return cls(path, record, kept, why)

    def results_for(self, points: list[MeasuredPoint]) -> dict[int, PointResult]:
        """The kept results of these points, by their index in the list (a point whose line holds
        another id is not taken: the file changed, which its sha256 would have said)."""
        found: dict[int, PointResult] = {}
        for i, p in enumerate(points):
            kept = self.kept.get(p.line)
            if kept is not None and kept["id"] == p.id:
                found[i] = PointResult(p, **{k: kept[k] for k in RESULT_FIELDS})
        return found

    def add(self, results: list[PointResult]) -> None:
        """Append these results, one line each, flushed to the disk before returning (a Ctrl-C
        meanwhile waits for the lines to be whole)."""
        with deferred_interrupts(), open(self.path, "a") as f:
            for r in results:
                f.write(json.dumps({"line": r.point.line, "id": r.point.id, **{k: getattr(r, k) for k in RESULT_FIELDS}}) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _record_of(line: str) -> JournalRecord | None:
    try:
        return JournalRecord(**json.loads(line))
    except (ValueError, TypeError):
        return None


def _results_of(lines: list[str]) -> dict[int, dict]:
    kept: dict[int, dict] = {}
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill while it was written
        if isinstance(r, dict) and {"line", "id", *RESULT_FIELDS} <= r.keys():
            kept[r["line"]] = r
    return kept


def _difference(found: JournalRecord | None, record: JournalRecord) -> str:
    """Why a journal's results cannot be taken, in a few words."""
    if found is None:
        return "its first line is not a journal's record"
    names = {
        "points_sha256": "the points file",
        "harness": "--harness",
        "phase": "--phase",
        "aiconfigurator_estimate": "--no-aiconfigurator",
        "aiconfigurator_core": "aiconfigurator-core's version",
        "source_sha256": "the simulator's source",
    }
    changed = [names[k] for k in names if getattr(found, k) != getattr(record, k)]
    return f"{' and '.join(changed)} changed since it was written"
