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


TIME_COLUMNS = ("schedule_start", "schedule_end", "launch_start", "launch_end",
                "device_start", "device_end", "process_start", "process_end")
_DTYPES = {name: None if name == "mode" else np.float64 if name in TIME_COLUMNS or name in FLOAT_COLUMNS else np.int64
           for name in STEP_COLUMNS}


@dataclass(slots=True)
class StretchRows:
    """The rows of a decode stretch's consecutive steps, kept compact until the log is read:
    row i is step first_step + i. The rows come in segments (rows, batch_size, sum_prefix_len,
    max_seq_len), in row order: a segment's row r decodes batch_size requests with sum_prefix_len
    + r * batch_size prefix tokens and a longest sequence of max_seq_len + r, nothing retracted
    or hit. The times, the KV use, the cache and the running count are given per row."""

    first_step: int
    num_rows: int
    mode: str
    segments: list[tuple[int, int, int, int]]
    times: tuple[array, ...]  # TIME_COLUMNS, num_rows floats each (typecode 'd')
    kv_used_tokens: array  # after each row's step (typecode 'q')
    kv_cached_tokens: array  # after each row's step
    num_running: array  # after each row's step
    num_waiting: int


Columns = dict[str, "list | np.ndarray"]


class StepLog:
    """Rows appended one at a time wait as tuples (one list append a step, not 21 array
    appends), and a decode stretch's rows as one StretchRows; when anything reads the log they
    become a chunk of columns (numpy arrays, and a list for mode): the tuples column by column
    at C speed, every stretch waiting at once with numpy (so a stretch costs a few
    microseconds, whatever its length). Chunks are read as they are or joined: a flush reads
    only the newest."""

    def __init__(self) -> None:
        self._chunks: list[Columns] = []  # in row order
        self._chunk_rows: list[int] = []
        self._settled_rows = 0  # sum(self._chunk_rows)
        self._pending: list[tuple | StretchRows] = []  # in row order, after the chunks
        self._pending_rows = 0

    @property
    def cols(self) -> Columns:
        """Every row, as one chunk of columns."""
        self._settle()
        if len(self._chunks) != 1:
            self._chunks, self._chunk_rows = [_join(self._chunks)], [self._settled_rows]
        return self._chunks[0]

    def append(self, *values) -> None:
        """One row: a value for each of STEP_COLUMNS, in order."""
        self._pending.append(values)
        self._pending_rows += 1

    def extend_stretch(self, rows: StretchRows) -> None:
        self._pending.append(rows)
        self._pending_rows += rows.num_rows

    def __len__(self) -> int:
        return self._settled_rows + self._pending_rows

    def columns(self, start: int, stop: int) -> Columns:
        """Rows start..stop as columns: what a run folder writes (views of the log's chunks,
        which the log never changes, or a join of the chunks they span)."""
        self._settle()
        parts, at = [], 0
        for chunk, n in zip(self._chunks, self._chunk_rows):
            a, b = max(start - at, 0), min(stop - at, n)
            if a < b:
                parts.append(chunk if (a, b) == (0, n) else {name: col[a:b] for name, col in chunk.items()})
            at += n
        return parts[0] if len(parts) == 1 else _join(parts)

    def _settle(self) -> None:
        """The pending rows become a chunk (added whole: an interrupt meanwhile loses nothing)."""
        pending = self._pending
        if not pending:
            return
        total = self._pending_rows
        if all(type(item) is tuple for item in pending):
            chunk: Columns = {name: list(values) if _DTYPES[name] is None else np.array(values, dtype=_DTYPES[name])
                              for name, values in zip(STEP_COLUMNS, zip(*pending))}
        else:
            chunk = _chunk(pending, total)
        self._chunks.append(chunk)
        self._chunk_rows.append(total)
        self._settled_rows += total
        self._pending, self._pending_rows = [], 0


def _join(chunks: list[Columns]) -> Columns:
    """Chunks of consecutive rows as one (an empty log: empty columns)."""
    if not chunks:
        return {name: [] if dtype is None else np.empty(0, dtype=dtype) for name, dtype in _DTYPES.items()}
    if len(chunks) == 1:
        return chunks[0]
    out: Columns = {}
    for name, dtype in _DTYPES.items():
        if dtype is None:
            col: list = []
            for c in chunks:
                col.extend(c[name])
            out[name] = col
        else:
            out[name] = np.concatenate([c[name] for c in chunks])
    return out


def _chunk(pending: list[tuple | StretchRows], total: int) -> Columns:
    """The columns of `total` pending rows: every stretch's rows laid out with numpy, then the
    single rows put in their places."""
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
    return out


def _stretch_columns(stretches: list[StretchRows], starts: list[int], total: int) -> Columns:
    """Columns of `total` rows with every stretch's rows in place (row starts[k] on for
    stretches[k]); the other rows are left for the caller to fill."""
    out: Columns = {}
    lens = np.fromiter((s.num_rows for s in stretches), np.int64, len(stretches))
    rows = int(lens.sum())
    first_row = np.cumsum(lens) - lens
    within = np.arange(rows, dtype=np.int64) - np.repeat(first_row, lens)  # row i of its stretch
    at = np.repeat(np.asarray(starts, dtype=np.int64), lens) + within
    # The segments of every stretch, in row order: (rows, batch_size, sum_prefix_len, max_seq_len).
    segs = np.array([seg for s in stretches for seg in s.segments], dtype=np.int64).reshape(-1, 4)
    seg_lens = segs[:, 0]
    in_seg = np.arange(rows, dtype=np.int64) - np.repeat(np.cumsum(seg_lens) - seg_lens, seg_lens)  # row r of its segment

    def column(values: np.ndarray, dtype=np.int64) -> np.ndarray:
        col = np.zeros(total, dtype=dtype)
        col[at] = values
        return col

    def joined(parts, dtype) -> np.ndarray:
        # bytes.join sizes its result once and copies each typed array's buffer into it (growing
        # an array part by part reallocates it again and again; np.concatenate converts each part).
        return np.frombuffer(b"".join(parts), dtype=dtype)

    bs = np.repeat(segs[:, 1], seg_lens)
    prefix = np.repeat(segs[:, 2], seg_lens) + bs * in_seg
    out["step"] = column(np.repeat(np.fromiter((s.first_step for s in stretches), np.int64, len(stretches)), lens) + within)
    mode: list = [None] * total
    for s, a in zip(stretches, starts):
        mode[a : a + s.num_rows] = [s.mode] * s.num_rows
    out["mode"] = mode
    out["batch_size"] = column(bs)
    out["num_tokens"] = column(bs)
    out["prefix_tokens"] = column(prefix)
    out["cache_hit_tokens"] = np.zeros(total, dtype=np.int64)
    for k, name in enumerate(TIME_COLUMNS):
        out[name] = column(joined([s.times[k] for s in stretches], np.float64), np.float64)
    out["kv_used_tokens"] = column(joined([s.kv_used_tokens for s in stretches], np.int64))
    out["kv_cached_tokens"] = column(joined([s.kv_cached_tokens for s in stretches], np.int64))
    out["num_running"] = column(joined([s.num_running for s in stretches], np.int64))
    out["num_waiting"] = column(np.repeat(np.fromiter((s.num_waiting for s in stretches), np.int64, len(stretches)), lens))
    out["num_retracted"] = np.zeros(total, dtype=np.int64)
    out["max_seq_len"] = column(np.repeat(segs[:, 3], seg_lens) + in_seg)
    out["attention_pairs"] = column((prefix + bs).astype(np.float64), np.float64)
    return {name: out[name] for name in STEP_COLUMNS}
