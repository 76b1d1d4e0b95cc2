"""steps.parquet written a part at a time as the run goes (testbed/runs/steps_file.py): the
file holds the same table as one written at the end, byte for byte the same from two
identical replays, and a failed write leaves no steps.parquet and no temporary file."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs import steps_file
from testbed.runs.folder import STEPS_FILE, load_run, temporary_path
from testbed.runs.steps_file import StepsFile
from testbed.traces.gen import GenConfig, generate_trace

OPTIONS = dict(overlap=True, page_size=16, chunked_prefill_size=128, kv_tokens=3000, seed=42)


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "t.json"
    generate_trace(GenConfig(num_requests=30, rate=20.0, seed=5)).write(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("fast_forward", [True, False], ids=["fast-forward", "stepping"])
def test_steps_written_in_parts_equal_steps_written_at_the_end(trace_path, tmp_path, monkeypatch, fast_forward):
    opts = ReplayOptions(fast_forward=fast_forward, **OPTIONS)
    whole = replay(str(trace_path), opts, out=tmp_path / "whole")  # shorter than one part: one write at the end
    monkeypatch.setattr(steps_file, "ROWS_PER_PART", 97)
    parts = replay(str(trace_path), opts, out=tmp_path / "parts")
    again = replay(str(trace_path), opts, out=tmp_path / "again")

    assert pq.ParquetFile(tmp_path / "whole" / STEPS_FILE).metadata.num_row_groups == 1
    num_steps = whole.summary["num_steps"]
    groups = pq.ParquetFile(tmp_path / "parts" / STEPS_FILE).metadata.num_row_groups
    assert num_steps > 3 * 97 and groups >= 3
    assert pq.read_table(tmp_path / "parts" / STEPS_FILE).equals(pq.read_table(tmp_path / "whole" / STEPS_FILE))
    assert load_run(parts.run_dir).steps.equals(load_run(whole.run_dir).steps)
    # Parts begin at row counts, never at times: the same inputs give the same file.
    assert (tmp_path / "parts" / STEPS_FILE).read_bytes() == (tmp_path / "again" / STEPS_FILE).read_bytes()
    assert again.summary == parts.summary == whole.summary
    assert not temporary_path(tmp_path / "parts" / STEPS_FILE).exists()


def test_a_killed_runs_temporary_steps_file_goes_with_the_next_run(trace_path, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    temporary_path(out / STEPS_FILE).write_bytes(b"PAR1 half a file")
    replay(str(trace_path), ReplayOptions(**OPTIONS), out=out)
    assert not temporary_path(out / STEPS_FILE).exists()
    assert len(pq.read_table(out / STEPS_FILE)) == load_run(out).summary["num_steps"]


def test_a_failed_part_is_raised_and_leaves_no_steps_file(trace_path, tmp_path, monkeypatch):
    """The second part's write fails (a full disk, say): the parts after it are not written,
    result() raises the failure, and neither steps.parquet nor its temporary file is left."""
    replay(str(trace_path), ReplayOptions(**OPTIONS), out=tmp_path / "run")
    cols = load_run(tmp_path / "run").steps.to_dict("list")
    n = len(cols["step"])
    third = n // 3

    class DiskFull(pq.ParquetWriter):
        parts = 0

        def write_table(self, table, row_group_size=None):
            DiskFull.parts += 1
            if DiskFull.parts == 2:
                raise OSError("No space left on device")
            super().write_table(table, row_group_size)

    monkeypatch.setattr(steps_file.pq, "ParquetWriter", DiskFull)
    path = tmp_path / "out" / STEPS_FILE
    path.parent.mkdir()
    f = StepsFile(path)
    for a, b in ((0, third), (third, 2 * third)):
        f.append({k: v[a:b] for k, v in cols.items()})
    f.close({k: v[2 * third :] for k, v in cols.items()})
    with pytest.raises(OSError, match="No space left"):
        f.result()
    assert DiskFull.parts == 2  # the last part was not written after the failure
    assert not path.exists() and not temporary_path(path).exists()
