"""`testbed sweep` and `testbed capacity`: many replays of one trace, on local processes or Ray.

testbed/cli.py calls `register(subparsers)`. Exit codes: 0 done (a capacity search that
finds no passing rate is a result, so 0 too), 1 some point or search failed (its error is
in sweep.parquet / the output), 2 a usage error (bad --grid/--slo, bad trace), 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

from testbed.errors import EXIT_INTERRUPTED
from testbed.options import add_replay_options, closed_loop_note, options_from_args, positive_int
from testbed.progress import progress_bar
from testbed.runs.folder import unused_path
from testbed.runs.summary_table import format_summary
from testbed.studies.capacity import (
    CLOSED_LOOP_HAS_NO_RATE,
    DEFAULT_RESOLUTION,
    SCALES_ITSELF,
    SLO_KEYS,
    CapacityReport,
    CapacityResult,
    Probe,
    parse_slos,
    plan_capacity,
    run_capacity,
)
from testbed.studies.points import PointResult, SweepPoint
from testbed.studies.runners import make_runner
from testbed.studies.sweep import (
    SWEEP_FILE,
    Sweep,
    check_out_dir,
    format_value,
    load_sweep,
    parse_grid,
    plan_sweep,
    run_sweep,
    sweep_rows,
)

EXIT_FAILED = 1

GRID_HELP = (
    "a grid axis: a replay option (flag or field spelling: chunked-prefill-size or chunked_prefill_size) "
    "and its values, e.g. --grid policy=fcfs,lpm --grid overlap=on,off; on/off/true/false for switches, "
    "none for an unset option. Repeat for more axes; the points are their cross product, and an axis "
    "overrides the option of the same name"
)
RAY_HELP = (
    "run the points as tasks on a Ray cluster (ADDRESS, e.g. 10.0.0.1:6379, or auto: the running "
    "cluster, else a local one) instead of local processes; needs pip install .[ray]. On more than one "
    "machine every node needs this package and must see the trace and --out at the same path (a shared "
    "filesystem): the tasks write the run folders"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sweep",
        help="replay a trace over a grid of options (in parallel) and tabulate the metrics",
        description="Replay TRACE at every point of the cross product of the --grid axes: one run folder per "
        "point (DIR/points/<axis values>, what `testbed replay` writes with those options) and DIR/sweep.parquet "
        "(one row per point: status, error, every option, every summary metric). A point that fails is a row "
        "with its error; the others go on. --resume skips the points already done.",
    )
    _add_common(p, "DIR/sweep.parquet and DIR/points/ (default runs/sweep-<trace>-<time>)")
    add_replay_options(p)
    p.set_defaults(func=cmd_sweep)

    p = subparsers.add_parser(
        "capacity",
        help="the highest request rate that meets SLOs (per config with --grid, ranked)",
        description="Search the highest request rate (the trace's arrivals scaled: rate multiplier m = "
        "--time-scale 1/m) at which every --slo holds. Monotonicity is assumed (the metrics do not improve as "
        "the rate grows): from x1 the search doubles or halves the rate until one passes and the next fails "
        "(x1/64 to x64), then bisects to --resolution. Every tested rate is printed and kept as a run folder "
        "(DIR/points) and a row of DIR/sweep.parquet; the result is also in DIR/capacity.json. With --grid, "
        "the configs are searched in parallel (one rate per config at a time) and ranked by capacity.",
    )
    _add_common(p, "DIR/capacity.json, DIR/sweep.parquet and DIR/points/ (default runs/capacity-<trace>-<time>)")
    p.add_argument(
        "--slo",
        action="append",
        required=True,
        metavar="KEY=MS",
        help=f"a latency bound that must hold, e.g. --slo p90_ttft_ms=500 --slo p90_tpot_ms=50; keys: {', '.join(SLO_KEYS)}",
    )
    p.add_argument(
        "--resolution",
        type=float,
        default=DEFAULT_RESOLUTION,
        help="stop bisecting when the failing rate is within this fraction of the passing one (default %(default)s)",
    )
    add_replay_options(p)
    p.set_defaults(func=cmd_capacity)


def _add_common(p: argparse.ArgumentParser, out_help: str) -> None:
    p.add_argument("trace", help="trace file: native JSON/JSONL, Mooncake JSONL, Azure CSV or ShareGPT-length CSV")
    p.add_argument("--grid", action="append", default=[], metavar="AXIS=V1,V2,...", help=GRID_HELP)
    p.add_argument("--out", default=None, metavar="DIR", help=out_help)
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help=f"local processes running points at once (default: the CPU count, {os.cpu_count()} here; not used with --ray)",
    )
    p.add_argument("--ray", default=None, metavar="ADDRESS", help=RAY_HELP)
    p.add_argument(
        "--resume", action="store_true", help="keep the points of DIR already complete with the same trace and options, run the others"
    )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the tables")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--gpus",
        type=positive_int,
        default=None,
        metavar="N",
        help="a GPU budget: only the grid's configs on N GPUs run ((replicas, or prefill + decode replicas) x tp x dp), "
        "e.g. the splits of N into --grid prefill-replicas and decode-replicas",
    )


def _default_out(kind: str, trace: str) -> Path:
    return unused_path(Path("runs") / f"{kind}-{Path(trace).stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")


def _runner(args: argparse.Namespace, tasks: int):
    # More processes than points at once would only wait.
    workers = min(args.workers or os.cpu_count() or 1, max(tasks, 1))
    return make_runner(workers, args.ray)


def _fmt(v: Any, percent: bool = False) -> str:
    if v is None:
        return "-"
    if percent:
        return f"{v * 100:.1f}%"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.2f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """Plain columns: the first `left` ones left-aligned (labels), the rest right-aligned (numbers)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    head = line(headers)
    return "\n".join([head, "-" * len(head), *(line(r) for r in rows)])


