"""replay --prefill-replicas P --decode-replicas D: the trace through a PD cluster (simulator/cluster/
pd.py, scheduler/disagg/), into one run folder.

Every instance is the replay's own engine (the same scheduler, options, cost model and KV pool),
in its role: a prefill instance runs each request's prefill (one output token); a decode instance
reserves the prompt's KV, takes the request in when its KV has crossed --kv-link, and decodes it.
Instances are numbered prefill first (0 .. P-1), then decode (P .. P+D-1).

The requests table: `instance` is where the request prefilled, `decode_instance` where it decoded;
`kv_transfer_start` (when its prefill was processed and its KV set out), `kv_transfer_s` (latency
and bytes over the shared link) and `decode_held_s` (how long its decode instance held it back for
KV before reserving it; 0 if not). The steps table has every instance's steps in time order, with
`role` (prefill or decode). run.json's `cluster` says the layout, the routers, the link and the KV
bytes a token; the summary adds `instances` (per instance, with its role: requests, completed,
request throughput; a prefill instance's input throughput and TTFT, a decode instance's output
throughput and TPOT), `load_imbalance` (the most requests an instance of a role got over that
role's mean, the larger of the two roles; each role's too) and the transfer: `kv_transfer_mean_ms`,
`kv_transfer_p50_ms`, `kv_transfer_p99_ms`, `kv_transferred_gb`, `decode_kv_holds` (requests held
back at least once) and `decode_held_mean_ms` (their mean wait).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pandas as pd

from scheduler.model_config import ModelConfig
from simulator.cluster.cluster import Instance
from simulator.cluster.kv_link import parse_kv_link
from simulator.cluster.pd import DECODE_ROUTER, PdCluster
from simulator.cluster.routing import Policy
from simulator.costs.precision import Precision
from simulator.driver.sim_driver import SimDriver
from testbed.cluster_replay import ClusterSteps, routing_config, run_cluster_into_folder
from testbed.replay_options import ReplayOptions
from testbed.replay_result import ReplayResult, default_run_dir, run_meta
from testbed.runs import metrics
from testbed.runs.folder import check_out_folder
from testbed.schedulers import scheduler_kind


def kv_bytes_per_token(model: ModelConfig, opts: ReplayOptions) -> int:
    """What one token's KV takes on one GPU of a TP group, in the KV cache's dtype (as the pool is sized)."""
    precision = Precision.resolve(model.torch_dtype, opts.quantization, opts.kv_cache_dtype)
    return model.kv_bytes_per_token(precision.kv_bytes, opts.tp)


def pd_columns(cluster: PdCluster, requests: dict) -> dict:
    """The PD columns of the requests table, in its row order."""
    recs = [cluster.records[i] for i in requests["index"]]
    nan = math.nan
    return {
        "decode_instance": np.array([r.decode for r in recs], dtype=np.int64),
        "kv_transfer_start": np.array([r.transfer.sent if r.transfer else nan for r in recs], dtype=np.float64),
        "kv_transfer_s": np.array([r.transfer.seconds if r.transfer and r.transfer.end is not None else nan for r in recs]),
        "decode_held_s": np.array([r.held_s if r.preallocated_at is not None else nan for r in recs], dtype=np.float64),
    }


def _ratio(counts: list[int]) -> float:
    served = np.array(counts, dtype=float)
    return float(served.max() / served.mean()) if served.sum() else 1.0


def pd_summary(requests: dict, instances: list[Instance], roles: list[str]) -> dict:
    """The summary's per-instance figures, load imbalance and transfer figures."""
    frame = pd.DataFrame(requests)
    per_instance, counts = [], {"prefill": [], "decode": []}
    for inst, role in zip(instances, roles):
        mine = frame[frame["instance" if role == "prefill" else "decode_instance"] == inst.index]
        s = metrics.summarize(mine) if len(mine) else None
        row = {
            "instance": inst.index,
            "role": role,
            "requests": len(mine),
            "completed": s["completed"] if s else 0,
            "request_throughput": s["request_throughput"] if s else 0.0,
        }
        if role == "prefill":
            row |= {
                "input_throughput": s["input_throughput"] if s else 0.0,
                "mean_ttft_ms": s["mean_ttft_ms"] if s else None,
                "p90_ttft_ms": s["p90_ttft_ms"] if s else None,
            }
        else:
            row |= {
                "output_throughput": s["output_throughput"] if s else 0.0,
                "mean_tpot_ms": s["mean_tpot_ms"] if s else None,
                "p90_tpot_ms": s["p90_tpot_ms"] if s else None,
            }
        per_instance.append(row)
        counts[role].append(len(mine))
    transfer_ms = frame["kv_transfer_s"].dropna().to_numpy() * 1e3
    held = frame["decode_held_s"].to_numpy()
    held = held[held > 0] * 1e3
    imbalance = {role: _ratio(c) for role, c in counts.items()}
    return {
        "instances": per_instance,
        "load_imbalance": max(imbalance.values()),
        "prefill_load_imbalance": imbalance["prefill"],
        "decode_load_imbalance": imbalance["decode"],
        "kv_transfer_mean_ms": float(transfer_ms.mean()) if len(transfer_ms) else None,
        "kv_transfer_p50_ms": float(np.percentile(transfer_ms, 50)) if len(transfer_ms) else None,
        "kv_transfer_p99_ms": float(np.percentile(transfer_ms, 99)) if len(transfer_ms) else None,
        "decode_kv_holds": int(len(held)),
        "decode_held_mean_ms": float(held.mean()) if len(held) else None,
    }


