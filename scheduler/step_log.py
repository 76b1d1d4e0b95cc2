"""StepLog: one row per forward step, kept as columns (cheap to append, cheap to write)."""

from __future__ import annotations

from array import array
from typing import Any

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


class StepLog:
    """Rows appended one at a time wait as tuples (one list append a step, not 21 array
    appends) and go into the typed columns, column by column at C speed, when anything
    reads them or a bulk extend comes."""

    def __init__(self) -> None:
        self._cols: dict[str, list | array] = {name: _column(name) for name in STEP_COLUMNS}
        self._rows: list[tuple] = []

    @property
    def cols(self) -> dict[str, list | array]:
        self._settle()
        return self._cols

    def _settle(self) -> None:
        rows = self._rows
        if rows:
            self._rows = []
            for col, values in zip(self._cols.values(), zip(*rows)):
                col.extend(values)

    def append(self, *values) -> None:
        """One row: a value for each of STEP_COLUMNS, in order."""
        self._rows.append(values)

    def extend(self, num_rows: int, values: dict[str, Any]) -> None:
        """num_rows rows at once: each column's value is a sequence of num_rows (an array, a
        numpy array), or one value for all of them."""
        self._settle()
        for name, col in self._cols.items():
            v = values[name]
            if isinstance(v, (int, float, str)):
                col.extend((array(col.typecode, (v,)) if name != "mode" else [v]) * num_rows)
            elif isinstance(v, np.ndarray):
                col.frombytes(v.astype(np.float64 if col.typecode == "d" else np.int64, copy=False).tobytes())
            else:
                col.extend(v)

    def __len__(self) -> int:
        return len(self._cols["step"]) + len(self._rows)

    def columns(self, start: int, stop: int) -> dict[str, list | array]:
        """Rows start..stop (copies, of whole rows only) as columns: what a run folder writes."""
        cols = self.cols
        # A KeyboardInterrupt can land between two columns' extends: keep only whole rows.
        stop = min(stop, *(len(c) for c in cols.values()))
        return {name: col[start:stop] for name, col in cols.items()}
