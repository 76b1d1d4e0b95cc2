"""Where the points of a sweep run: a pool of local processes, or a Ray cluster (ray_runner)."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Protocol, Sequence

from testbed.interrupts import ignore_stop_signals
from testbed.studies.points import OnResult, PointResult, SweepPoint, run_point


class Runner(Protocol):
    """Runs points somewhere and reports each result as it arrives."""

    description: str

    def run(self, trace_path: str, points: Sequence[SweepPoint], on_result: OnResult) -> None: ...

    def close(self) -> None: ...


class LocalRunner:
    """Points on a pool of local processes (each loads the trace itself: cheap next to a replay).
    The pool is kept between calls (a capacity search runs many rounds)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.description = f"{workers} local process{'es' if workers != 1 else ''}"
        self._pool: ProcessPoolExecutor | None = None

    def run(self, trace_path: str, points: Sequence[SweepPoint], on_result: OnResult) -> None:
        if not points:
            return
        if self._pool is None:
            # A worker between points ignores Ctrl-C and SIGTERM (it would die printing a traceback);
            # during a point, replay's own handlers stop the replay, leaving its folder incomplete.
            self._pool = ProcessPoolExecutor(max_workers=self.workers, initializer=ignore_stop_signals)
        futures = {self._pool.submit(run_point, trace_path, p): p for p in points}
        broken = False
        try:
            for future in as_completed(futures):
                point = futures[future]
                try:
                    result = future.result()
                except Exception as e:  # noqa: BLE001 - BrokenProcessPool: a worker died (killed, out of memory)
                    broken = True
                    result = PointResult(point.name, "failed", None, f"{type(e).__name__}: {e}")
                on_result(point, result)
        except KeyboardInterrupt:
            self._stop_workers()
            raise
        if broken:  # a broken pool takes no more work
            self.close()

    def _stop_workers(self) -> None:
        """Ctrl-C in a terminal reaches the workers too; a SIGTERM to this process alone does not:
        send it on, so that their replays stop as this one does (folders marked incomplete)."""
        for process in list((getattr(self._pool, "_processes", None) or {}).values()):
            if process.is_alive():
                process.terminate()  # SIGTERM: replay's handler stops the point running there

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_runner(workers: int | None, ray_address: str | None) -> Runner:
    if ray_address is not None:
        from testbed.studies.ray_runner import RayRunner

        return RayRunner(ray_address)
    return LocalRunner(workers or os.cpu_count() or 1)
