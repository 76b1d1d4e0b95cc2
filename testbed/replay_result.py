"""What a replay reports: its progress after each step, its result, and the folder it writes by
default. Apart from replay.py so that each way of replaying (testbed/live/server_replay.py too)
reports the same way without importing the others."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from testbed.replay_options import ReplayOptions, recorded_options
from testbed.runs.folder import unused_path, versions


@dataclass(frozen=True)
class ReplayProgress:
    """How far a replay is, after a step: what its progress callback is given."""

    done: int  # requests finished or rejected
    total: int  # requests in the trace (after --max-requests)
    tokens_done: int  # prompt + output tokens of those requests: the work behind them
    tokens_total: int  # prompt + output tokens of every request


@dataclass
class ReplayResult:
    run_dir: Path
    status: str
    summary: dict
    wall_s: float
    meta: dict = field(default_factory=dict)  # run.json
    rejections: dict[str, int] = field(default_factory=dict)  # reason -> requests (metrics.rejection_counts)
    failures: dict[str, int] = field(default_factory=dict)  # kind -> requests that failed on the way (metrics.failure_counts)


def default_run_dir(trace_path: str, opts: ReplayOptions) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return unused_path(Path("runs") / f"{Path(trace_path).stem}-{opts.mode}-{opts.policy}-{stamp}")


def trace_record(trace, trace_path: str, opts: ReplayOptions) -> dict:
    """run.json's "trace": which trace, and the work it asks for."""
    return {
        "path": str(trace_path),
        "sha256": trace.sha256(),
        "format": trace.format,
        "num_requests": len(trace),
        "prompt_tokens": sum(r.input_len for r in trace.requests),
        "output_tokens": sum(r.output_len for r in trace.requests),
        # how long the arrivals last on the replay's clock (a closed loop has no arrival times)
        "arrival_span_s": trace.duration_s * opts.time_scale if opts.concurrency is None else None,
    }


def run_meta(trace, trace_path: str, opts: ReplayOptions, model, backend, config, **extra) -> dict:
    """run.json as a replay of the simulator or the engine starts it: the trace, the options, the
    model, what the backend says of itself, the scheduler's config; then `extra` (a closed loop's
    note, a cluster's layout)."""
    return {
        "status": "running",
        "mode": opts.mode,
        "trace": trace_record(trace, trace_path, opts),
        "options": recorded_options(opts),
        "model": model.name,
        **backend.meta,
        "scheduler": config.to_dict() | {"max_running_requests": config.effective_max_running_requests},
        **extra,
        "versions": versions(),
        "summary": None,
    }
