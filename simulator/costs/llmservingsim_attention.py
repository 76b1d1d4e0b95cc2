"""LLMServingSim's attention timings of a GPU (its profiler's attention.csv), read once for every use.

LLMServingSim's profiler times one layer's attention module inside vLLM's own forward (the KV write
and the attention kernel, one layer's weights streamed between repetitions, so the KV is read from
memory, not from a warm L2) for batches of one prefill chunk of `prefill_chunk` new tokens over
`kv_prefill` cached ones beside `n_decode` requests of `kv_decode` tokens each, either part possibly
empty. Two things are priced from such a file: the decode rows of a mixed forward
(mixed_attention.py) and decode-only batches (measured_decode_attention.py).
"""

from __future__ import annotations

import csv
from pathlib import Path

COLUMNS = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")

Shape = tuple[int, int, int, int]  # (prefill_chunk, kv_prefill, n_decode, kv_decode)


class AttentionTimingsError(ValueError):
    """A timing file that cannot be read or gives too little; str() names the file and what is wrong."""


def read_timings(path: str | Path) -> dict[Shape, float]:
    """Microseconds of one layer's attention by batch shape (the last row of a shape repeated)."""
    path = Path(path)
    times: dict[Shape, float] = {}
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise AttentionTimingsError(f"{path}: not LLMServingSim's attention.csv: no column {', '.join(missing)}")
            for line, row in enumerate(reader, start=2):
                try:
                    pc, kp, nd, kd = (int(row[c]) for c in COLUMNS[:4])
                    times[(pc, kp, nd, kd)] = float(row["time_us"])
                except (TypeError, ValueError):
                    raise AttentionTimingsError(f"{path}:{line}: not a number in {', '.join(COLUMNS)}") from None
    except OSError as e:
        raise AttentionTimingsError(f"{path}: cannot read it ({e.strerror})") from None
    return times
