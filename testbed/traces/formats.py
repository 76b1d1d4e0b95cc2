"""Trace importers: the native format and public traces, detected by content.

Every loader validates as it reads and raises TraceError naming the file, the 1-based
line and the field, so that a user can fix a hand-written or converted trace quickly.

Formats (see docs/trace-format.md):
  native    JSON object {"format": "testbed-trace", "version": 1, "requests": [...]} (the format and
            version keys may be left out), a bare JSON array, JSONL, or CSV with the native keys
            as its header (arrival,input_len,output_len[,id,priority])
  mooncake  JSONL: timestamp (ms), input_length, output_length, hash_ids (512-token blocks)
  azure     CSV: TIMESTAMP (wall clock), ContextTokens, GeneratedTokens
  sharegpt  CSV: num_prefill_tokens, num_decode_tokens, ...; no arrivals, so Poisson at --rate
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from datetime import datetime
from typing import Any, Iterator

import numpy as np

from testbed.errors import ConfigError, TraceError
from testbed.traces.fields import (
    CSV_BLANKS,
    INT64_MAX,
    INT64_MIN,
    Arrivals,
    check_hashes,
    csv_int,
    csv_number,
    fail,
    int_field,
    int_list_field,
    parse_timestamp,
    require,
    time_field,
)
from testbed.traces.gen import poisson_arrivals
from testbed.traces.schema import (
    DEFAULT_BLOCK_SIZE,
    NATIVE_FORMAT_TAG,
    NATIVE_VERSION,
    Trace,
    TraceRequest,
)

FORMATS = ("native", "mooncake", "azure", "sharegpt")
MOONCAKE_BLOCK_SIZE = 512
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
NATIVE_CSV_COLUMNS = ("arrival", "input_len", "output_len")  # the native keys as a CSV header
NATIVE_CSV_OPTIONAL = ("id", "priority")
SHAREGPT_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")


# Python's JSON reader recurses once a level: a document nested thousands deep cannot be read.
TOO_DEEP = "JSON nested too deeply to read (a trace is a list of flat request objects)"

# --- detection -------------------------------------------------------------------------


def _first_line(path: str) -> tuple[int, str, str]:
    """(line number, text) of the first non-blank line, and the first 64 KiB of the file.
    The line is read whole: a native request with explicit input_ids can be long."""
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:  # -sig drops a BOM
            head = f.read(1 << 16)
            f.seek(0)
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    return lineno, line.strip(), head
    except OSError as e:
        raise TraceError(path, None, None, f"cannot read: {e.strerror or e}") from None
    raise TraceError(path, None, None, "empty trace file")


def detect_format(path: str | os.PathLike) -> str:
    """The format of a trace file, from its first line (never from its name)."""
    path = str(path)
    lineno, line, head = _first_line(path)
    if line[0] == "[":
        return "native"
    if line[0] == "{":
        try:
            obj = json.loads(line)
        except RecursionError:
            raise TraceError(path, lineno, None, TOO_DEEP) from None
        except json.JSONDecodeError as e:
            # The JSON form opens its object on the first line without closing it.
            if NATIVE_FORMAT_TAG in head or '"requests"' in head:
                return "native"
            raise TraceError(path, lineno, None, f"invalid JSON: {e.msg} (column {e.colno})") from None
        if isinstance(obj, dict):
            if "hash_ids" in obj or ("timestamp" in obj and "input_length" in obj):
                return "mooncake"
            if obj.get("format") == NATIVE_FORMAT_TAG or "requests" in obj or "arrival" in obj:
                return "native"
        raise TraceError(path, lineno, None, "JSON, but neither a testbed trace nor a Mooncake trace; use --format")
    header = next(csv.reader([line]))
    cols = {c.strip() for c in header}
    if set(AZURE_COLUMNS) <= cols:
        return "azure"
    if set(NATIVE_CSV_COLUMNS) <= cols:
        return "native"
    if set(SHAREGPT_COLUMNS) <= cols:
        return "sharegpt"
    expected = f"JSON/JSONL (native, mooncake) or CSV with {','.join(AZURE_COLUMNS)} (azure)"
    expected += f" or {','.join(SHAREGPT_COLUMNS)} (sharegpt)"
    raise TraceError(path, lineno, None, f"unrecognized trace format (header {header[:6]!r}); expected {expected}")


def load_trace(
    path: str | os.PathLike, format: str | None = None, *, rate: float | None = None, seed: int = 0, time_scale: float = 1.0
) -> Trace:
    """Load and validate a trace. `format` forces a format instead of detecting it;
    `rate` (req/s) and `seed` make Poisson arrivals for formats that have none (sharegpt), and
    are refused for the others; every arrival must stay finite under `time_scale`."""
    path = str(path)
    fmt = format or detect_format(path)
    if fmt not in FORMATS:
        raise TraceError(path, None, None, f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    arrivals = Arrivals(time_scale)
    try:
        requests = _load_sharegpt(path, rate, seed, arrivals) if fmt == "sharegpt" else _LOADERS[fmt](path, arrivals)
    except UnicodeDecodeError as e:
        message = f"not UTF-8 text ({e.reason} at byte {e.start}); is it a {fmt} trace?"
        raise TraceError(path, None, None, message) from None
    except RecursionError:
        raise TraceError(path, None, None, TOO_DEEP) from None
    except OSError as e:
        raise TraceError(path, None, None, f"cannot read: {e.strerror or e}") from None
    if not requests:
        raise TraceError(path, None, None, "the trace has no requests")
    if rate is not None and fmt != "sharegpt":
        raise ConfigError(
            f"--rate {rate:g}: {path} has its own arrival times ({fmt} trace); --rate is for traces "
            "without them (sharegpt). --time-scale changes the load"
        )
    return Trace(requests=requests, path=path, format=fmt)


# --- native ----------------------------------------------------------------------------


def _native_request(obj: Any, where: tuple[str, int | None], arrivals: Arrivals) -> TraceRequest:
    if not isinstance(obj, dict):
        raise fail(where, None, f"a request must be a JSON object, got {type(obj).__name__}")
    arrival = arrivals.check(time_field(require(obj, "arrival", where), "arrival", where), "arrival", where)
    input_ids = None
    if "input_ids" in obj:
        input_ids = int_list_field(obj["input_ids"], "input_ids", where, minimum=0)
        if not input_ids:
            raise fail(where, "input_ids", "must not be empty")
        input_len = len(input_ids)
        if "input_len" in obj and int_field(obj["input_len"], "input_len", where, 1) != input_len:
            raise fail(where, "input_len", f"is {obj['input_len']!r} but input_ids has {input_len} tokens")
    elif "input_len" in obj:
        input_len = int_field(obj["input_len"], "input_len", where, 1)
    else:
        raise fail(where, "input_len", "missing (give input_len or input_ids)")
    output_len = int_field(require(obj, "output_len", where), "output_len", where, 1)
    block_size = int_field(obj.get("block_size", DEFAULT_BLOCK_SIZE), "block_size", where, 1)
    hashes = None
    if obj.get("block_hashes") is not None:
        hashes = int_list_field(obj["block_hashes"], "block_hashes", where, minimum=None)
        # Blocks past the hashes are unique to the request, so fewer hashes is fine.
        check_hashes(hashes, input_len, block_size, False, "block_hashes", where)
    rid = obj.get("id")
    if rid is not None and not isinstance(rid, str):
        raise fail(where, "id", f"must be a string, got {rid!r}")
    priority = obj.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool) or not INT64_MIN <= priority <= INT64_MAX:
        raise fail(where, "priority", f"must be an integer in [-2**63, 2**63 - 1], got {priority!r}")
    return TraceRequest(arrival, input_len, output_len, input_ids, hashes, block_size, rid, priority)


def _check_header(obj: dict, where: tuple[str, int | None]) -> None:
    if "format" in obj and obj["format"] != NATIVE_FORMAT_TAG:  # {"requests": [...]} alone is native too
        raise fail(where, "format", f"must be {NATIVE_FORMAT_TAG!r}, got {obj.get('format')!r}")
    version = obj.get("version", NATIVE_VERSION)
    if version != NATIVE_VERSION:
        raise fail(where, "version", f"this testbed reads version {NATIVE_VERSION}, got {version!r}")


def _jsonl_objects(path: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) for each non-blank line."""
    with open(path, encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(path, lineno, None, f"invalid JSON: {e.msg} (column {e.colno})") from None


def _load_native(path: str, arrivals: Arrivals) -> list[TraceRequest]:
    # JSONL when the first line is a complete JSON object on its own (a request or the
    # header); the JSON form's first line opens the document and does not parse alone
    # (or, written on one line, holds the "requests" list itself). CSV when it is no JSON.
    _, line, _ = _first_line(path)
    if not line.startswith(("{", "[")):
        return _load_native_csv(path, arrivals)
    try:
        jsonl = line.startswith("{") and "requests" not in json.loads(line)
    except json.JSONDecodeError:
        jsonl = False
    return _load_native_jsonl(path, arrivals) if jsonl else _load_native_json(path, arrivals)


def _load_native_jsonl(path: str, arrivals: Arrivals) -> list[TraceRequest]:
    requests: list[TraceRequest] = []
    for lineno, obj in _jsonl_objects(path):
        where = (path, lineno)
        if isinstance(obj, dict) and "format" in obj:
            if requests:
                raise fail(where, "format", "a header object is only allowed on the first line")
            _check_header(obj, where)
            continue
        requests.append(_native_request(obj, where, arrivals))
    return requests


def _load_native_json(path: str, arrivals: Arrivals) -> list[TraceRequest]:
    with open(path, encoding="utf-8-sig") as f:
        text = f.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(path, e.lineno, None, f"invalid JSON: {e.msg} (column {e.colno})") from None
    if isinstance(doc, dict):
        _check_header(doc, (path, 1))
        items = require(doc, "requests", (path, 1))
        if not isinstance(items, list):
            raise fail((path, 1), "requests", f"must be a list, got {type(items).__name__}")
    elif isinstance(doc, list):
        items = doc  # a bare array of request objects is accepted too
    else:
        raise TraceError(path, 1, None, "expected a JSON object with a 'requests' list")
    requests: list[TraceRequest] = []
    for i, obj in enumerate(items):
        try:
            requests.append(_native_request(obj, (path, None), arrivals))
        except TraceError as e:
            # Parsing the whole document at once is fast; only on an error do we find out
            # which line the offending request starts on.
            e.line = _json_element_lines(text)[i]
            raise
    return requests


def _csv_value(text: str) -> Any:
    """A CSV cell as JSON would have it: an int, a float (ASCII digits only: Python's own parsers take
    `1_000` and non-ASCII digits, which a CSV writer never means), else the text."""
    return csv_number(text)


def _load_native_csv(path: str, arrivals: Arrivals) -> list[TraceRequest]:
    """The native keys as CSV columns (arrival,input_len,output_len[,id,priority]), checked as JSON is."""
    requests: list[TraceRequest] = []
    for lineno, row in _csv_rows(path, NATIVE_CSV_COLUMNS, NATIVE_CSV_OPTIONAL):
        obj = {k: (v if k == "id" else _csv_value(v)) for k, v in row.items() if v != ""}
        requests.append(_native_request(obj, (path, lineno), arrivals))
    return requests


def _json_element_lines(text: str) -> list[int]:
    """1-based line of each element of the requests array (or of a top-level array)."""
    decoder = json.JSONDecoder()
    ws = re.compile(r"\s*")

    def skip(pos: int) -> int:
        return ws.match(text, pos).end()

    pos = skip(1 if text.startswith("\ufeff") else 0)
    if text[pos] == "{":
        pos = skip(pos + 1)
        while text[pos] != "}":
            key, pos = decoder.raw_decode(text, pos)
            pos = skip(skip(pos) + 1)  # past ':'
            if key == "requests":
                break
            _, pos = decoder.raw_decode(text, pos)
            pos = skip(pos)
            if text[pos] == ",":
                pos = skip(pos + 1)
    lines: list[int] = []
    pos = skip(pos + 1)  # past '['
    while pos < len(text) and text[pos] != "]":
        lines.append(text.count("\n", 0, pos) + 1)
        _, pos = decoder.raw_decode(text, pos)
        pos = skip(pos)
        if text[pos] == ",":
            pos = skip(pos + 1)
    return lines


# --- mooncake --------------------------------------------------------------------------


def _load_mooncake(path: str, arrivals: Arrivals) -> list[TraceRequest]:
    requests: list[TraceRequest] = []
    for lineno, obj in _jsonl_objects(path):
        where = (path, lineno)
        if not isinstance(obj, dict):
            raise fail(where, None, f"a request must be a JSON object, got {type(obj).__name__}")
        arrival = time_field(require(obj, "timestamp", where), "timestamp", where) / 1000.0  # ms -> s
        arrivals.check(arrival, "timestamp", where)
        input_len = int_field(require(obj, "input_length", where), "input_length", where, 1)
        output_len = int_field(require(obj, "output_length", where), "output_length", where, 1)
        hashes = int_list_field(require(obj, "hash_ids", where), "hash_ids", where, minimum=None)
        check_hashes(hashes, input_len, MOONCAKE_BLOCK_SIZE, True, "hash_ids", where)
        requests.append(TraceRequest(arrival, input_len, output_len, None, hashes, MOONCAKE_BLOCK_SIZE))
    return requests


# --- CSV formats -----------------------------------------------------------------------


def _csv_rows(path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, {column: text}) for each data row, of the required columns and the optional
    ones the header has; checks the header has the required ones."""
    with open(path, encoding="utf-8-sig", newline="") as f:  # newline='' lets csv handle CRLF
        reader = csv.reader(f)
        header = [c.strip(CSV_BLANKS) for c in next(reader, [])]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(path, 1, missing[0], f"missing column (header has {header!r})")
        twice = next((c for i, c in enumerate(header) if c and c in header[:i]), None)
        if twice is not None:
            raise TraceError(path, 1, twice, "the column appears twice in the header")
        idx = {c: header.index(c) for c in (*required, *optional) if c in header}
        lineno = reader.line_num
        for row in reader:
            start, lineno = lineno + 1, reader.line_num  # a quoted field may span lines
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != len(header):
                raise TraceError(path, start, None, f"expected {len(header)} columns (the header's), got {len(row)}")
            yield start, {c: row[i].strip(CSV_BLANKS) for c, i in idx.items()}


def _load_azure(path: str, arrivals: Arrivals) -> list[TraceRequest]:
    requests: list[TraceRequest] = []
    t0: tuple[datetime, int] | None = None
    prev = None
    for lineno, row in _csv_rows(path, AZURE_COLUMNS):
        where = (path, lineno)
        dt, ns = parse_timestamp(row["TIMESTAMP"], where)
        if t0 is None:
            t0 = (dt, ns)
        # Whole seconds and nanoseconds apart, so 100 ns ticks survive the subtraction.
        delta = dt - t0[0]
        arrival = (delta.days * 86400 + delta.seconds) + (ns - t0[1]) * 1e-9
        if prev is not None and arrival < prev:
            message = f"must be non-decreasing: {row['TIMESTAMP']} is {prev - arrival:.7f} s before the previous row"
            raise fail(where, "TIMESTAMP", message)
        arrivals.scaled(arrival, "TIMESTAMP", where)
        input_len = csv_int(row["ContextTokens"], "ContextTokens", where, 1)
        output_len = csv_int(row["GeneratedTokens"], "GeneratedTokens", where, 1)
        requests.append(TraceRequest(arrival, input_len, output_len))
        prev = arrival
    return requests


def _load_sharegpt(path: str, rate: float | None, seed: int, arrivals: Arrivals) -> list[TraceRequest]:
    if rate is None or not (rate > 0 and math.isfinite(rate)):
        got = "" if rate is None else f", got {rate!r}"
        message = f"a sharegpt trace has no arrival times: --rate R (req/s, > 0) is needed{got}"
        raise TraceError(path, None, None, message)
    lengths = []
    for lineno, row in _csv_rows(path, SHAREGPT_COLUMNS):
        where = (path, lineno)
        lengths.append(
            (
                csv_int(row["num_prefill_tokens"], "num_prefill_tokens", where, 1),
                csv_int(row["num_decode_tokens"], "num_decode_tokens", where, 1),
            )
        )
    times = poisson_arrivals(len(lengths), rate, np.random.default_rng(seed)) if lengths else []
    if len(times):
        arrivals.scaled(times[0], None, (path, None))
        arrivals.scaled(times[-1], None, (path, None))  # the latest: if it stays finite, all do
    return [TraceRequest(a, i, o) for a, (i, o) in zip(times, lengths)]


# Loaders that need nothing but the path (sharegpt also needs the rate and seed).
_LOADERS = {"native": _load_native, "mooncake": _load_mooncake, "azure": _load_azure}
