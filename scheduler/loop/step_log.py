"""StepLog: one row per forward step, kept as columns (cheap to append, cheap to write)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np


class StepRow(NamedTuple):
    """One step's row of steps.parquet (a tuple: appending one costs what a tuple costs)."""

    step: int
    mode: str  # extend | decode | mixed
    batch_size: int
    num_tokens: int  # new tokens computed
    prefix_tokens: int  # tokens attended to from the cache / earlier steps
    cache_hit_tokens: int  # prefix tokens reused from the radix cache by newly admitted requests
    schedule_start: float
    schedule_end: float
    launch_start: float
    launch_end: float
    device_start: float
    device_end: float
    process_start: float
    process_end: float
    kv_used_tokens: int  # held by requests or locked in the cache, after the step
    kv_cached_tokens: int  # evictable cache, after the step
    num_running: int
    num_waiting: int
    num_retracted: int  # requests retracted when this step was scheduled
    # What a forward's cost depends on beyond the token counts (a calibration can fit them).
    max_seq_len: int  # longest sequence in the batch
    attention_pairs: float  # query-key pairs of causal attention


class StepTimes(NamedTuple):
    """The times of consecutive steps, one array per column (a decode stretch's rows)."""

    schedule_start: array
    schedule_end: array
    launch_start: array
    launch_end: array
    device_start: array
    device_end: array
    process_start: array
    process_end: array


STEP_COLUMNS: tuple[str, ...] = StepRow._fields
FLOAT_COLUMNS = ("attention_pairs",)
TIME_COLUMNS: tuple[str, ...] = StepTimes._fields
_DTYPES = {
    name: None if name == "mode" else np.float64 if name in TIME_COLUMNS or name in FLOAT_COLUMNS else np.int64 for name in STEP_COLUMNS
}


@dataclass(slots=True)
class StretchState:
    """What a decode stretch's KV, cache and running columns are made of, kept as the stretch
    gives them (a few numbers and lists) and laid out for every stretch of a chunk at once
    (_state_columns): a stretch's own columns, step by step in Python, cost more than all of
    its other bookkeeping.

    Its steps 0 .. num_steps - 1 run in segments (steps, batch_size, pages_per_step): step i
    of a segment takes pages_per_step[i % page_size] pages. After step j: the KV in use is
    kv_before plus the slots steps 0..j took plus the kv_changes (j', change) with j' <= j (KV
    that finished requests released, or a merged prefill's processing cached); the cache's
    evictable tokens are cached_before, then the value of the last cached_change (j', value)
    in list order with j' <= j, and cached_last at the last step; the running requests are its
    segment's batch size plus the running_changes at j itself. Row r holds step r + shift
    (with overlap a step's row is written when the next step processes it)."""

    num_steps: int
    shift: int
    page_size: int
    segments: list[tuple[int, int, Sequence[int]]]
    kv_before: int
    kv_changes: list[tuple[int, int]]
    cached_before: int
    cached_changes: list[tuple[int, int]]
    cached_last: int
    running_changes: list[tuple[int, int]]

    def after_first_step(self) -> tuple[int, int, int]:
        """(KV in use, cached tokens, running requests) after step 0 (with overlap, the row of
        the batch in flight before the stretch)."""
        _, batch_size, pages = self.segments[0]
        kv = self.kv_before + pages[0] * self.page_size + sum(c for j, c in self.kv_changes if j == 0)
        cached = self.cached_before
        for j, value in self.cached_changes:
            if j == 0:
                cached = value
        if self.num_steps == 1:
            cached = self.cached_last
        return kv, cached, batch_size + sum(d for j, d in self.running_changes if j == 0)

    def cached_events(self) -> list[tuple[int, int]]:
        """(step, value) in order: the cached tokens are `value` from `step` on, until the next."""
        return [(0, self.cached_before), *self.cached_changes, (self.num_steps - 1, self.cached_last)]

    def kv_after_last_step(self) -> int:
        """The KV in use after the last step (what the scheduler's count must be then)."""
        kv = self.kv_before + sum(c for _, c in self.kv_changes)
        for steps, _, pages in self.segments:
            whole, part = divmod(steps, len(pages))
            kv += (whole * sum(pages) + sum(pages[:part])) * self.page_size
        return kv


@dataclass(slots=True)
class StretchRows:
    """The rows of a decode stretch's consecutive steps, kept compact until the log is read:
    row i is step first_step + i. The rows come in segments (rows, batch_size, sum_prefix_len,
    max_seq_len), in row order: a segment's row r decodes batch_size requests with sum_prefix_len
    + r * batch_size prefix tokens and a longest sequence of max_seq_len + r, nothing retracted
    or hit. The times are given per row; the KV use, the cache and the running count by state."""

    first_step: int
    num_rows: int
    mode: str
    segments: list[tuple[int, int, int, int]]
    times: StepTimes  # num_rows floats each (typecode 'd')
    state: StretchState
    num_waiting: int


Columns = dict[str, "list | np.ndarray"]


