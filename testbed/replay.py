"""replay: one trace through the scheduler core, on the simulator's clock (--mode sim) or the real engine's
(--mode real), or sent to a live server (--mode server, testbed/live/), into a run folder."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterator

from scheduler.core.protocol import SchedulerCore
from scheduler.core.req import Req
from scheduler.core.sampling import SamplingParams
from scheduler.loop.arrivals import ArrivalSource, ClosedLoopArrivals, OpenLoopArrivals
from scheduler.loop.event_loop import EventLoop
from scheduler.loop.gc_pause import gc_paused
from scheduler.model_config import ModelConfig, load_model_config
from scheduler.sglang.config import SchedulerConfig
from scheduler.vllm.config import VllmSchedulerConfig
from testbed.backends import build_real, build_sim
from testbed.interrupts import deferred_interrupts, interrupt_once
from testbed.options import ReplayOptions, check_options, closed_loop_note, recorded_options, resolved_options, with_scheduler_defaults
from testbed.replay_result import ReplayProgress, ReplayResult, default_run_dir, run_meta, trace_record  # noqa: F401 - re-exported
from testbed.runs import metrics
from testbed.runs.folder import REQUESTS_FILE, STEPS_FILE, RunLoadError, check_out_folder, read_run_meta
from testbed.runs.writer import RunWriter
from testbed.schedulers import scheduler_kind
from testbed.traces.formats import detect_format, load_trace
from testbed.traces.schema import Trace, TracePrompts


def finished_run_meta(run_dir: Path, trace_sha256: str, opts: ReplayOptions) -> dict | None:
    """run.json of a complete run in run_dir of this trace with these options, with both
    tables; None otherwise (then replaying is the way to have it)."""
    try:
        meta = read_run_meta(Path(run_dir))
    except RunLoadError:
        return None
    same = (meta.get("trace") or {}).get("sha256") == trace_sha256 and meta.get("options") == recorded_options(resolved_options(opts))
    tables = all((Path(run_dir) / f).is_file() for f in (REQUESTS_FILE, STEPS_FILE))
    return meta if meta.get("status") == "complete" and same and tables else None


# The rate a closed loop reads a trace without arrival times at (sharegpt): its arrivals are not used.
CLOSED_LOOP_PLACEHOLDER_RATE = 1.0


def load_replay_trace(trace_path: str | Path, opts: ReplayOptions) -> Trace:
    """The trace as a replay with these options reads it (before --max-requests). A closed loop
    (--concurrency) uses no arrival times, so a trace without them (sharegpt) needs no --rate."""
    rate = opts.rate
    if opts.concurrency is not None and rate is None and (opts.format or detect_format(str(trace_path))) == "sharegpt":
        rate = CLOSED_LOOP_PLACEHOLDER_RATE
    return load_trace(trace_path, opts.format, rate=rate, seed=opts.seed, time_scale=opts.time_scale)


def make_arrivals(requests: Iterator[Req], opts: ReplayOptions) -> ArrivalSource:
    """Open loop (each request at its arrival time), or closed loop with --concurrency N."""
    return OpenLoopArrivals(requests) if opts.concurrency is None else ClosedLoopArrivals(requests, opts.concurrency)


def make_requests(trace: Trace, opts: ReplayOptions, model: ModelConfig, vocab_size: int | None) -> Iterator[Req]:
    """Reqs in arrival order, made one at a time; their prompts are made when first needed."""
    eos = model.eos_token_id
    t0 = trace.requests[0].arrival_s if trace.requests else 0.0
    prompts = TracePrompts(trace.requests, vocab_size)
    for i, tr in enumerate(trace.requests):
        yield Req(
            rid=tr.rid if tr.rid is not None else str(i),
            input_len=tr.input_len,
            input_ids_fn=(lambda i=i: prompts.prompt(i)),
            sampling_params=SamplingParams(max_new_tokens=tr.output_len, ignore_eos=True),
            arrival_time=(tr.arrival_s - t0) * opts.time_scale,
            priority=tr.priority,
            eos_token_ids=eos,
            index=i,
        )


def scheduler_config(opts: ReplayOptions, model: ModelConfig, kv_tokens: int) -> SchedulerConfig | VllmSchedulerConfig:
    """The config of the scheduler opts names."""
    return scheduler_kind(opts.scheduler).config(with_scheduler_defaults(opts), model, kv_tokens)


def new_scheduler(opts: ReplayOptions, config: SchedulerConfig | VllmSchedulerConfig) -> SchedulerCore:
    return scheduler_kind(opts.scheduler).new(config)


def replay(
    trace_path: str,
    opts: ReplayOptions,
    out: str | Path | None = None,
    progress: Callable[[ReplayProgress], None] | None = None,
    started: Callable[[dict], None] | None = None,
) -> ReplayResult:
    """Replay a trace and write its run folder. started(run.json) is called once the folder is
    made (every input checked), progress(ReplayProgress) after every step.

    A KeyboardInterrupt (Ctrl-C, or SIGTERM in the CLI) leaves the folder marked "incomplete"
    (with every request so far) and is raised again; a second one meanwhile is ignored.
    """
    with interrupt_once():
        return _replay(trace_path, opts, out, progress, started)


def _replay(trace_path, opts, out, progress, started) -> ReplayResult:
    check_options(opts)
    wall_start = time.perf_counter()
    if opts.mode == "server":  # the server schedules: no scheduler or clock of ours (testbed/live/)
        from testbed.live.server_replay import replay_server

        trace = load_replay_trace(trace_path, opts)
        if opts.max_requests is not None:
            trace.requests = trace.requests[: opts.max_requests]
        return replay_server(trace, opts, trace_path, out, progress, started, wall_start)
    opts = resolved_options(opts)  # run.json records what ran
    model = load_model_config(opts.model)
    trace = load_replay_trace(trace_path, opts)
    if opts.max_requests is not None:
        trace.requests = trace.requests[: opts.max_requests]
    build = build_sim if opts.mode == "sim" else build_real
    backend, config = build(opts, model, lambda kv_tokens: scheduler_config(opts, model, kv_tokens))
    kv_tokens = backend.kv_tokens
    if opts.disaggregated:  # prefill and decode instances of that kind, a router and a link (testbed/pd_replay.py)
        from testbed.pd_replay import replay_pd

        return replay_pd(
            trace,
            opts,
            trace_path,
            out,
            progress,
            started,
            wall_start,
            model,
            backend,
            config,
            lambda: make_requests(trace, opts, model, backend.vocab_size),
        )
    if opts.replicas > 1:  # a cluster of such instances behind a router (testbed/cluster_replay.py)
        from testbed.cluster_replay import replay_cluster

        return replay_cluster(
            trace,
            opts,
            trace_path,
            out,
            progress,
            started,
            wall_start,
            model,
            backend,
            config,
            lambda: make_requests(trace, opts, model, backend.vocab_size),
            new_scheduler,
        )

    run_dir = check_out_folder(out) if out is not None else default_run_dir(trace_path, opts)
    note = closed_loop_note(opts)
    meta = run_meta(trace, trace_path, opts, model, backend, config, **({"arrivals": note} if note is not None else {}))
    scheduler = new_scheduler(opts, config)
    driver = backend.driver
    total = len(trace)
    tokens = [r.input_len + r.output_len for r in trace.requests]  # as the trace asks (a cut is still done)
    tokens_total = sum(tokens)
    tokens_done = [0, 0]  # tokens of scheduler.done[: counted]; counted

    def after_step(done: int) -> None:
        writer.after_step(loop.steps, scheduler.done)
        if progress is not None:
            finished = scheduler.done
            tokens_done[0] += sum(tokens[r.index] for r in finished[tokens_done[1] :])
            tokens_done[1] = len(finished)
            progress(ReplayProgress(done, total, tokens_done[0], tokens_total))

    arrivals = make_arrivals(make_requests(trace, opts, model, backend.vocab_size), opts)
    loop = EventLoop(scheduler, arrivals, driver.clock, opts.overlap, after_step)
    with deferred_interrupts():  # from the folder's first file on, the finally below says how the run ended
        writer = RunWriter(run_dir, meta)
    status = "incomplete"  # until the loop ends: Ctrl-C leaves it so
    try:
        if started is not None:
            started(meta)
        if progress is not None:
            progress(ReplayProgress(0, total, 0, tokens_total))
        try:
            driver.run(loop)
        finally:
            # steps.parquet's last part is written on a thread of its own while the run is
            # checked and its other tables made (a second Ctrl-C meanwhile waits).
            with deferred_interrupts(), gc_paused(collect_earlier=False):
                writer.finish_steps(loop.steps)
        scheduler.check_invariants()
        status = "complete"
    except Exception as e:
        status = "failed"
        meta["error"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        with deferred_interrupts(), gc_paused(collect_earlier=False):  # a second Ctrl-C waits for the tables
            # Every request received: finished, rejected, or (interrupted) still unfinished.
            requests = metrics.requests_table(loop.received)
            meta["status"] = status
            meta["summary"] = metrics.run_summary(requests, len(loop.steps), driver.clock(), kv_tokens)
            wall_s = time.perf_counter() - wall_start
            writer.finish(meta, requests, wall_s)
    return ReplayResult(run_dir, status, meta["summary"], wall_s, meta, metrics.rejection_counts(requests))
