"""replay --mode server: a trace sent to a live OpenAI-compatible server, into a run folder.

The server schedules; this records what its client sees, as serving benchmarks do: each
request's send time (its `arrival`), every token's arrival, its finish, the tokens the server
counted, and its error if it failed (`failed: <kind>: <words>` in `reason`, status unfinished,
counted by kind in the summary). The steps table holds the server's `/metrics` read once a second
(mode `scrape`: running, waiting, KV in use) where it has one. The folder is the one the other
modes write (mode `server`; run.json's `server` says its URL, model and version), so compare,
sweeps, capacity and the dashboard read it.

Prompts are token ids (materialized as for the other modes: requests that share prefix hashes
share leading ids), drawn below the vocabulary of `--model` where that names a bundled config
(or the served model does), else below SAFE_VOCAB, which every tokenizer in use covers.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Callable

from scheduler.loop.step_log import StepLog, StepRow
from scheduler.model_config import ModelConfigError, load_model_config
from testbed.errors import ConfigError
from testbed.interrupts import deferred_interrupts
from testbed.live.endpoints import ENDPOINTS
from testbed.live.openai_stream import chat_body, completion_body
from testbed.live.sender import LiveRequest, LiveRun, send_all
from testbed.live.server_info import ServerInfo, probe_server
from testbed.replay_options import recorded_options
from testbed.replay_result import ReplayProgress, ReplayResult, default_run_dir, trace_record
from testbed.runs import metrics
from testbed.runs.folder import check_out_folder, versions
from testbed.runs.importers.imported import failed_req, finished_req
from testbed.runs.writer import RunWriter
from testbed.traces.schema import TracePrompts

SAFE_VOCAB = 32000  # token ids below this exist in every tokenizer served today (Llama 2's is 32,000)


def _vocab_size(model_name: str | None, info: ServerInfo) -> int:
    """The vocabulary prompts are drawn from: --model's (a bundled config or a folder; refused if
    it loads nothing), else the served model's where its name is a bundled config, else SAFE_VOCAB."""
    if model_name is not None:
        try:
            return load_model_config(model_name).vocab_size
        except (ModelConfigError, OSError) as e:
            raise ConfigError(f"--model {model_name}: {e}") from None
    try:
        return load_model_config(info.model).vocab_size
    except (ModelConfigError, OSError):
        return SAFE_VOCAB


def _record_row(req: LiveRequest, rid: str, input_len: int, output_len: int):
    """The Req row of requests.parquet for a request that ended (well or not)."""
    rec = req.record
    if rec.error is None and rec.token_times:
        row = finished_req(rid, input_len, output_len, rec.sent, rec.token_times[0], rec.finish, rec.token_times, rec.sent)
        row.output_ids = [0] * rec.output_tokens  # what the server generated (max_new_tokens: what was asked)
        row.cached_tokens = rec.cached_tokens or 0
    else:
        error = f"{rec.error}: {rec.detail}" if rec.error else "empty stream: no token came"
        row = failed_req(rid, input_len, rec.sent if rec.sent is not None else req.arrival, error)  # reason "failed: <kind>: ..."
    row.index = req.index
    return row


def _kv_tokens(run: LiveRun) -> int | None:
    return next((sc.gauges.kv_tokens for sc in run.scrapes if sc.gauges.kv_tokens), None)


def append_scrape_steps(steps: StepLog, run: LiveRun) -> None:
    """The scrapes not in steps yet, as its rows: a row a scrape (mode "scrape"; every time column
    its time) with the server's running and waiting requests and KV in use (its usage fraction
    times its pool, where it says), and as num_tokens the output tokens the client received since
    the scrape before, so that throughput over time reads as for the other modes."""
    kv_tokens = _kv_tokens(run)
    for i in range(len(steps), len(run.scrapes)):
        sc = run.scrapes[i]
        g, t = sc.gauges, sc.t
        received = sc.received - (run.scrapes[i - 1].received if i else 0)
        used = int(round(g.kv_usage * kv_tokens)) if g.kv_usage is not None and kv_tokens else 0
        running, waiting = g.running or 0, g.waiting or 0
        steps.append(StepRow(i, "scrape", running, received, 0, 0, t, t, t, t, t, t, t, t, used, 0, running, waiting, 0, 0, 0.0))