# --- sweep ----------------------------------------------------------------------------------

SWEEP_METRICS = (  # (summary key, header, percent)
    ("p90_ttft_ms", "p90 TTFT ms", False),
    ("p90_tpot_ms", "p90 TPOT ms", False),
    ("request_throughput", "req/s", False),
    ("output_throughput", "out tok/s", False),
    ("cache_hit_rate", "cache hit", True),
)


def format_sweep(sweep: Sweep, results: Sequence[PointResult]) -> str:
    axis_names = [a.name for a in sweep.axes]
    headers = [*axis_names, "status", *(h for _, h, _ in SWEEP_METRICS)]
    rows = []
    for p, r in zip(sweep.grid, results):
        values = dict(p.axes)
        s = r.summary or {}
        status = r.status + (" (resumed)" if r.resumed else "")
        rows.append([*(format_value(values[a]) for a in axis_names), status, *(_fmt(s.get(k), pct) for k, _, pct in SWEEP_METRICS)])
    lines = [format_table(headers, rows, left=len(axis_names) + 1)]
    for p, r in zip(sweep.grid, results):
        if r.status in ("failed", "skipped"):
            lines.append(f"{r.status}: {p.name}: {r.error}")
    return "\n".join(lines)


def _axes_text(sweep: Sweep) -> str:
    return " x ".join(f"{a.name} {len(a.values)}" for a in sweep.axes) or "no axes"


def _closed_loop_note(sweep: Sweep) -> str | None:
    """The line a sweep with closed-loop points says once (each point's run.json records its own)."""
    clients = sorted({p.options.concurrency for p in sweep.points if p.options.concurrency is not None})
    if not clients:
        return None
    if len(clients) == 1:
        note = closed_loop_note(next(p.options for p in sweep.points if p.options.concurrency is not None))
    else:
        note = (
            f"closed loop with {', '.join(map(str, clients))} clients: each sends its next request (in trace order) when its "
            "last one is done; the trace's arrival times are ignored"
        )
    open_loop = any(p.options.concurrency is None for p in sweep.points)
    return note + ("; the open-loop points (concurrency none) keep them" if open_loop else "")


