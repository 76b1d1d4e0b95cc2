"""ImportedRun: what an importer reads from another system's run, as this project's rows.

Each request becomes a Req (the row model of requests.parquet, testbed.runs.metrics) with
the times the source recorded, so the summary comes from the project's own metrics.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

from scheduler.core.req import FinishReason, Req
from scheduler.core.sampling import SamplingParams
from testbed.errors import TraceError
from testbed.traces.fields import shown

Where = tuple[str, "int | None"]


@dataclass
class ImportedRun:
    format: str
    requests: list[Req]  # finished requests first (by arrival), then failed ones
    model: str | None  # as the source names it
    scheduler: str  # the engine whose scheduler ran: "vllm" or "sglang"
    engine: dict = field(default_factory=dict)  # engine settings the source carries, as it names them
    # Replay options those settings amount to (scheduler, max_num_seqs, page_size, ...).
    options: dict = field(default_factory=dict)
    hardware: str | None = None
    kv_tokens: int | None = None  # the KV pool, when the source says
    # What the source lacks and what the import did about it, one sentence each.
    missing: list[str] = field(default_factory=list)
    # What its TTFT and E2E are measured from (testbed/runs/metrics.py): "arrival", or "queued" where
    # the engine stamped its own intake of each request and that is the run's arrival.
    ttft_from: str = "arrival"


def fail(where: Where, field_name: str | None, message: str) -> TraceError:
    return TraceError(where[0], where[1], field_name, message)


def number(value: Any, field_name: str, where: Where, minimum: float | None = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail(where, field_name, f"must be a number, got {value!r}")
    if minimum is not None and value < minimum:
        raise fail(where, field_name, f"must be >= {minimum:g}, got {value!r}")
    return float(value)


# A request's token count: more than any model's context, and its per-token times would not fit in memory.
MAX_TOKENS = 2**24


def count(value: Any, field_name: str, where: Where, minimum: int = 0) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_TOKENS:
        raise fail(where, field_name, f"must be an integer from {minimum} to {MAX_TOKENS:,}, got {shown(value)}")
    return value


def require(obj: dict, key: str, where: Where) -> Any:
    if key not in obj:
        raise fail(where, key, "missing")
    return obj[key]


def json_lines(path: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) for each non-blank line."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as e:
                    raise TraceError(path, lineno, None, f"invalid JSON: {e.msg} (column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise TraceError(path, None, None, f"not UTF-8 text ({e.reason} at byte {e.start})") from None


def finished_req(
    rid: str,
    input_len: int,
    output_len: int,
    arrival: float,
    first_token: float,
    finish: float,
    token_times: list[float] | None = None,
    scheduled: float | None = None,
    queued: float | None = None,
) -> Req:
    """A request that completed, with the times the source recorded (seconds, any origin)."""
    req = Req(
        rid=rid,
        input_len=input_len,
        input_ids_fn=list,  # the prompt's tokens are not part of a run's record
        sampling_params=SamplingParams(max_new_tokens=output_len, ignore_eos=True),
        arrival_time=arrival,
    )
    req.output_ids = [0] * output_len  # only their number is known
    req.queued_time = queued
    req.scheduled_time = scheduled
    req.first_token_time = first_token
    req.finish_time = finish
    req.finished_reason = FinishReason.LENGTH
    req.prefill_tokens = input_len
    if token_times:
        req.token_times.extend(token_times)
    return req


def failed_req(rid: str, input_len: int, arrival: float, error: str) -> Req:
    """A request the source reports as failed: a row with status unfinished and the error."""
    req = Req(
        rid=rid, input_len=max(input_len, 1), input_ids_fn=list, sampling_params=SamplingParams(max_new_tokens=1), arrival_time=arrival
    )
    req.reject_reason = "failed: " + (error.strip().splitlines() or ["no error message"])[-1][:200]
    return req
