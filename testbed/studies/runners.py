"""Where the points of a sweep run: a pool of local processes, or a Ray cluster (ray_runner)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Protocol, Sequence

from testbed.interrupts import STOP_SIGNALS, interrupt_once
from testbed.studies.points import DRAIN_S, OnResult, PointResult, SweepPoint, run_point_until_stopped


class Runner(Protocol):
    """Runs points somewhere and reports each result as it arrives. On KeyboardInterrupt it starts
    no new point, stops the running ones (their folders end "incomplete"), reports those, and
    raises KeyboardInterrupt; a point that never started is not reported."""

    description: str

    def run(self, trace_path: str, points: Sequence[SweepPoint], on_result: OnResult) -> None: ...

    def close(self) -> None: ...


# --- a worker process of LocalRunner ---------------------------------------------------------

_stop_event = None  # set by the sweep's process when it stops: start no more points
_stop_signalled = False  # this worker got SIGINT/SIGTERM: start no more points


def _init_worker(stop_event) -> None:
    """Between points a stop signal is noted, not raised (a traceback would be all it gave)."""
    global _stop_event
    _stop_event = stop_event
    for sig in STOP_SIGNALS:
        signal.signal(sig, _note_stop)


def _note_stop(signum, frame) -> None:
    global _stop_signalled
    _stop_signalled = True


def _run_point_in_worker(trace_path: str, point: SweepPoint) -> PointResult | None:
    """The point, unless the sweep is stopping (None: not started). The check is made with the
    stop signals raising, so a signal cannot slip in between the check and the replay."""
    global _stop_signalled
    try:
        with interrupt_once():
            if _stop_signalled or _stop_event.is_set():
                return None
            return run_point_until_stopped(trace_path, point)
    except KeyboardInterrupt:  # a stop before the replay took over its signals
        return None
    finally:
        _stop_signalled = _stop_signalled or _stop_event.is_set()


# --- the runner -----------------------------------------------------------------------------


class LocalRunner:
    """Points on a pool of local processes (each loads the trace itself: cheap next to a replay).
    The pool is kept between calls (a capacity search runs many rounds)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.description = f"{workers} local process{'es' if workers != 1 else ''}"
        self._pool: ProcessPoolExecutor | None = None
        self._stop = multiprocessing.get_context().Event()

    def run(self, trace_path: str, points: Sequence[SweepPoint], on_result: OnResult) -> None:
        if not points:
            return
        if self._pool is None:
            self._stop.clear()
            self._pool = ProcessPoolExecutor(max_workers=self.workers, initializer=_init_worker, initargs=(self._stop,))
        futures = {self._pool.submit(_run_point_in_worker, trace_path, p): p for p in points}
        reported: set[Future] = set()
        broken = False

        def report(future: Future) -> None:
            nonlocal broken
            reported.add(future)
            try:
                result = future.result()
            except Exception as e:  # noqa: BLE001 - BrokenProcessPool: a worker died (killed, out of memory)
                broken = True
                result = PointResult(futures[future].name, "failed", None, f"{type(e).__name__}: {e}")
            if result is not None:
                on_result(futures[future], result)

        with interrupt_once():  # a second Ctrl-C while the running points write their folders is ignored
            try:
                for future in as_completed(futures):
                    report(future)
            except KeyboardInterrupt:
                self._stop_points(futures)
                late = False
                try:
                    for future in as_completed([f for f in futures if f not in reported and not f.cancelled()], timeout=DRAIN_S):
                        report(future)
                except FuturesTimeout:
                    late = True
                self.close(kill=late)
                raise
        if broken:  # a broken pool takes no more work
            self.close()

    def _stop_points(self, futures: dict[Future, SweepPoint]) -> None:
        """No point starts from now on; the running ones stop. Ctrl-C in a terminal reaches the
        workers too; a SIGTERM to this process alone does not: send it on, so that their replays
        stop as this one does (folders marked incomplete)."""
        self._stop.set()
        for future in futures:
            future.cancel()  # the ones no worker has taken yet
        for process in self._processes():
            process.terminate()  # SIGTERM: the replay running there stops; an idle worker starts nothing

    def _processes(self) -> list:
        return [p for p in (getattr(self._pool, "_processes", None) or {}).values() if p.is_alive()]

    def close(self, kill: bool = False) -> None:
        if self._pool is not None:
            if kill:  # a point still writing after DRAIN_S
                for process in self._processes():
                    process.kill()
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
