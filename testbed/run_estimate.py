"""How long a real replay will take here: what it says up front, and the time left beside its progress.

A real replay's speed is this machine's: a CPU engine takes minutes where a GPU takes
seconds, and nothing known before the first forwards says which. So the replay says what
it has to do (requests, tokens, how long its arrivals last), then measures: the prompt
and output tokens of the requests done so far, per second of wall time, over the tokens
left. It can never end before its last request arrives.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from testbed.replay import ReplayProgress

MIN_MEASURED_S = 2.0  # before this much wall time, a rate is mostly start-up: no estimate yet
UPDATE_EVERY_S = 1.0  # the estimate is remade at most this often (progress comes after every step)


def format_duration(seconds: float) -> str:
    """45 s, 3 min 20 s, 1 h 5 min."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {s} s" if s else f"{minutes} min"
    hours, m = divmod(minutes, 60)
    return f"{hours} h {m} min" if m else f"{hours} h"


def describe_work(trace_meta: dict) -> str:
    """The line a real replay says up front: what it has to do, from run.json's trace record."""
    span = trace_meta.get("arrival_span_s")
    arriving = f", arriving over {format_duration(span)}" if span else ""
    return (
        f"{trace_meta['num_requests']:,} requests: {trace_meta['prompt_tokens']:,} prompt + {trace_meta['output_tokens']:,} "
        f"output tokens{arriving}; the time left is measured from the first requests done"
    )


def busy_cpu_note(meta: dict, load_1min: float | None = None, cores: int | None = None) -> str | None:
    """A CPU engine on a machine already busy: its torch threads wait on each other while other
    work holds the cores. On the 2-core development machine, with two busy processes beside it,
    traces/a.json's TPOT went from 0.6 ms to 18 ms with torch's 2 threads, 2 ms with one."""
    threads = meta.get("cpu_threads")
    if threads is None:
        return None
    load_1min = os.getloadavg()[0] if load_1min is None else load_1min
    cores = os.cpu_count() or 1 if cores is None else cores
    if load_1min <= cores:  # (this process is part of the load)
        return None
    return (
        f"this machine is busy (load {load_1min:.1f} on {cores} cores): the engine's {threads} torch threads share "
        f"the cores with other work, and its forwards can take many times longer"
        + ("; OMP_NUM_THREADS=1 before the command runs it on one thread, which suffers less" if threads > 1 else "")
    )


@dataclass
class TimeLeft:
    """The estimate beside a replay's progress: tokens a second here, and the wall time left."""

    arrival_span_s: float | None  # the last arrival after the first, on the replay's clock (None: closed loop)
    start: float | None = None  # wall time of the first report (the loop starts there)
    _next_update: float = 0.0
    text: str | None = None  # the latest estimate, e.g. "9,100 tok/s here, ~25 s left"

    def update(self, p: ReplayProgress, now: float | None = None) -> str | None:
        """The estimate after this report; None while there is too little to measure."""
        now = time.monotonic() if now is None else now
        if self.start is None:
            self.start = now
        if now < self._next_update and p.done < p.total:  # (the last report is always remade: ~0 s left)
            return self.text
        self._next_update = now + UPDATE_EVERY_S
        elapsed = now - self.start
        if elapsed < MIN_MEASURED_S or p.tokens_done == 0:
            return self.text
        rate = p.tokens_done / elapsed
        left = (p.tokens_total - p.tokens_done) / rate
        if self.arrival_span_s is not None:
            left = max(left, self.arrival_span_s - elapsed)  # the last request has yet to arrive
        self.text = f"{rate:,.0f} tok/s here, ~{format_duration(left)} left"
        return self.text
