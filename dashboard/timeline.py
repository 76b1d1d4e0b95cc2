"""Steps as intervals on two lanes, CPU and device: Chrome/Perfetto trace events and overlap figures.

Each step has four intervals on the run's clock (scheduler/loop/step_log.py):
schedule, launch and process on the CPU, the forward on the device. With
overlap scheduling the CPU schedules step N+1 while the device runs step N,
so the two lanes are busy at the same time; without it they take turns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

# (interval, lane): the column prefixes of STEP_COLUMNS, in the order a step runs them.
INTERVALS = (("schedule", "CPU"), ("launch", "CPU"), ("device", "device"), ("process", "CPU"))
LANES = ("CPU", "device")
_TID = {"CPU": 1, "device": 2}
_PID = 1


def trace_events(steps: pd.DataFrame, process_name: str = "testbed run") -> dict:
    """The Chrome trace-event JSON object (ui.perfetto.dev, chrome://tracing): one complete
    ("X") event per interval, ts and dur in microseconds, plus names for the process and lanes."""
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": _PID, "tid": 0, "args": {"name": process_name}},
        *({"name": "thread_name", "ph": "M", "pid": _PID, "tid": _TID[lane], "args": {"name": lane}} for lane in LANES),
    ]
    step = steps["step"].to_numpy().tolist()
    mode = steps["mode"].astype(str).tolist()
    batch = steps["batch_size"].to_numpy().tolist()
    tokens = steps["num_tokens"].to_numpy().tolist()
    for name, lane in INTERVALS:
        start = steps[f"{name}_start"].to_numpy(dtype=np.float64)
        end = steps[f"{name}_end"].to_numpy(dtype=np.float64)
        ts = (start * 1e6).tolist()
        dur = (np.maximum(end - start, 0.0) * 1e6).tolist()
        tid = _TID[lane]
        for i in range(len(ts)):
            events.append(
                {
                    "name": f"forward {mode[i]}" if name == "device" else name,
                    "cat": lane,
                    "ph": "X",
                    "ts": ts[i],
                    "dur": dur[i],
                    "pid": _PID,
                    "tid": tid,
                    "args": {"step": step[i], "mode": mode[i], "batch_size": batch[i], "num_tokens": tokens[i]},
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def trace_json(steps: pd.DataFrame, process_name: str = "testbed run") -> str:
    return json.dumps(trace_events(steps, process_name), separators=(",", ":"))


def intervals(steps: pd.DataFrame) -> pd.DataFrame:
    """Long form for plotting: step, interval, lane, start, end (seconds), mode, batch_size, num_tokens."""
    parts = [
        pd.DataFrame(
            {
                "step": steps["step"].to_numpy(),
                "interval": name,
                "lane": lane,
                "start": steps[f"{name}_start"].to_numpy(dtype=np.float64),
                "end": steps[f"{name}_end"].to_numpy(dtype=np.float64),
                "mode": steps["mode"].astype(str).to_numpy(),
                "batch_size": steps["batch_size"].to_numpy(),
                "num_tokens": steps["num_tokens"].to_numpy(),
            }
        )
        for name, lane in INTERVALS
    ]
    return pd.concat(parts, ignore_index=True)


@dataclass(frozen=True)
class OverlapStats:
    span_s: float  # first schedule start to last process end
    device_busy_s: float  # union of forward intervals
    cpu_s: float  # schedule + process (launch is async by nature: it always overlaps the device)
    cpu_hidden_s: float  # of cpu_s, the part while the device was busy

    @property
    def device_busy_fraction(self) -> float:
        return self.device_busy_s / self.span_s if self.span_s > 0 else 0.0

    @property
    def cpu_hidden_fraction(self) -> float:
        return self.cpu_hidden_s / self.cpu_s if self.cpu_s > 0 else 0.0


def _busy_before(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Device time before each t, for sorted disjoint intervals [starts, ends)."""
    dur = ends - starts
    done = np.concatenate([[0.0], np.cumsum(dur)])  # done[k]: the first k intervals
    i = np.searchsorted(starts, t, side="right") - 1  # the last interval starting at or before t
    k = np.maximum(i, 0)
    return np.where(i >= 0, done[k] + np.clip(t - starts[k], 0.0, dur[k]), 0.0)


def overlap_stats(steps: pd.DataFrame) -> OverlapStats:
    """How much CPU scheduling work the device hid: the number overlap scheduling is for."""
    if steps.empty:
        return OverlapStats(0.0, 0.0, 0.0, 0.0)
    d0 = steps["device_start"].to_numpy(dtype=np.float64)
    d1 = steps["device_end"].to_numpy(dtype=np.float64)
    order = np.argsort(d0, kind="stable")
    d0, d1 = d0[order], d1[order]
    # One device runs one forward at a time; clip any overlap so the union is exact.
    d1 = np.maximum.accumulate(d1)
    d0 = np.maximum(d0, np.concatenate([[-np.inf], d1[:-1]]))
    d1 = np.maximum(d1, d0)
    cpu = hidden = 0.0
    for name in ("schedule", "process"):
        a = steps[f"{name}_start"].to_numpy(dtype=np.float64)
        b = np.maximum(steps[f"{name}_end"].to_numpy(dtype=np.float64), a)
        cpu += float(np.sum(b - a))
        hidden += float(np.sum(_busy_before(d0, d1, b) - _busy_before(d0, d1, a)))
    span = float(steps["process_end"].max() - steps["schedule_start"].min())
    return OverlapStats(span, float(np.sum(d1 - d0)), cpu, hidden)