def replay_pd(
    trace,
    opts: ReplayOptions,
    trace_path,
    out,
    progress: Callable | None,
    started: Callable | None,
    wall_start: float,
    model: ModelConfig,
    backend,
    config,
    make_requests,
) -> ReplayResult:
    """The PD half of testbed.replay.replay: it has checked the options and built one instance's
    backend (its cost model and KV pool) and scheduler config."""
    cost_model = backend.driver.cost_model
    kind = scheduler_kind(opts.scheduler)
    num_prefill, num_decode = opts.prefill_replicas, opts.decode_replicas
    link = parse_kv_link(opts.kv_link)
    per_token = kv_bytes_per_token(model, opts)
    run_dir = check_out_folder(out) if out is not None else default_run_dir(trace_path, opts)
    meta = run_meta(
        trace,
        trace_path,
        opts,
        model,
        backend,
        config,
        cluster={
            "prefill_replicas": num_prefill,
            "decode_replicas": num_decode,
            "router": opts.router,  # picks the prefill instance
            "decode_router": DECODE_ROUTER,  # the decode instance: fewest outstanding tokens
            "router_refresh_ms": opts.router_refresh_ms,
            "router_latency_ms": opts.router_latency_ms,
            "kv_link": link.record(),
            "kv_bytes_per_token": per_token,  # per GPU of a TP group: what a transfer carries a prompt token
        },
    )

    def make_instance(i, env, role):
        new = kind.new_prefill if role == "prefill" else kind.new_decode
        return new(config), SimDriver(cost_model, opts.fast_forward, env, wakeable=True), backend.kv_tokens

    def build(after_step, on_finished) -> PdCluster:
        return PdCluster(
            make_requests(),
            num_prefill,
            num_decode,
            make_instance,
            Policy(routing_config(opts), num_prefill),
            bool(opts.overlap),
            link,
            per_token,
            refresh_s=opts.router_refresh_ms / 1e3,
            latency_s=opts.router_latency_ms / 1e3,
            progress=after_step,
            on_finished=on_finished,
        )

    def finish(cluster: PdCluster, requests: dict, num_steps: int) -> tuple[dict, dict]:
        requests |= pd_columns(cluster, requests)
        summary = metrics.run_summary(requests, num_steps, cluster.clock(), backend.kv_tokens)
        moved = sum(r.nbytes for r in cluster.records.values() if r.transfer is not None) / 1e9
        return requests, summary | pd_summary(requests, cluster.instances, cluster.roles) | {"kv_transferred_gb": moved}

    return run_cluster_into_folder(
        trace,
        run_dir,
        meta,
        build,
        lambda cluster: ClusterSteps([inst.loop.steps for inst in cluster.instances], cluster.roles),
        finish,
        progress,
        started,
        wall_start,
    )
