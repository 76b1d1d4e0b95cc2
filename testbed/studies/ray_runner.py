"""Sweep points as Ray tasks (`--ray ADDRESS` or `--ray auto`); Ray is an optional extra.

Each point is one task running testbed.studies.points.run_point, the function local processes
run, so a Ray sweep writes the same run folders and the same sweep.parquet. On a
cluster of more than one machine every node needs this package installed and must see
the trace and the --out folder at the same path (a shared filesystem): the tasks write
the run folders themselves.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Sequence

from testbed.errors import ConfigError
from testbed.interrupts import interrupt_once
from testbed.studies.points import DRAIN_S, OnResult, PointResult, SweepPoint, run_point_until_stopped


def _check_reachable(address: str) -> None:
    """Fail fast on a HOST:PORT nothing listens on: Ray itself retries for minutes."""
    host, sep, port = address.split("://")[-1].rpartition(":")
    if not sep or not port.isdigit():
        return  # not HOST:PORT: Ray says what it makes of it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        raise ConfigError(f"--ray {address}: cannot reach {host}:{port} ({e.strerror or e})") from None


class RayRunner:
    def __init__(self, address: str) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("--ray: Ray is not installed (pip install .[ray])") from None
        self._ray = ray
        self._owns = False  # shut down only a connection this runner made
        if not ray.is_initialized():
            if address != "auto":
                _check_reachable(address)
            try:
                if address == "auto":
                    try:
                        ray.init(address="auto", logging_level=logging.WARNING)
                    except ConnectionError:  # no running cluster: start one here
                        ray.init(logging_level=logging.WARNING, include_dashboard=False)
                else:
                    ray.init(address=address, logging_level=logging.WARNING)
            except (ConnectionError, ValueError, RuntimeError) as e:
                first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise ConfigError(f"--ray {address}: cannot connect to Ray: {first_line}") from None
            self._owns = True
        cpus = int(ray.cluster_resources().get("CPU", 0))
        self.description = f"Ray ({cpus} CPUs)"
        self._task = ray.remote(num_cpus=1)(run_point_until_stopped)

    def run(self, trace_path: str, points: Sequence[SweepPoint], on_result: OnResult) -> None:
        ray = self._ray
        # Workers do not share this process's working directory; run.json records this path.
        trace_path = os.path.abspath(trace_path)
        by_ref = {self._task.remote(trace_path, p): p for p in points}
        pending = list(by_ref)

        def report(ref) -> None:
            point = by_ref[ref]
            try:
                result = ray.get(ref)
            except ray.exceptions.TaskCancelledError:
                return  # stopped before it started
            except Exception as e:  # noqa: BLE001 - a task that died (worker crash, node lost)
                first_line = (str(e).strip().splitlines() or [""])[0]
                result = PointResult(point.name, "failed", None, f"{type(e).__name__}: {first_line}")
            if result is not None:
                on_result(point, result)

        with interrupt_once():  # a second Ctrl-C while the running points write their folders is ignored
            try:
                while pending:
                    done, pending = ray.wait(pending, num_returns=1)
                    for ref in done:
                        report(ref)
            except KeyboardInterrupt:
                # Queued tasks never start; a running one gets a KeyboardInterrupt, which stops
                # its replay (folder marked incomplete) and comes back as its result.
                for ref in pending:
                    ray.cancel(ref)
                done, _ = ray.wait(pending, num_returns=len(pending), timeout=DRAIN_S)
                for ref in done:
                    report(ref)
                raise

    def close(self) -> None:
        if self._owns:
            self._ray.shutdown()
            self._owns = False

    def __enter__(self) -> RayRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
