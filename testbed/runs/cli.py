"""`testbed compare RUN_A RUN_B`: two run folders side by side, with the relative error of B against A.

testbed/cli.py calls `register(subparsers)`; cmd_compare returns the exit code:
0 compared, 2 refused (the runs differ and no --force) or a folder that does not load.
"""

from __future__ import annotations

import argparse
import json
import sys

from testbed.options import positive_int
from testbed.runs import by_arrival
from testbed.runs.compare import STATS, MetricRow, compare_runs, differences, ttft_basis
from testbed.runs.folder import Run, RunLoadError, load_run
from testbed.runs.metrics import LATENCIES

EXIT_REFUSED = 2
PROG = "testbed compare"
# Labels of the rows after the latencies.
OTHER_LABELS = {
    "request_throughput": "request throughput (req/s)",
    "output_throughput": "output throughput (tok/s)",
    "input_throughput": "input throughput (tok/s)",
    "cache_hit_rate": "cache hit rate",
    "completed": "completed requests",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare",
        help="compare the metrics of two run folders",
        description="Print TTFT, TPOT, ITL, E2E (mean, p50, p90, p99), throughput and cache hit rate of two "
        "runs side by side, with the relative error (B - A) / A. Runs of different traces or options "
        "are refused unless --force.",
    )
    p.add_argument("run_a", metavar="RUN_A", help="reference run folder (e.g. the real run)")
    p.add_argument("run_b", metavar="RUN_B", help="run folder compared with it (e.g. the simulated run)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")
    p.add_argument("--force", action="store_true", help="compare even if the traces or options differ")
    p.add_argument(
        "--by-arrival",
        type=positive_int,
        metavar="K",
        help="also the mean TTFT and TPOT of K groups of consecutive arrivals (A's order) in both runs: where in the run B drifts from A",
    )
    p.set_defaults(func=cmd_compare)


def _load(path: str) -> Run:
    run = load_run(path)
    if not isinstance(run.meta, dict):
        raise RunLoadError(f"{path}: run.json is not a JSON object")
    if run.requests.empty:  # run.json alone: no request ran, or its tables are gone
        raise RunLoadError(f"{path}: no requests table (requests.parquet or its journal): nothing to compare")
    return run


def cmd_compare(args: argparse.Namespace) -> int:
    try:
        a, b = _load(args.run_a), _load(args.run_b)
    except (RunLoadError, OSError, ValueError) as e:  # ValueError: unreadable parquet
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_REFUSED
    diffs = differences(a, b)
    if diffs and not args.force:
        print(f"{PROG}: runs differ:", file=sys.stderr)
        for d in diffs:
            print(f"  {d}", file=sys.stderr)
        print(f"{PROG}: use --force to compare them anyway", file=sys.stderr)
        return EXIT_REFUSED
    rows = compare_runs(a, b)
    groups = None if args.by_arrival is None else by_arrival.by_arrival(a, b, args.by_arrival, ttft_basis(a, b))
    if args.json:
        if diffs:
            print(f"{PROG}: warning: runs differ (compared anyway, --force): {'; '.join(diffs)}", file=sys.stderr)
        doc = to_json(a, b, rows, diffs, args.force)
        if groups is not None:
            doc["by_arrival"] = by_arrival.to_json(groups)
        print(json.dumps(doc, indent=2))
    else:
        print(format_compare(a, b, rows, diffs))
        if groups is not None:
            print("\n" + by_arrival.format_by_arrival(groups))
    return 0


def run_info(run: Run) -> dict:
    trace = run.meta.get("trace") or {}
    return {
        "path": str(run.path),
        "mode": run.meta.get("mode"),
        "model": run.meta.get("model"),
        "hardware": run.meta.get("hardware"),
        "status": run.status,
        "trace": trace.get("path"),
    }


def to_json(a: Run, b: Run, rows: list[MetricRow], diffs: list[str], forced: bool) -> dict:
    return {
        "a": run_info(a),
        "b": run_info(b),
        "metrics": {r.name: {"a": r.a, "b": r.b, "rel_err": r.rel_err} for r in rows},
        "differences": diffs,
        "forced": bool(forced),
        "ttft_from": ttft_basis(a, b),
    }


def fmt_metric(v, percent: bool = False) -> str:
    """A metric as the compare table prints it: 1,234.5 or 12.34; 44.70% with percent; "-" if missing."""
    if v is None:
        return "-"
    if percent:
        return f"{v * 100:.2f}%"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.2f}"


def fmt_rel_err(e: float | None) -> str:
    """Signed percent: +3.2%, -0.5%; "-" where A is 0 or missing."""
    return "-" if e is None else f"{e * 100:+.1f}%"


def _header(label: str, run: Run) -> str:
    i = run_info(run)
    status = "" if i["status"] == "complete" else f", {i['status']}"
    return f"{label}: {i['path']}  ({i['mode']}, {i['model']}, {i['hardware']}{status})"


INTAKE_NOTE = "TTFT and E2E from when each run's scheduler took the request in (vLLM's queued_ts), not from its arrival"


def format_compare(a: Run, b: Run, rows: list[MetricRow], diffs: list[str] | None = None) -> str:
    """The table a person reads: header, latency groups, throughputs and cache hit rate."""
    lines = [_header("A", a), _header("B", b)]
    trace = a.meta.get("trace") or {}
    lines.append(f"trace: {trace.get('path')} ({trace.get('num_requests')} requests)   rel. err = (B - A) / A")
    if ttft_basis(a, b) == "queued":
        lines.append(INTAKE_NOTE)
    if diffs:
        lines.append("warning: the runs differ (compared anyway, --force):")
        lines += [f"  {d}" for d in diffs]
    by_name = {r.name: r for r in rows}
    body: list[tuple[str, str, str, str]] = []  # label, A, B, rel. err; a group title has empty cells

    def add(label: str, r: MetricRow, percent: bool = False) -> None:
        body.append((label, fmt_metric(r.a, percent), fmt_metric(r.b, percent), fmt_rel_err(r.rel_err)))

    for name in LATENCIES:
        body.append((f"{name.upper()} (ms)", "", "", ""))
        for s in STATS:
            add(f"  {s}", by_name[f"{s}_{name}_ms"])
    for key, label in OTHER_LABELS.items():
        add(label, by_name[key], percent=key == "cache_hit_rate")
    width = max(len(row[0]) for row in body) + 2
    header = f"{'metric':<{width}}{'A':>14}{'B':>14}{'rel. err':>11}"
    lines += ["", header, "-" * len(header)]
    for label, va, vb, e in body:
        lines.append(f"{label:<{width}}{va:>14}{vb:>14}{e:>11}".rstrip())
    return "\n".join(lines)