def interrupted_sweep_message(out_dir: Path) -> str:
    """The one line an interrupted sweep prints: what its table says each point's folder holds."""
    try:
        statuses = load_sweep(out_dir)[0]["status"].value_counts().to_dict()
    except (OSError, ValueError, KeyError):
        return f"interrupted before any point started: nothing was written to {out_dir}"
    said = ", ".join(f"{n} {STATUS_WORDS.get(k, k)}" for k, n in sorted(statuses.items(), key=lambda kv: STATUS_ORDER.get(kv[0], 9)))
    return f"interrupted: {said} ({out_dir / SWEEP_FILE}); --resume runs the points not complete"


STATUS_WORDS = {
    "complete": "complete",
    "incomplete": "stopped mid-run (incomplete)",
    "failed": "failed",
    "pending": "not started",
    "skipped": "skipped",
}
STATUS_ORDER = {k: i for i, k in enumerate(STATUS_WORDS)}


def cmd_sweep(args: argparse.Namespace) -> int:
    axes = parse_grid(args.grid)
    out_dir = Path(args.out or _default_out("sweep", args.trace))
    try:  # loading the trace and starting the processes (or Ray) takes a while
        sweep = plan_sweep(args.trace, options_from_args(args), axes, out_dir, args.gpus)
        check_out_dir(sweep.out_dir, args.resume)  # before starting processes or Ray
        runner = _runner(args, len(sweep.points))
    except KeyboardInterrupt:
        print(f"interrupted before any point started: nothing was written to {out_dir}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not args.json:
        skipped = f", {len(sweep.skipped)} skipped (their options cannot run together)" if sweep.skipped else ""
        print(
            f"sweep of {args.trace} ({sweep.trace_info.requests} requests): {len(sweep.grid)} points ({_axes_text(sweep)}){skipped} "
            f"on {runner.description} -> {sweep.out_dir}",
            flush=True,
        )
    note = _closed_loop_note(sweep)
    if note is not None:  # (on stderr, with the progress: --json's stdout stays one object)
        print(note, file=sys.stderr, flush=True)
    bar = progress_bar("sweep", "points", len(sweep.points), disable=args.quiet)
    counts = {"failed": 0, "resumed": 0}

    def on_result(point: SweepPoint, result: PointResult) -> None:
        counts["failed"] += result.status != "complete"
        counts["resumed"] += result.resumed
        bar.update(1)
        bar.set_postfix({k: v for k, v in counts.items() if v}, refresh=False)

    try:
        results = run_sweep(sweep, runner, args.resume, on_result)
    except KeyboardInterrupt:
        bar.close()
        print(f"\n{interrupted_sweep_message(sweep.out_dir)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        bar.close()
        runner.close()
    failed = sum(r.status not in ("complete", "skipped") for r in results)
    if args.json:
        rows, meta = sweep_rows(sweep, sweep.grid, results)
        print(json.dumps({"out": str(sweep.out_dir), "columns": meta, "points": rows}, indent=2, default=str))
    else:
        print(format_sweep(sweep, results))
        resumed = sum(r.resumed for r in results)
        complete = sum(r.status == "complete" for r in results)
        skipped = f", {len(sweep.skipped)} skipped" if sweep.skipped else ""
        print(
            f"{sweep.out_dir / SWEEP_FILE}: {len(results)} points, {complete} complete"
            f"{f' ({resumed} resumed)' if resumed else ''}{skipped}, {failed} failed"
        )
    return EXIT_FAILED if failed else 0


# --- capacity -------------------------------------------------------------------------------


def _probe_line(p: Probe, slo_keys: Sequence[str]) -> str:
    s = p.summary or {}
    if p.status == "error":
        detail = p.error or ""
    elif p.violations:
        detail = "; ".join(p.violations)
    else:
        detail = ", ".join(f"{k} {_fmt(s.get(k))}" for k in slo_keys)
    return f"  x{p.multiplier:<9.4g} {p.rate:>10.4g} req/s  {p.status:<5}  {detail}"


def format_capacity(report: CapacityReport) -> str:
    keys = [s.key for s in report.slos]
    lines = []
    for r in report.results:
        lines.append(f"{r.config}: tested" if len(report.results) > 1 else "tested:")
        lines += [_probe_line(p, keys) for p in r.probes]
    if len(report.results) == 1:
        r = report.results[0]
        lines.append(r.message())
        if r.summary is not None:
            lines.append("")
            lines.append(
                format_summary(r.summary, title=f"metrics at {r.rate:.4g} req/s (run folder {report.out_dir / 'points' / r.point}):")
            )
        return "\n".join(lines)
    axis_names = list(report.results[0].axes)
    headers = ["rank", *axis_names, "capacity req/s", "x trace", "served req/s", *keys, "sims", "resolution"]
    rows = []
    for i, r in enumerate(report.results, 1):
        s = r.summary or {}
        ranked = r.status in ("found", "above_range")
        capacity = (
            _fmt(r.rate) + (" (or more)" if r.status == "above_range" else "") if ranked else ("none" if r.status == "none" else "failed")
        )
        rows.append(
            [
                str(i) if ranked else "-",
                *(format_value(r.axes[a]) for a in axis_names),
                capacity,
                f"{r.multiplier:.4g}" if ranked else "-",
                _fmt(s.get("request_throughput")),
                *(_fmt(s.get(k)) for k in keys),
                str(r.sims),
                f"{r.resolution * 100:.1f}%" if r.resolution is not None else "-",
            ]
        )
    lines += ["", format_table(headers, rows, left=len(axis_names) + 1)]
    lines += [f"{r.config}: {r.message()}" for r in report.results if r.status in ("none", "failed", "above_range")]
    lines += [f.message() for f in report.fewest_replicas()]
    lines += [f"skipped: {name}: {why}" for name, why in report.skipped.items()]
    return "\n".join(lines)


def cmd_capacity(args: argparse.Namespace) -> int:
    slos = parse_slos(args.slo)
    axes = parse_grid(args.grid, forbidden={"time_scale": SCALES_ITSELF, "concurrency": CLOSED_LOOP_HAS_NO_RATE})
    out_dir = Path(args.out or _default_out("capacity", args.trace))
    try:  # loading the trace and starting the processes (or Ray) takes a while
        sweep = plan_capacity(args.trace, options_from_args(args), axes, out_dir, args.resolution, args.gpus)
        check_out_dir(sweep.out_dir, args.resume)  # before starting processes or Ray
        configs = len(sweep.points)
        runner = _runner(args, configs)
    except KeyboardInterrupt:
        print(f"interrupted before any rate was tested: nothing was written to {out_dir}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not args.json:
        slo_text = ", ".join(f"{s.key} <= {s.limit:g}" for s in slos)
        print(
            f"capacity of {args.trace} ({sweep.trace_info.requests} requests at {sweep.trace_info.rate:.4g} req/s) under {slo_text}: "
            f"{configs} config{'s' if configs > 1 else ''} on {runner.description} -> {sweep.out_dir}",
            flush=True,
        )
    bar = progress_bar("capacity", "sims", disable=args.quiet)

    def on_probe(result: CapacityResult, probe: Probe) -> None:
        bar.update(1)

    try:
        report = run_capacity(sweep, slos, runner, resolution=args.resolution, resume=args.resume, on_probe=on_probe)
    except KeyboardInterrupt:
        bar.close()
        print(f"\ninterrupted: the rates tested so far are in {sweep.out_dir / 'points'}; --resume goes on", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        bar.close()
        runner.close()
    if args.json:
        print(json.dumps(report.to_json(), indent=2, default=str))
    else:
        print(format_capacity(report))
    return EXIT_FAILED if any(r.status == "failed" for r in report.results) else 0
