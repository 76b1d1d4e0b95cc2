"""An append-only table on disk: the rows a run has so far, readable even if the writer was killed.

The file is an Arrow IPC stream: a schema, then one record batch per append, each written
whole by one write. A reader takes every batch that is complete and drops a last one cut
short (the process was killed in the middle of writing it), so after a SIGKILL the table
holds every row appended up to the last append. Appends take columns of many rows (numpy
arrays or lists), so a writer that builds its rows in bulk hands them over as they are.

Why a stream and not parquet row groups: a parquet file can be read only once its footer
is written, at close; a killed writer leaves none. The run folder's parquet files are
finished at the end of a run, from memory (steps.parquet's earlier parts as the run goes,
under a temporary name: steps_file.py).
"""

from __future__ import annotations

import fcntl
import os
from array import array
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa


class TableJournal:
    """Appends record batches to `path` (created, or emptied). While it is open the file holds
    an exclusive lock (flock), so a reader can tell a live writer from one that died."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path = Path(path)
        self.schema = schema
        self.rows = 0
        self._file = open(self.path, "wb", buffering=0)  # every batch reaches the OS at once
        fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None

    def append(self, columns: Mapping[str, Any]) -> None:
        """Append rows given as columns (every column of the schema, equal lengths): numpy arrays,
        typed arrays (array.array, not appended to any more), lists; a list column as a sequence
        of numpy arrays."""
        batch = record_batch(columns, self.schema)
        if batch.num_rows == 0:
            return
        if self._writer is None:
            self._writer = pa.ipc.new_stream(pa.PythonFile(self._file, mode="w"), self.schema)
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def close(self, remove: bool = False) -> None:
        """Close (releasing the lock); with remove, delete the file first (its rows are elsewhere now)."""
        if self._file.closed:
            return
        if remove:
            self.path.unlink(missing_ok=True)  # first: no moment where a reader sees it unlocked
        if self._writer is not None:
            self._writer.close()
        self._file.close()


def record_batch(columns: Mapping[str, Any], schema: pa.Schema) -> pa.RecordBatch:
    """The columns (as TableJournal.append takes them) as a record batch of the schema."""
    return pa.record_batch([_arrow(columns[f.name], f.type) for f in schema], schema=schema)


def _arrow(values: Any, type: pa.DataType) -> pa.Array:
    if pa.types.is_list(type):
        # Offsets and one flat array: pa.array over a list of arrays goes element by element.
        lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        flat = np.concatenate(values) if len(values) else np.empty(0)
        return pa.ListArray.from_arrays(offsets, pa.array(flat, type=type.value_type))
    if isinstance(values, array):
        values = np.asarray(values)  # its buffer, not a Python int per element
    return pa.array(values, type=type)


def is_locked(path: Path) -> bool:
    """True while a TableJournal (of any process) has `path` open for writing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the shared lock, if it was taken
    return False


def read_journal(path: Path, schema: pa.Schema) -> pa.Table:
    """Every complete batch of a journal (no rows if it is empty or absent); a batch cut short
    at the end is left out. The table has the columns the journal was written with (an older
    testbed's run may lack some of `schema`'s); `schema` shapes only the empty table."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return schema.empty_table()
    batches = []
    try:
        reader = pa.ipc.open_stream(pa.BufferReader(data))
        while True:
            batches.append(reader.read_next_batch())
    except StopIteration:
        pass
    except (pa.ArrowInvalid, OSError):
        pass  # a header or batch cut short by a kill: the batches before it stand
    return pa.Table.from_batches(batches) if batches else schema.empty_table()
