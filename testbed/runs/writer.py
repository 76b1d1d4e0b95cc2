"""RunWriter: a run folder written as the run goes, so that a crash leaves it readable.

It opens the folder (run.json with status "running", and the journals, see folder.py),
appends the new steps and the newly finished requests to the journals about once a
second (checked after every step: a clock read), and at the end writes the requests
table and run.json's status and summary from memory and removes the journals. The steps
table is written as the run goes, a part at a time on a thread of its own (steps_file.py).

Flushing by time keeps the cost flat whatever the run's pace: a simulation makes ~15k
steps a second, so one flush appends a batch of ~15k rows (a few ms); a real engine makes
tens of steps a second, and a flush is then a few rows. A SIGKILL loses at most the last
interval.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

from scheduler.core.req import Req
from scheduler.loop.step_log import StepLog
from testbed.interrupts import deferred_interrupts
from testbed.runs import metrics
from testbed.runs.folder import (
    REQUESTS_FILE,
    REQUESTS_JOURNAL,
    RUN_FILE,
    STEP_SCHEMA,
    STEPS_FILE,
    STEPS_JOURNAL,
    WALL_FILE,
    temporary_path,
    write_json,
    write_requests,
)
from testbed.runs.journal import TableJournal
from testbed.runs.steps_file import StepsFile

FLUSH_INTERVAL_S = 1.0


class RunWriter:
    def __init__(self, run_dir: Path, meta: dict, flush_interval_s: float = FLUSH_INTERVAL_S) -> None:
        """Empty run_dir of an earlier run's files and start this one: journals, then run.json."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in (REQUESTS_FILE, STEPS_FILE, WALL_FILE, REQUESTS_JOURNAL, STEPS_JOURNAL):
            (self.run_dir / stale).unlink(missing_ok=True)
        temporary_path(self.run_dir / STEPS_FILE).unlink(missing_ok=True)  # (a killed run's)
        self.flush_interval_s = flush_interval_s
        # The steps journal first: its lock says "a writer is alive" from before run.json says "running".
        self.steps = TableJournal(self.run_dir / STEPS_JOURNAL, STEP_SCHEMA)
        self.requests = TableJournal(self.run_dir / REQUESTS_JOURNAL, metrics.REQUESTS_SCHEMA)
        write_json(self.run_dir / RUN_FILE, meta)
        self._next_flush = time.monotonic() + flush_interval_s
        self.steps_file = StepsFile(self.run_dir / STEPS_FILE)  # steps.parquet, written as the run goes

    def after_step(self, steps: StepLog, done: Sequence[Req]) -> None:
        """Called after every step: hands steps.parquet its next part when the log has one, and
        flushes the journals when the interval has passed."""
        if len(steps) >= self.steps_file.next_part_at:  # (one compare a step: this runs after every step)
            with deferred_interrupts():  # a part is handed over whole (and counted) or not at all
                self.steps_file.append(steps.columns(self.steps_file.rows, len(steps)))
        if time.monotonic() >= self._next_flush:
            self.flush(steps, done)

    def flush(self, steps: StepLog, done: Sequence[Req]) -> None:
        """Append the steps and the finished (or rejected) requests not in the journals yet."""
        with deferred_interrupts():  # a batch is written whole or not at all
            if len(steps) > self.steps.rows:
                self.steps.append(steps.columns(self.steps.rows, len(steps)))
            if len(done) > self.requests.rows:
                self.requests.append(metrics.requests_columns(done[self.requests.rows :]))
        self._next_flush = time.monotonic() + self.flush_interval_s

    def finish_steps(self, steps: StepLog) -> None:
        """Hand steps.parquet the rest of the log (the run's steps are all made) to finish on
        its thread: pyarrow encodes without holding the GIL, so that takes no time from what
        the run does meanwhile (its requests table and summary). finish() waits for it."""
        self.steps_file.close(steps.columns(self.steps_file.rows, len(steps)))

    def finish(self, meta: dict, requests: Mapping[str, Any], wall_s: float) -> None:
        """The requests table (metrics.requests_table's columns, or its frame), the steps table's end (finish_steps, called before), run.json (its
        status and summary) and wall.json; the journals go. A second Ctrl-C meanwhile waits until
        all is written."""
        with deferred_interrupts():
            write_requests(self.run_dir / REQUESTS_FILE, requests)
            assert self.steps_file.closed, "finish() before finish_steps()"
            self.steps_file.result()  # (raises what the writing raised)
            created = datetime.now(timezone.utc).isoformat(timespec="seconds")
            write_json(self.run_dir / WALL_FILE, {"created_at": created, "wall_s": round(wall_s, 3)})
            # run.json last of the tables: once it says complete, every file of the run is there.
            write_json(self.run_dir / RUN_FILE, meta)
            self.requests.close(remove=True)
            self.steps.close(remove=True)  # last: its lock is the writer's
