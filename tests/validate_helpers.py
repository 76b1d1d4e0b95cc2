"""Real rows of AIConfigurator's silicon_sample.csv for the tests of `testbed validate`: finding a
point, and validating a one-row points file made of a real row with columns added."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from testbed.validate.points import MeasuredPoint, default_points_path

REPO = Path(__file__).resolve().parents[1]


def simulable_point(points: list[MeasuredPoint], **match) -> MeasuredPoint:
    """The first point the simulator can express whose fields equal `match`."""
    return next(p for p in points if p.skip_reason() is None and all(getattr(p, k) == v for k, v in match.items()))


def validate_one_row(path: Path, columns: dict[str, str], **match: str) -> subprocess.CompletedProcess:
    """`testbed validate --points path` on a file of one row: the default file's first row whose
    columns equal `match`, with `columns` added (or set)."""
    with open(default_points_path(), newline="") as f:
        reader = csv.DictReader(f)
        row = next(r for r in reader if all(r[k] == v for k, v in match.items()))
        header = [*(reader.fieldnames or []), *(c for c in columns if c not in (reader.fieldnames or []))]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerow({**row, **columns})
    cmd = [sys.executable, "-m", "testbed.cli", "validate", "--points", str(path), "--no-aiconfigurator", "-q"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
