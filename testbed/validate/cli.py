"""testbed validate: the simulator against public measured serving points, beside AIConfigurator's own estimate.

    testbed validate [--points FILE] [--filter COLUMN=VALUE,...] [--out DIR] [--no-aiconfigurator]

For every point of the file (default: aiconfigurator-core's silicon_sample.csv), in file order:
skipped with its reason where the simulator cannot express it, else simulated (testbed/validate/
simulate.py) and estimated by AIConfigurator's SDK; then one row per (system, backend, model,
precision) with the median and p90 absolute error of TTFT and TPOT of both, the skipped points by
reason, and the summary line.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from scheduler.loop.gc_pause import freeze_held
from testbed.errors import ConfigError
from testbed.options import positive_int
from testbed.validate.harness import HARNESSES, harness_of, simulated_tokens
from testbed.validate.journal import Journal, JournalRecord
from testbed.validate.points import default_points_path, load_points, parse_filter, select
from testbed.validate.recipes import server_recipe
from testbed.validate.report import (
    GROUP_HEADER,
    PointResult,
    faster_than_kernels_line,
    group_rows,
    harness_line,
    skip_counts,
    summary_line,
    table,
    write_csv,
    write_html,
)
from testbed.validate.simulate import PointSimulator, PointSkipped


def _result(p, simulator: PointSimulator, estimate) -> PointResult:
    r = PointResult(p)
    t0 = time.perf_counter()
    try:
        sim = simulator.simulate(p)
    except PointSkipped as e:
        r.skipped = str(e)
        return r
    r.sim_seconds = time.perf_counter() - t0
    r.sim_ttft_ms, r.sim_tpot_ms, r.kernels, r.kernel_bound = sim.ttft_ms, sim.tpot_ms, sim.kernels, sim.kernel_bound
    r.harness = sim.harness
    if estimate is not None:
        if p.load not in _estimates:  # a load estimated before (the file repeats some) is not estimated again
            try:
                _estimates[p.load] = estimate(p)
            except Exception as e:  # noqa: BLE001 - the SDK's own failures: the point keeps its sim figures
                _estimates[p.load] = (None, None, f"no estimate: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        r.aic_ttft_ms, r.aic_tpot_ms, r.aic_note = _estimates[p.load]
    freeze_held()  # the replay's garbage collected, what the process keeps (profiles, estimates) out of later collections
    return r


_estimates: dict[tuple, tuple] = {}  # MeasuredPoint.load -> AIConfigurator's (TTFT ms, TPOT ms, note), in this process


_worker: tuple[PointSimulator, object] | None = None  # a pool process's simulator (its kernel profiles) and estimator


def _start_worker(work: str, out_of_phase: bool, harness: str, with_estimate: bool) -> None:
    global _worker
    from testbed.interrupts import ignore_stop_signals

    ignore_stop_signals()  # Ctrl-C is the parent's to handle: it cancels the pool
    folder = Path(work) / f"worker-{os.getpid()}"  # in the parent's folder, which it removes however it ends
    _worker = (PointSimulator(folder, out_of_phase=out_of_phase, harness=harness), _estimator() if with_estimate else None)


def _work_chunk(points) -> list[PointResult]:
    assert _worker is not None
    return [_result(p, *_worker) for p in points]


def _estimator():
    from testbed.validate.aiconfigurator_estimate import estimate_point

    return estimate_point


def validate(
    points,
    jobs: int = 1,
    out_of_phase: bool = False,
    harness: str = "auto",
    with_estimate: bool = True,
    progress=None,
    known: dict[int, PointResult] | None = None,
    on_done=None,
) -> list[PointResult]:
    """A result for every point, in the points' order. The points of one load (the file repeats some)
    are simulated once, by one worker; the loads of one kind (system, backend, model, TP, precision:
    one kernel profile) go to a worker together, so each worker builds few profiles.
    known: results already had (a journal's, by index), not simulated again; on_done(results) is
    called with the new ones as they come (a worker's chunk at a time)."""
    known = known or {}
    loads: dict[tuple, list[int]] = {}  # (load, harness, server recipe) -> its points, in kernel-profile order
    todo = (i for i in range(len(points)) if i not in known)
    for i in sorted(todo, key=lambda i: (points[i].skip_reason() is not None, points[i].group, points[i].tp or 0)):
        h = harness_of(points[i], harness)
        loads.setdefault((points[i].load, h, server_recipe(points[i], h)), []).append(i)
    results: list[PointResult | None] = [known.get(i) for i in range(len(points))]
    if jobs <= 1:
        simulator = PointSimulator(out_of_phase=out_of_phase, harness=harness)
        estimate = _estimator() if with_estimate else None
        try:
            for k, i in enumerate(i for same in loads.values() for i in same):
                results[i] = _result(points[i], simulator, estimate)
                if on_done:
                    on_done([results[i]])
                if progress:
                    progress(len(known) + k + 1, len(points))
        finally:
            simulator.close()
        return results  # type: ignore[return-value]
    import tempfile

    with tempfile.TemporaryDirectory(prefix="testbed-validate-") as work:
        chunks = _chunks(points, list(loads.items()), jobs)
        settings = (out_of_phase, harness, with_estimate)
        return _validate_in_pool(points, chunks, results, jobs, work, settings, progress, len(known), on_done)


def _chunks(points, loads: list[tuple[tuple, list[int]]], jobs: int) -> list[list[int]]:
    """The pool's work: runs of up to `size` loads of one kernel profile, the largest first (a large
    load last would leave the other workers idle: a 5,120-request point takes 10 s)."""
    size = max(1, min(8, len(loads) // (4 * jobs)))
    chunks: list[tuple[int, list[int]]] = []  # (tokens the chunk simulates, its points)
    for k, ((_, harness, _), same) in enumerate(loads):
        p = points[same[0]]
        if not chunks or k % size == 0 or (p.group, p.tp) != (points[chunks[-1][1][0]].group, points[chunks[-1][1][0]].tp):
            chunks.append((0, []))
        tokens, chunk = chunks[-1]
        chunks[-1] = (tokens + (0 if p.skip_reason() else simulated_tokens(p, harness)), chunk + same)
    return [chunk for _, chunk in sorted(chunks, key=lambda c: -c[0])]


def _validate_in_pool(points, chunks, results, jobs, work, settings, progress, done=0, on_done=None) -> list[PointResult]:
    """settings: _start_worker's arguments after the folder; done: the points already had."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_start_worker, initargs=(work, *settings))
    try:
        # Futures of our own, not pool.map: on Ctrl-C map's iterator cancels the pending ones,
        # which races the pool's manager thread (CPython 3.11 then prints an InvalidStateError).
        futures = {pool.submit(_work_chunk, [points[i] for i in chunk]): chunk for chunk in chunks}
        for future in as_completed(futures):  # (each chunk journaled as soon as it is done)
            chunk, chunk_results = futures[future], future.result()
            for i, r in zip(chunk, chunk_results):
                results[i] = r
            if on_done:
                on_done(chunk_results)
            done += len(chunk)
            if progress:
                progress(done, len(points))
    except BaseException:
        # Ctrl-C (or a worker's death): the workers are killed, then the pool shut down (its
        # manager thread finds them gone and fails the points left), rather than waited for.
        for proc in list((pool._processes or {}).values()):
            proc.kill()  # they ignore SIGINT and SIGTERM (the parent answers those); their files are in its folder
        pool.shutdown(wait=True)
        raise
    pool.shutdown()
    return results  # type: ignore[return-value]


def cmd_validate(args: argparse.Namespace) -> int:
    if args.points == "none" and not args.runs:
        raise ConfigError("--points none: nothing to validate without --runs DIR")
    if args.hardware:
        from simulator.hardware.specs import load_hardware

        load_hardware(args.hardware)  # an unknown one said now, in one line
    t0 = time.perf_counter()
    if args.points != "none":
        validate_points(args, t0)
    if args.runs:
        report_runs(args.runs, Path(args.out) if args.out else None, args.hardware)
    return 0


def validate_points(args: argparse.Namespace, t0: float) -> None:
    path = Path(args.points) if args.points else default_points_path()
    points = load_points(path)
    chosen = select(points, parse_filter(args.filter, points))
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.perf_counter()
        if not args.quiet and (now - last[0] > 2 or done == total):
            last[0] = now
            print(f"validate: {done}/{total} points ({now - t0:.0f} s)", file=sys.stderr, flush=True)

    journal = _journal(args, path)
    known = journal.results_for(chosen) if journal else {}
    try:
        results = validate(
            chosen,
            jobs=args.jobs,
            out_of_phase=args.phase == "spread",
            harness=args.harness,
            with_estimate=not args.no_aiconfigurator,
            progress=progress,
            known=known,
            on_done=journal.add if journal else None,
        )
    except KeyboardInterrupt:
        if journal:
            print(f"validate: stopped; the points done are kept in {journal.path}: the same command resumes", file=sys.stderr)
        raise
    print(f"{path}: {len(chosen)} of {len(points)} points" + (f" (--filter {args.filter})" if args.filter else ""))
    if known:
        print(f"{len(known)} of them from {journal.path} (an earlier run of the same code, file and options)")
    rows = group_rows(results)
    print(table(rows, GROUP_HEADER) if rows else "no point could be simulated")
    for reason, n in skip_counts(results):
        print(f"skipped {n}: {reason}")
    clients = harness_line(results)
    if clients:
        print(clients)
    faster = faster_than_kernels_line(results)
    if faster:
        print(faster)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_csv(results, out / "points.csv")
        write_html(results, out / "validate.html", f"testbed validate: {path.name}")
        print(f"wrote {out / 'points.csv'} and {out / 'validate.html'}")
    print(summary_line(results) + f"   ({time.perf_counter() - t0:.0f} s)")


def _journal(args: argparse.Namespace, points_path: Path) -> Journal | None:
    """--out's journal (journal.py), resumed or started, saying which; None without --out."""
    if not args.out:
        return None
    from testbed.runs.folder import check_out_folder

    out = check_out_folder(args.out)  # a bad --out said now, not after the points are simulated
    record = JournalRecord.of(points_path, args.harness, args.phase, not args.no_aiconfigurator)
    journal = Journal.open(out, record)
    if journal.kept and not args.quiet:
        print(f"validate: resuming from {journal.path} ({len(journal.kept)} points done)", file=sys.stderr)
    elif journal.started_afresh_because and not args.quiet:
        print(f"validate: {journal.path} started afresh: {journal.started_afresh_because}", file=sys.stderr)
    return journal


def report_runs(paths: list[str], out: Path | None, hardware: str | None = None) -> None:
    """Each real run replayed in sim: its TTFT, TPOT and E2E figures and their errors."""
    import tempfile

    from testbed.runs.cli import INTAKE_NOTE
    from testbed.validate.runs import FIGURES, HEADERS, run_folders, validate_run

    folders = run_folders(paths)
    with tempfile.TemporaryDirectory(prefix="testbed-validate-runs-") as tmp:
        base = out / "runs" if out else Path(tmp)
        for folder in folders:
            r = validate_run(folder, base / folder.name, hardware)
            if r.skipped:
                print(f"run {folder}: skipped: {r.skipped}")
                continue
            intake = f"; {INTAKE_NOTE}" if r.ttft_from == "queued" else ""
            print(f"run {folder}: {r.model} on {r.gpu} x{r.tp}{r.layout}, {r.kernels}{intake}; (sim - real) / real")
            rows = [
                ("real (ms)", *(f"{r.real[k]:,.1f}" if r.real[k] is not None else "-" for k in FIGURES)),
                ("sim (ms)", *(f"{r.sim[k]:,.1f}" if r.sim[k] is not None else "-" for k in FIGURES)),
                ("error", *("-" if r.error(k) is None else f"{r.error(k) * 100:+.1f}%" for k in FIGURES)),
            ]
            print(table(rows, ("", *HEADERS), left=1))
            if out:
                pair = base / folder.name
                real, sim = shlex.quote(str(pair / "real")), shlex.quote(str(pair / "sim"))
                print(f"where in the run: testbed compare {real} {sim} --by-arrival 10")


def register(sub) -> None:
    p = sub.add_parser("validate", help="the simulator against measured serving points (default: AIConfigurator's silicon_sample.csv)")
    p.add_argument(
        "--points",
        default=None,
        help="a CSV of measured points with silicon_sample.csv's columns (default: that file, "
        "from the installed aiconfigurator-core; none: only --runs)",
    )
    p.add_argument(
        "--filter",
        default=None,
        metavar="COLUMN=VALUE,...",
        help="only the points with these values, e.g. system=h200_sxm,backend=vllm (a column given twice takes either value)",
    )
    p.add_argument(
        "--runs",
        nargs="+",
        default=None,
        metavar="DIR",
        help="also real per-request runs (LLMServingSim's "
        "requests.jsonl + meta.json, as ../shared/ground_truth/vllm-*; or a folder of them): each replayed in sim with "
        "its settings, TTFT/TPOT mean, p50 and p90 errors",
    )
    p.add_argument(
        "--hardware",
        default=None,
        metavar="NAME|JSON",
        help="the GPU of every --runs folder, where its meta.json names none the simulator knows (a bundled spec, "
        "an AIConfigurator system, or a spec's JSON file)",
    )
    p.add_argument("--out", default=None, help="folder for points.csv (every point: measured, sim, AIConfigurator) and validate.html")
    p.add_argument("--no-aiconfigurator", action="store_true", help="leave out AIConfigurator's own estimate of the points")
    p.add_argument(
        "--harness",
        choices=("auto", *HARNESSES),
        default="auto",
        help="the benchmark client that measured the points: inferencemax (10 x concurrency requests, lengths drawn "
        "from [0.8 L, L]), fixed (exact lengths, synchronized waves), or auto (default: a point's harness column, else "
        "inferencemax for its shapes 1k/1k, 1k/8k, 8k/1k unless the source names a gap-analysis job, else fixed; "
        "testbed/validate/harness.py)",
    )
    p.add_argument(
        "--phase",
        choices=("together", "spread"),
        default="together",
        help="how the clients of a fixed-length harness start: "
        "together (as a benchmark's --max-concurrency sends its first wave; default) or spread out of phase over "
        "one request's decode",
    )
    p.add_argument("-j", "--jobs", type=positive_int, default=os.cpu_count() or 1, help="processes (default: one a core, %(default)s)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_validate)
