"""An imported run as a run folder, with the trace it implies beside it.

The folder has a replay's schema (testbed.runs.folder): run.json with mode "imported",
the source file's format and sha256, what the source lacks, the engine settings it
carries and the replay options they amount to; requests.parquet from the project's own
metrics; steps.parquet empty with its columns (the steps of another engine are unknown);
and trace.jsonl, the run's arrivals and lengths in the native format, so that
`testbed replay DIR/trace.jsonl` simulates exactly that workload and `testbed compare`
accepts the pair (same trace sha256).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from scheduler.loop.step_log import StepLog
from scheduler.model_config import bundled_model_of
from testbed.errors import ConfigError, TraceError
from testbed.runs import metrics
from testbed.runs.folder import (
    REQUESTS_FILE,
    RUN_FILE,
    STEPS_FILE,
    WALL_FILE,
    check_out_folder,
    versions,
    write_json,
    write_requests,
    write_steps,
)
from testbed.runs.importers import load_import
from testbed.traces.schema import Trace, TraceRequest, file_sha256

TRACE_FILE = "trace.jsonl"
IMPORTED_MODE = "imported"


@dataclass
class ImportResult:
    run_dir: Path
    trace_path: Path
    summary: dict
    format: str
    missing: list[str]


def import_run(path: str | Path, out: str | Path, format: str | None = None, *, entry: int | None = None, seed: int = 0) -> ImportResult:
    wall_start = time.perf_counter()
    run_dir = check_out_folder(out)
    if seed < 0:
        raise ConfigError(f"--seed {seed}: must be >= 0")
    imported = load_import(path, format, entry=entry, seed=seed)
    reqs = imported.requests
    done = [r for r in reqs if r.finished()]
    if not done:
        raise TraceError(str(path), None, None, "no request completed: there is no workload to replay")
    for i, r in enumerate(reqs):  # the trace's order: completed by arrival, then the failed
        r.index = i
    run_dir.mkdir(parents=True, exist_ok=True)
    trace_path = run_dir / TRACE_FILE
    trace = Trace([TraceRequest(r.arrival_time, r.input_len, len(r.output_ids), rid=r.rid) for r in done], format="native")
    trace.write(trace_path)

    df = metrics.requests_frame(reqs)
    write_requests(run_dir / REQUESTS_FILE, df)
    write_steps(run_dir / STEPS_FILE, StepLog().columns(0, 0))  # another engine's steps are unknown
    summary = metrics.summarize(df, imported.ttft_from) | {"num_steps": None, "kv_tokens": imported.kv_tokens}
    summary["cache_hit_rate"] = None  # no source reports its cached tokens
    meta = {
        "status": "complete",
        "mode": IMPORTED_MODE,
        "trace": {"path": str(trace_path), "sha256": file_sha256(trace_path), "format": trace.format, "num_requests": len(trace)},
        "source": {
            "path": str(path),
            "format": imported.format,
            "sha256": file_sha256(path),
            "missing": imported.missing,
        },
        "options": imported.options,
        "model": bundled_model_of(imported.model or "") or imported.model,
        "source_model": imported.model,
        "hardware": imported.hardware,
        "engine": imported.engine,
        "scheduler": {"name": imported.scheduler},
        "versions": versions(),
        "summary": summary,
    }
    if imported.ttft_from != "arrival":
        meta["ttft_from"] = imported.ttft_from
    write_json(run_dir / RUN_FILE, meta)
    write_json(
        run_dir / WALL_FILE,
        {"created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "wall_s": round(time.perf_counter() - wall_start, 3)},
    )
    return ImportResult(run_dir, trace_path, summary, imported.format, imported.missing)
