"""StepsFile: steps.parquet written a part at a time while the run goes, on a thread of its own.

A simulated replay makes ~150k steps in well under a second. Made and encoded at the end, the
whole table was one row group, built in memory beside the step log's columns (the light
trace's peak RSS: 230 MB then, 207 MB in parts), and the run then waited 13-32 ms for its
encoding. Here the log's rows are handed over a part at a time as the run reaches them
(ROWS_PER_PART rows or more: RunWriter.after_step looks after every step): the part's table is
made on the caller's thread and encoded as a row group of the file on a writer thread, which
holds no GIL while it encodes; at the end only the last part is left to write.

Where parts begin depends only on the row counts after each step, never on the clock: two
replays of the same inputs write the same row groups, byte for byte. A run shorter than one
part is written at its end in one go, exactly as before (folder.write_steps).

The parts go to a temporary file, renamed when it is whole (as the other files of a run
folder are): a reader never sees half a file. A killed run leaves the temporary file behind,
with its journals, which are what load_run reads; the next run in the folder removes it.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from testbed.runs.folder import (
    STEPS_DICTIONARY_COLUMNS,
    STEPS_FILE_SCHEMA,
    steps_table,
    temporary_path,
    write_steps,
)

# Rows a part holds at least: a row group of ~2.5 MB; a replay of 150k steps writes ~5.
ROWS_PER_PART = 32_768


class StepsFile:
    """steps.parquet of one run: append() its parts in row order, close() with the rest, then
    result() waits until the file is whole."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.rows = 0  # rows handed over so far
        self.next_part_at = ROWS_PER_PART  # a log this long has a part to hand over
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(max_workers=1, thread_name_prefix="write-steps")
        self._writes: list[Future] = []  # in order: one thread runs them one after another
        # The writer thread's own (the main thread never reads them):
        self._writer: pq.ParquetWriter | None = None
        self._failed = False

    def append(self, cols: dict) -> None:
        """Hand over the next rows (StepLog.columns of rows self.rows on): they are written as a
        row group, after the parts before. Their table is made here: the thread only encodes,
        which holds no GIL (made there, its conversions would wait for the loop to yield the
        GIL, 5 ms at a time, and the loop for them)."""
        assert self._pool is not None, "a part after close()"
        n = len(cols["step"])
        if n:
            self._writes.append(self._pool.submit(self._write_part, steps_table(cols)))
            self.rows += n
            self.next_part_at = self.rows + ROWS_PER_PART

    def close(self, cols: dict) -> None:
        """Hand over the last rows (maybe none) and finish the file; the thread ends after it.
        result() waits for it."""
        assert self._pool is not None, "close() twice"
        if self.rows == 0:  # a run shorter than a part: one write, as before
            self._writes.append(self._pool.submit(write_steps, self.path, cols))
        else:
            self.append(cols)
            self._writes.append(self._pool.submit(self._finish))
        self._pool.shutdown(wait=False)
        # Let go of the pool now, so that its thread's last reference is the thread's own: its
        # end frees it there. Freed later by the main thread, it would run concurrent.futures'
        # weakref callback there, where a Ctrl-C raised inside is swallowed ("Exception ignored").
        self._pool = None

    @property
    def closed(self) -> bool:
        """close() was called: every row is handed over."""
        return self._pool is None

    def result(self) -> None:
        """Wait until the file is written (or its writing failed); raise what the writing raised."""
        wait(self._writes)  # all of them: the last one cleans up after a failure
        for write in self._writes:
            write.result()

    # -- on the writer thread ---------------------------------------------------------
    def _write_part(self, table: pa.Table) -> None:
        if self._failed:
            return  # (the part before raised: result() raises that)
        try:
            if self._writer is None:
                self._writer = pq.ParquetWriter(temporary_path(self.path), STEPS_FILE_SCHEMA, use_dictionary=STEPS_DICTIONARY_COLUMNS)
            self._writer.write_table(table)
        except BaseException:
            self._failed = True
            raise

    def _finish(self) -> None:
        tmp = temporary_path(self.path)
        try:
            if self._writer is not None:
                self._writer.close()  # (the footer: only now is the file readable)
        except BaseException:
            self._failed = True
            raise
        finally:
            if self._failed:
                tmp.unlink(missing_ok=True)
        if not self._failed:
            os.replace(tmp, self.path)