class StepLog:
    """Rows appended one at a time wait as StepRows (one list append a step, not 21 array
    appends), and a decode stretch's rows as one StretchRows; when anything reads the log they
    become a chunk of columns (numpy arrays, and a list for mode): the tuples column by column
    at C speed, every stretch waiting at once with numpy (so a stretch costs a few
    microseconds, whatever its length). Chunks are read as they are or joined: a flush reads
    only the newest."""

    def __init__(self, instance: int = 0) -> None:
        self.instance = instance  # which instance of a cluster took these steps (its steps table says so)
        self._chunks: list[Columns] = []  # in row order
        self._chunk_rows: list[int] = []
        self._settled_rows = 0  # sum(self._chunk_rows)
        self._pending: list[StepRow | StretchRows] = []  # in row order, after the chunks
        self._pending_rows = 0

    @property
    def cols(self) -> Columns:
        """Every row, as one chunk of columns."""
        self._settle()
        if len(self._chunks) != 1:
            self._chunks, self._chunk_rows = [_join(self._chunks)], [self._settled_rows]
        return self._chunks[0]

    def append(self, row: StepRow) -> None:
        self._pending.append(row)
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
        out = parts[0] if len(parts) == 1 else _join(parts)
        return out | {"instance": np.full(max(stop - start, 0) if parts else 0, self.instance, dtype=np.int64)}

    def _settle(self) -> None:
        """The pending rows become a chunk (added whole: an interrupt meanwhile loses nothing)."""
        pending = self._pending
        if not pending:
            return
        total = self._pending_rows
        if all(type(item) is StepRow for item in pending):
            chunk: Columns = {
                name: list(values) if _DTYPES[name] is None else np.array(values, dtype=_DTYPES[name])
                for name, values in zip(STEP_COLUMNS, zip(*pending))
            }
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


def _chunk(pending: list[StepRow | StretchRows], total: int) -> Columns:
    """The columns of `total` pending rows: every stretch's rows laid out with numpy, then the
    single rows put in their places."""
    row_at: list[int] = []
    rows: list[StepRow] = []
    stretches: list[StretchRows] = []
    stretch_at: list[int] = []
    at = 0
    for item in pending:
        if type(item) is StepRow:
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
    kv_used, cached, running = _state_columns([s.state for s in stretches])
    out["kv_used_tokens"] = column(kv_used)
    out["kv_cached_tokens"] = column(cached)
    out["num_running"] = column(running)
    out["num_waiting"] = column(np.repeat(np.fromiter((s.num_waiting for s in stretches), np.int64, len(stretches)), lens))
    out["num_retracted"] = np.zeros(total, dtype=np.int64)
    out["max_seq_len"] = column(np.repeat(segs[:, 3], seg_lens) + in_seg)
    out["attention_pairs"] = column((prefix + bs).astype(np.float64), np.float64)
    return {name: out[name] for name in STEP_COLUMNS}


def _state_columns(states: list[StretchState]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The KV in use, the cached tokens and the running requests of every row of the stretches
    (StretchState says what they are), in row order: computed for all their steps at once,
    then each stretch's first `shift` steps dropped (their rows are not the stretch's)."""
    num_steps = np.fromiter((st.num_steps for st in states), np.int64, len(states))
    first = np.cumsum(num_steps) - num_steps  # each stretch's first step, counted over all
    total = int(num_steps.sum())
    at = list(zip(states, first.tolist()))
    # Each step's segment: its batch size and the slots it takes (its cycle of pages, from the
    # segment's first step, times the page size).
    seg_steps, seg_bs, seg_pages = zip(*[seg for st in states for seg in st.segments])
    seg_steps_ = np.asarray(seg_steps, dtype=np.int64)
    running = np.repeat(np.asarray(seg_bs, dtype=np.int64), seg_steps_)
    pages = np.asarray(seg_pages, dtype=np.int64)  # (segments, page_size)
    page_size = states[0].page_size
    if page_size == 1:
        taken = np.repeat(pages[:, 0], seg_steps_)
    else:
        seg_of_step = np.repeat(np.arange(len(seg_steps), dtype=np.int64), seg_steps_)
        in_seg = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(seg_steps_) - seg_steps_, seg_steps_)
        taken = pages[seg_of_step, in_seg % page_size] * page_size
    # KV: per stretch, kv_before plus the running sum of what each step takes and changes.
    if any(st.kv_changes for st in states):
        pos = [a + j for st, a in at for j, _ in st.kv_changes]
        np.add.at(taken, np.asarray(pos, dtype=np.int64), np.fromiter((c for st in states for _, c in st.kv_changes), np.int64, len(pos)))
    sums = np.cumsum(taken)
    kv_before = np.fromiter((st.kv_before for st in states), np.int64, len(states))
    kv = sums + np.repeat(kv_before - (sums[first] - taken[first]), num_steps)
    if any(st.running_changes for st in states):
        pos = [a + j for st, a in at for j, _ in st.running_changes]
        np.add.at(
            running, np.asarray(pos, dtype=np.int64), np.fromiter((d for st in states for _, d in st.running_changes), np.int64, len(pos))
        )
    # Cached: each stretch's events in order (cached_before at its first step, its changes,
    # cached_last at its last step); a step takes the last event at or before it. Events are
    # numbered in that order, so the last one has the greatest number: a running maximum.
    events = [st.cached_events() for st in states]
    pos = [a + j for (_, a), evs in zip(at, events) for j, _ in evs]
    latest = np.full(total, -1, dtype=np.int64)
    np.maximum.at(latest, np.asarray(pos, dtype=np.int64), np.arange(len(pos), dtype=np.int64))
    values = np.fromiter((v for evs in events for _, v in evs), np.int64, len(pos))
    cached = values[np.maximum.accumulate(latest)]
    # The rows: every step but each stretch's first `shift`.
    shifted = [a for st, a in at if st.shift]
    if shifted:
        keep = np.ones(total, dtype=bool)
        keep[shifted] = False
        return kv[keep], cached[keep], running[keep]
    return kv, cached, running
