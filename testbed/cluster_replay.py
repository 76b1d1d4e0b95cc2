"""replay --replicas N: the trace through a cluster of N simulated instances behind a router
(simulator/cluster/), into one run folder.

Every instance is the replay's own: the same scheduler, options, cost model and KV pool. The
requests table says which instance served each request (`instance`); the steps table holds
every instance's steps, in time order, each with its instance. run.json's `cluster` says how
many, which router and its view; the summary adds `instances` (per instance: requests completed,
throughputs, TTFT) and `load_imbalance` (the most requests an instance completed over the mean).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import pandas as pd

from scheduler.loop.step_log import StepLog
from simulator.cluster.cluster import Cluster
from simulator.cluster.routing import Policy, RoutingConfig, parse_weights
from simulator.driver.sim_driver import SimDriver
from testbed.interrupts import deferred_interrupts
from testbed.replay_result import ReplayProgress, ReplayResult, default_run_dir, run_meta
from testbed.runs import metrics
from testbed.runs.folder import check_out_folder
from testbed.runs.writer import RunWriter


class ClusterSteps:
    """The instances' step logs as one steps table, in time order (what RunWriter writes at the end);
    with roles (a PD cluster's: each log's instance's), a role column too."""

    def __init__(self, logs: list[StepLog], roles: list[str] | None = None) -> None:
        self.logs = logs
        self.roles = roles

    def __len__(self) -> int:
        return sum(len(log) for log in self.logs)

    def columns(self, start: int, stop: int) -> dict:
        parts = [log.columns(0, len(log)) for log in self.logs]
        order = np.argsort(np.concatenate([p["schedule_start"] for p in parts]), kind="stable")[start:stop]
        out = {}
        for name in parts[0]:
            if name == "mode":  # (a list of strings)
                modes = [m for p in parts for m in p[name]]
                out[name] = [modes[i] for i in order]
            else:
                out[name] = np.concatenate([p[name] for p in parts])[order]
        if self.roles is not None:
            roles = [role for role, p in zip(self.roles, parts) for _ in range(len(p["step"]))]
            out["role"] = [roles[i] for i in order]
        return out


def routing_config(opts) -> RoutingConfig:
    config = RoutingConfig(
        policy=opts.router,
        seed=opts.seed,
        cache_threshold=opts.cache_threshold,
        balance_abs_threshold=opts.balance_abs_threshold,
        balance_rel_threshold=opts.balance_rel_threshold,
    )
    if opts.router_weights is not None:
        config.weights = parse_weights(opts.router_weights)
    return config


def instance_summary(requests: dict, num_instances: int) -> tuple[list[dict], float]:
    """Per instance: its requests, those completed, their throughputs and TTFT; and the load
    imbalance (the most requests an instance got over the mean)."""
    frame = pd.DataFrame(requests)
    out = []
    for i in range(num_instances):
        mine = frame[frame["instance"] == i]
        s = metrics.summarize(mine) if len(mine) else None
        out.append(
            {
                "instance": i,
                "requests": len(mine),
                "completed": s["completed"] if s else 0,
                "request_throughput": s["request_throughput"] if s else 0.0,
                "output_throughput": s["output_throughput"] if s else 0.0,
                "mean_ttft_ms": s["mean_ttft_ms"] if s else None,
                "p90_ttft_ms": s["p90_ttft_ms"] if s else None,
            }
        )
    served = np.array([row["requests"] for row in out], dtype=float)
    return out, float(served.max() / served.mean()) if served.sum() else 1.0


def run_cluster_into_folder(
    trace,
    run_dir,
    meta: dict,
    build: Callable[[Callable[[int], None], Callable], Any],
    steps_of: Callable[[Any], ClusterSteps],
    finish: Callable[[Any, dict, int], tuple[dict, dict]],
    progress: Callable | None,
    started: Callable | None,
    wall_start: float,
) -> ReplayResult:
    """Run a cluster and write its run folder, as replay does one instance: the requests journaled
    as they finish (the steps written at the end, in time order), progress by finished requests,
    the run's status, a crash's error in run.json. build(after_step, on_finished) makes the cluster
    (Cluster or PdCluster); steps_of(cluster) is its steps table; finish(cluster, requests, steps)
    gives the requests table and the summary, once it has run."""
    total = len(trace)
    tokens = [r.input_len + r.output_len for r in trace.requests]
    tokens_total = sum(tokens)
    finished: list = []  # every instance's done requests, in the order they were reported
    state = {"tokens_done": 0, "counted": 0}
    no_steps = StepLog()  # (the steps are written at the end, in time order: the journal keeps the requests)

    def after_step(_done: int) -> None:
        writer.after_step(no_steps, finished)
        if progress is not None and len(finished) > state["counted"]:
            state["tokens_done"] += sum(tokens[r.index] for r in finished[state["counted"] :])
            state["counted"] = len(finished)
            progress(ReplayProgress(len(finished), total, state["tokens_done"], tokens_total))

    cluster = build(after_step, finished.append)
    with deferred_interrupts():
        writer = RunWriter(run_dir, meta)
    status = "incomplete"
    steps = steps_of(cluster)
    try:
        if started is not None:
            started(meta)
        if progress is not None:
            progress(ReplayProgress(0, total, 0, tokens_total))
        try:
            cluster.run()
        finally:
            with deferred_interrupts():
                writer.finish_steps(steps)
        for inst in cluster.instances:
            inst.scheduler.check_invariants()
        status = "complete"
    except Exception as e:
        status = "failed"
        meta["error"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        with deferred_interrupts():
            requests, meta["summary"] = finish(cluster, metrics.requests_table(cluster.received), len(steps))
            meta["status"] = status
            wall_s = time.perf_counter() - wall_start
            writer.finish(meta, requests, wall_s)
    return ReplayResult(
        run_dir, status, meta["summary"], wall_s, meta, metrics.rejection_counts(requests), metrics.failure_counts(requests)
    )


def replay_cluster(
    trace,
    opts,
    trace_path,
    out,
    progress: Callable | None,
    started: Callable | None,
    wall_start: float,
    model,
    backend,
    config,
    make_requests,
    new_scheduler,
):
    """The cluster half of testbed.replay.replay: it has checked the options and built one instance's
    backend (its cost model and KV pool) and scheduler config."""
    cost_model = backend.driver.cost_model
    n = opts.replicas
    run_dir = check_out_folder(out) if out is not None else default_run_dir(trace_path, opts)
    meta = run_meta(
        trace,
        trace_path,
        opts,
        model,
        backend,
        config,
        cluster={
            "replicas": n,
            "router": opts.router,
            "router_refresh_ms": opts.router_refresh_ms,
            "router_latency_ms": opts.router_latency_ms,
        },
    )

    def make_instance(i, env):
        return new_scheduler(opts, config), SimDriver(cost_model, opts.fast_forward, env), backend.kv_tokens

    def build(after_step, on_finished) -> Cluster:
        return Cluster(
            make_requests(),
            n,
            make_instance,
            Policy(routing_config(opts), n),
            bool(opts.overlap),
            refresh_s=opts.router_refresh_ms / 1e3,
            latency_s=opts.router_latency_ms / 1e3,
            progress=after_step,
            on_finished=on_finished,
        )

    def finish(cluster: Cluster, requests: dict, num_steps: int) -> tuple[dict, dict]:
        per_instance, imbalance = instance_summary(requests, n)
        summary = metrics.run_summary(requests, num_steps, cluster.clock(), backend.kv_tokens)
        return requests, summary | {"instances": per_instance, "load_imbalance": imbalance}

    return run_cluster_into_folder(
        trace,
        run_dir,
        meta,
        build,
        lambda cluster: ClusterSteps([inst.loop.steps for inst in cluster.instances]),
        finish,
        progress,
        started,
        wall_start,
    )
