"""StepLog: one row per forward step, kept as columns (cheap to append, cheap to write)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

STEP_COLUMNS = (
    "step",
    "mode",  # extend | decode
    "batch_size",
    "num_tokens",  # new tokens computed
    "prefix_tokens",  # tokens attended to from the cache / earlier steps
    "cache_hit_tokens",  # prefix tokens reused from the radix cache by newly admitted requests
    "schedule_start",
    "schedule_end",
    "launch_start",
    "launch_end",
    "device_start",
    "device_end",
    "process_start",
    "process_end",
    "kv_used_tokens",  # held by requests or locked in the cache, after the step
    "kv_cached_tokens",  # evictable cache, after the step
    "num_running",
    "num_waiting",
    "num_retracted",  # requests retracted when this step was scheduled
    # What a forward's cost depends on beyond the token counts (a calibration can fit them).
    "max_seq_len",  # longest sequence in the batch
    "attention_pairs",  # query-key pairs of causal attention
)
FLOAT_COLUMNS = ("attention_pairs",)


def _column(name: str):
    # Typed arrays: 8 bytes a value instead of a Python object (a long replay has 100k+ steps).
    if name == "mode":
        return []
    return array("d") if name.endswith(("_start", "_end")) or name in FLOAT_COLUMNS else array("q")


TIME_COLUMNS = ("schedule_start", "schedule_end", "launch_start", "launch_end",
                "device_start", "device_end", "process_start", "process_end")


@dataclass(slots=True)
class StretchRows:
    """The rows of consecutive decode steps of one batch (part of a decode stretch), kept
    compact until the log is read: row i is step first_step + i, of batch_size requests with
    sum_prefix_len + i * batch_size prefix tokens and a longest sequence of max_seq_len + i,
    nothing retracted or hit; the times, the KV use, the cache and the running count are given
    per row."""

    first_step: int
    num_rows: int
    mode: str
    batch_size: int
    sum_prefix_len: int
    max_seq_len: int
    times: tuple[array, ...]  # TIME_COLUMNS, num_rows floats each (typecode 'd')
    kv_used_tokens: array  # after each row's step (typecode 'q')
    kv_cached_tokens: array  # after each row's step
    num_running: array  # after each row's step
    num_waiting: int


class StepLog:
    """Rows appended one at a time wait as tuples (one list append a step, not 21 array
    appends), and a decode stretch's rows as one StretchRows; both go into the typed columns
    when anything reads them: the tuples column by column at C speed, every stretch waiting
    at once with numpy (so a stretch costs a few microseconds, whatever its length)."""

    def __init__(self) -> None:
        self._cols: dict[str, list | array] = {name: _column(name) for name in STEP_COLUMNS}
        self._pending: list[tuple | StretchRows] = []  # in row order
        self._pending_rows = 0

    @property
    def cols(self) -> dict[str, list | array]:
        self._settle()
        return self._cols

    def append(self, *values) -> None:
        """One row: a value for each of STEP_COLUMNS, in order."""
        self._pending.append(values)
        self._pending_rows += 1

    def extend_stretch(self, rows: StretchRows) -> None:
        self._pending.append(rows)
        self._pending_rows += rows.num_rows

    def __len__(self) -> int:
        return len(self._cols["step"]) + self._pending_rows

    def columns(self, start: int, stop: int) -> dict[str, list | array]:
        """Rows start..stop (copies, of whole rows only) as columns: what a run folder writes."""
        cols = self.cols
        # A KeyboardInterrupt can land between two columns' extends: keep only whole rows.
        stop = min(stop, *(len(c) for c in cols.values()))
        return {name: col[start:stop] for name, col in cols.items()}

    def _settle(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending, total, self._pending_rows = [], self._pending_rows, 0
        if all(type(item) is tuple for item in pending):
            for col, values in zip(self._cols.values(), zip(*pending)):
                col.extend(values)
            return
        row_at: list[int] = []
        rows: list[tuple] = []
        stretches: list[StretchRows] = []
        stretch_at: list[int] = []
        at = 0
        for item in pending:
            if type(item) is tuple:
                row_at.append(at)
                rows.append(item)
                at += 1
            else:
                stretch_at.append(at)
                stretches.append(item)
                at += item.num_rows
        out = _stretch_columns(stretches, stretch_at, total)
        if rows:
            for name, values in zip(STEP_COLUMNS, zip(*rows)):
                col = out[name]
                if name == "mode":
                    for i, v in zip(row_at, values):
                        col[i] = v
                else:
                    col[row_at] = values
        for name, col in self._cols.items():
            values = out[name]
            if name == "mode":
                col.extend(values)
            else:
                col.frombytes(values.astype(np.float64 if col.typecode == "d" else np.int64, copy=False).tobytes())


def _stretch_columns(stretches: list[StretchRows], starts: list[int], total: int) -> dict[str, list | np.ndarray]:
    """Columns of `total` rows with every stretch's rows in place (row starts[k] on for
    stretches[k]); the other rows are left for the caller to fill."""
    out: dict[str, list | np.ndarray] = {}
    lens = np.fromiter((s.num_rows for s in stretches), np.int64, len(stretches))
    first_row = np.cumsum(lens) - lens
    within = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(first_row, lens)  # row i of its stretch
    at = np.repeat(np.asarray(starts, dtype=np.int64), lens) + within

    def each(field: str) -> np.ndarray:
        return np.repeat(np.fromiter((getattr(s, field) for s in stretches), np.int64, len(stretches)), lens)

    def column(values: np.ndarray, dtype=np.int64) -> np.ndarray:
        col = np.zeros(total, dtype=dtype)
        col[at] = values
        return col

    bs = each("batch_size")
    prefix = each("sum_prefix_len") + bs * within
    out["step"] = column(each("first_step") + within)
    mode: list = [None] * total
    for s, a in zip(stretches, starts):
        mode[a : a + s.num_rows] = [s.mode] * s.num_rows
    out["mode"] = mode
    out["batch_size"] = column(bs)
    out["num_tokens"] = column(bs)
    out["prefix_tokens"] = column(prefix)
    out["cache_hit_tokens"] = np.zeros(total, dtype=np.int64)
    out["num_retracted"] = np.zeros(total, dtype=np.int64)
    def joined(parts, typecode: str) -> np.ndarray:
        out = array(typecode)  # array-to-array extends are memcpy: cheaper than np.asarray + concatenate
        for part in parts:
            out.extend(part)
        return np.frombuffer(out, dtype=np.float64 if typecode == "d" else np.int64)

    for k, name in enumerate(TIME_COLUMNS):
        out[name] = column(joined((s.times[k] for s in stretches), "d"), np.float64)
    out["kv_used_tokens"] = column(joined((s.kv_used_tokens for s in stretches), "q"))
    out["kv_cached_tokens"] = column(joined((s.kv_cached_tokens for s in stretches), "q"))
    out["num_running"] = column(joined((s.num_running for s in stretches), "q"))
    out["num_waiting"] = column(each("num_waiting"))
    out["max_seq_len"] = column(each("max_seq_len") + within)
    out["attention_pairs"] = column((prefix + bs).astype(np.float64), np.float64)
    return out