def replay_server(trace, opts, trace_path: str, out, progress: Callable | None, started: Callable | None, wall_start: float):
    """The server half of testbed.replay.replay (it has loaded the trace and checked the options)."""
    info = probe_server(opts.url, opts.served_model)
    vocab = _vocab_size(opts.model, info)
    prompts = TracePrompts(trace.requests, vocab)
    make_body = chat_body if opts.endpoint == "chat" else completion_body
    t0 = trace.requests[0].arrival_s if trace.requests else 0.0
    live = [
        LiveRequest(
            index=i,
            arrival=(tr.arrival_s - t0) * opts.time_scale,
            body=(lambda i=i, tr=tr: make_body(info.model, prompts.prompt(i).tolist(), tr.output_len)),
        )
        for i, tr in enumerate(trace.requests)
    ]
    run = LiveRun(live)
    run_dir = check_out_folder(out) if out is not None else default_run_dir(trace_path, opts)
    meta = {
        "status": "running",
        "mode": "server",
        "trace": trace_record(trace, trace_path, opts),
        "options": recorded_options(opts),
        "model": info.model,
        "server": {
            "url": info.url,
            "endpoint": ENDPOINTS[opts.endpoint],
            "model": info.model,
            "version": info.version,
            "max_model_len": info.max_model_len,
            "metrics": info.has_metrics,
            "prompt_vocab": vocab,
        },
        "versions": versions(),
        "summary": None,
    }
    total = len(live)
    tokens = [r.input_len + r.output_len for r in trace.requests]
    tokens_total = sum(tokens)
    done_rows: list = []
    steps = StepLog()
    state = {"tokens_done": 0}

    def on_done(req: LiveRequest) -> None:
        tr = trace.requests[req.index]
        done_rows.append(_record_row(req, tr.rid if tr.rid is not None else str(req.index), tr.input_len, tr.output_len))
        append_scrape_steps(steps, run)
        writer.after_step(steps, done_rows)  # (journaled about once a second: a kill loses at most that)
        state["tokens_done"] += tokens[req.index]
        if progress is not None:
            progress(ReplayProgress(len(done_rows), total, state["tokens_done"], tokens_total))

    with deferred_interrupts():
        writer = RunWriter(run_dir, meta)
    status = "incomplete"
    try:
        if started is not None:
            started(meta)
        if progress is not None:
            progress(ReplayProgress(0, total, 0, tokens_total))
        try:
            asyncio.run(
                send_all(
                    run,
                    info.url + ENDPOINTS[opts.endpoint],
                    info.url + "/metrics" if info.has_metrics else None,
                    opts.concurrency,
                    opts.request_timeout,
                    on_done,
                )
            )
        finally:
            append_scrape_steps(steps, run)
            with deferred_interrupts():
                writer.finish_steps(steps)
        failed = sum(1 for r in done_rows if r.reject_reason)
        if total and failed == total:
            first = next(r.reject_reason for r in done_rows)
            raise ConfigError(f"every request failed (the first: {first})")
        status = "complete"
    except Exception as e:
        status = "failed"
        meta["error"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        with deferred_interrupts():
            ended = {r.index for r in done_rows}
            # Requests not ended (an interrupt): their rows say so, with the send time they had.
            rows = done_rows + [
                _unfinished_row(req, trace.requests[req.index]) for req in live if req.index not in ended and req.record.sent is not None
            ]
            requests = metrics.requests_table(rows)
            meta["status"] = status
            lags = [r.record.sent - r.arrival for r in live if r.record.sent is not None]
            # What the client cannot see is unknown, not zero: the prefix cache's hits unless the
            # server's usage reports them, and the server's preemptions.
            known_hits = any(r.record.cached_tokens is not None for r in live)
            unknown = {"num_retractions": None} | ({} if known_hits else {"cache_hit_rate": None})
            meta["summary"] = (
                metrics.run_summary(requests, len(steps), time.perf_counter() - wall_start, _kv_tokens(run))
                | unknown
                | (
                    {"send_lag_p50_ms": statistics.median(lags) * 1e3, "send_lag_p99_ms": _p99(lags) * 1e3}
                    if lags and opts.concurrency is None
                    else {}
                )
            )
            wall_s = time.perf_counter() - wall_start
            writer.finish(meta, requests, wall_s)
    return ReplayResult(
        run_dir, status, meta["summary"], wall_s, meta, metrics.rejection_counts(requests), metrics.failure_counts(requests)
    )


def _unfinished_row(req: LiveRequest, tr):
    from scheduler.core.req import Req
    from scheduler.core.sampling import SamplingParams

    row = Req(
        rid=tr.rid if tr.rid is not None else str(req.index),
        input_len=tr.input_len,
        input_ids_fn=list,
        sampling_params=SamplingParams(max_new_tokens=tr.output_len, ignore_eos=True),
        arrival_time=req.record.sent,
        index=req.index,
    )
    row.token_times.extend(req.record.token_times)
    row.output_ids = [0] * len(req.record.token_times)
    row.first_token_time = req.record.token_times[0] if req.record.token_times else None
    return row


def _p99(values: list[float]) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]
