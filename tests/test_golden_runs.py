"""The commands of tests/golden_runs.py write what they wrote when the golden folders were made.

A refactor must leave every table and every run.json field as it was; a change meant to
change results writes the golden folders again (tests/golden_runs.py) and says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from golden_runs import GOLDEN_COMMANDS, GOLDEN_DIR, VOLATILE, run_command

# What differs between two runs of the same thing on two machines: the package versions,
# the wall time (sweep.parquet's column), and where the sweep folder was.
VOLATILE_META = ("versions",)
VOLATILE_COLUMNS = ("wall_s",)


def _files(root: Path) -> set[str]:
    return {str(f.relative_to(root)) for f in root.rglob("*") if f.is_file() and f.name not in VOLATILE}


def _assert_table_equal(got: Path, want: Path) -> None:
    g, w = pq.read_table(got), pq.read_table(want)
    assert g.schema.names == w.schema.names, f"{got.name}: columns differ"
    assert [str(t) for t in g.schema.types] == [str(t) for t in w.schema.types], f"{got.name}: column types differ"
    assert (g.schema.metadata or {}).get(b"testbed.sweep") == (w.schema.metadata or {}).get(b"testbed.sweep")
    gd, wd = g.to_pandas(), w.to_pandas()
    drop = [c for c in VOLATILE_COLUMNS if c in wd.columns]
    # Exact: a simulated run is reproducible to the bit on one machine; rtol covers a libm elsewhere.
    pd.testing.assert_frame_equal(gd.drop(columns=drop), wd.drop(columns=drop), check_exact=False, rtol=1e-12, atol=0)


def _assert_run_json_equal(got: Path, want: Path) -> None:
    g, w = json.loads(got.read_text()), json.loads(want.read_text())
    for key in VOLATILE_META:
        g.pop(key, None), w.pop(key, None)
    assert g == w, f"{got} differs from {want}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(GOLDEN_COMMANDS))
def test_command_writes_the_golden_folder(name, tmp_path):
    want_root = GOLDEN_DIR / name
    got_root = tmp_path / name
    proc = run_command(name, got_root)
    assert proc.returncode == 0, proc.stderr
    assert _files(got_root) == _files(want_root)
    for rel in sorted(_files(want_root)):
        got, want = got_root / rel, want_root / rel
        if rel.endswith(".parquet"):
            _assert_table_equal(got, want)
        elif rel.endswith(".json"):
            _assert_run_json_equal(got, want)
        else:
            assert got.read_bytes() == want.read_bytes(), rel
