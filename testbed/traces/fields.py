"""Field checks of trace loaders: each takes (value, field name, where) and returns the clean
value or raises TraceError naming the file, the 1-based line and the field. `where` is
(path, line)."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from typing import Any

from testbed.errors import TraceError

# Each check gets (value, field name, where) and returns the clean value or raises.
# `where` is (path, line) so that errors point at the line.


def fail(where: tuple[str, int | None], field: str | None, message: str) -> TraceError:
    return TraceError(where[0], where[1], field, message)


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # lengths and priorities are int64 columns of a run


def shown(value: Any) -> str:
    """A value as a one-line error quotes it: whole, or its start and length when it is long."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def int_field(value: Any, field: str, where: tuple[str, int | None], minimum: int) -> int:
    # bool is an int in Python but never a length; integral floats (5.0) are accepted
    # because some JSON writers emit them.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= INT64_MAX:
        kind = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
        raise fail(where, field, f"must be {kind} of at most 2**63 - 1, got {value!r}")
    return value


def time_field(value: Any, field: str, where: tuple[str, int | None]) -> float:
    try:  # an integer of hundreds of digits has no float
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
        seconds = float(value) if ok else None
    except OverflowError:
        seconds = None
    if seconds is None:
        raise fail(where, field, f"must be a non-negative number of seconds a float holds, got {shown(value)}")
    return seconds


def int_list_field(value: Any, field: str, where: tuple[str, int | None], minimum: int | None) -> list[int]:
    if not isinstance(value, list):
        raise fail(where, field, f"must be a list of integers, got {type(value).__name__}")
    for i, v in enumerate(value):  # token ids are int64 columns; hashes only need to compare
        if not isinstance(v, int) or isinstance(v, bool) or (minimum is not None and not minimum <= v <= INT64_MAX):
            kind = "a non-negative integer" if minimum == 0 else "an integer"
            raise fail(where, field, f"element {i} must be {kind} of 64 bits (at most 2**63 - 1), got {shown(v)}")
    return value


def require(obj: dict, key: str, where: tuple[str, int | None]) -> Any:
    if key not in obj:
        raise fail(where, key, "missing")
    return obj[key]


class Arrivals:
    """Each arrival as it is read: not before the previous one, and a finite time once a replay
    makes it (arrival - first arrival) * --time-scale, so that a bad one is found here, by line."""

    def __init__(self, time_scale: float) -> None:
        self.time_scale = time_scale
        self.first: float | None = None
        self.prev: float | None = None

    def check(self, arrival: float, field: str, where: tuple[str, int | None]) -> float:
        if self.prev is not None and arrival < self.prev:
            raise fail(where, field, f"arrival times must be non-decreasing, got {arrival!r} after {self.prev!r}")
        return self.scaled(arrival, field, where)

    def scaled(self, arrival: float, field: str, where: tuple[str, int | None]) -> float:
        if self.first is None:
            self.first = arrival
        if not math.isfinite((arrival - self.first) * self.time_scale):
            raise fail(where, field, f"{arrival!r} is not a finite time once --time-scale {self.time_scale:g} multiplies it")
        self.prev = arrival
        return arrival


def check_hashes(hashes: list[int], input_len: int, block_size: int, exact: bool, field: str, where) -> None:
    blocks = -(-input_len // block_size)  # ceil
    if len(hashes) > blocks or (exact and len(hashes) != blocks):
        need = f"ceil({input_len}/{block_size}) = {blocks}"
        rel = "must have" if exact else "must have at most"
        raise fail(where, field, f"{rel} {need} entries for the input length, got {len(hashes)}")


# The blanks a CSV cell is stripped of: ASCII only, so that a non-breaking space stays and is refused.
CSV_BLANKS = " \t\r\n"
_CSV_INT = re.compile(r"[+-]?[0-9]+")
_CSV_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def csv_number(text: str) -> Any:
    """An int or float written in ASCII digits (not Python's `1_000` or other scripts' digits), else the text."""
    if _CSV_INT.fullmatch(text):
        return int(text)
    if _CSV_FLOAT.fullmatch(text):
        return float(text)
    return text


def csv_int(text: str, field: str, where: tuple[str, int | None], minimum: int) -> int:
    # int_field rejects anything but a number, with the text in the message; "12.0" is accepted
    return int_field(csv_number(text), field, where, minimum)


# TIMESTAMP: "2023-11-16 18:17:03.9799600": any number of fractional digits (datetime only
# keeps 6), optionally a timezone ("+00:00" or "Z"), as in Azure's 2024 traces.
TIMESTAMP_PATTERN = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d+))?\s*(Z|[+-]\d{2}:?\d{2})?")


def parse_timestamp(text: str, where: tuple[str, int | None]) -> tuple[datetime, int]:
    """(whole seconds as a UTC-naive datetime, nanoseconds) of a wall-clock string."""
    m = TIMESTAMP_PATTERN.fullmatch(text)
    if not m:
        raise fail(where, "TIMESTAMP", f"must be a time like '2023-11-16 18:17:03.9799600', got {text!r}")
    try:
        dt = datetime.fromisoformat(f"{m.group(1)} {m.group(2)}")
    except ValueError:
        raise fail(where, "TIMESTAMP", f"not a valid date and time: {text!r}") from None
    tz = (m.group(4) or "Z").replace(":", "")
    if tz != "Z":  # to UTC, so that rows in different offsets compare
        dt -= (1 if tz[0] == "+" else -1) * timedelta(hours=int(tz[1:3]), minutes=int(tz[3:]))
    frac = (m.group(3) or "")[:9].ljust(9, "0")
    return dt, int(frac)
