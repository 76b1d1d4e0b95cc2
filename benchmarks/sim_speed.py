"""Simulator speed and memory: the whole Mooncake conversation trace, and the core alone.

    python benchmarks/sim_speed.py [--trace PATH] [--max-requests N] [--repeat K]

Prints wall seconds, simulated requests per wall second and peak RSS of a
`--mode sim` replay of the trace (defaults: Llama-3.1-8B on an H100, overlap on,
FCFS, chunked prefill 8192), then the median time of the core alone for one
decode step at batch 256 (schedule + launch bookkeeping + process, no driver).
Targets on a 2-core machine: replay under 15 s and 2 GB; decode step under 1 ms.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.config import SchedulerConfig  # noqa: E402
from scheduler.req import Req  # noqa: E402
from scheduler.sampling import SamplingParams  # noqa: E402
from scheduler.scheduler import Scheduler  # noqa: E402
from testbed.options import ReplayOptions  # noqa: E402
from testbed.replay import replay  # noqa: E402

DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def bench_replay(trace: Path, max_requests: int | None) -> None:
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        result = replay(str(trace), ReplayOptions(max_requests=max_requests), out=out)
        wall = time.perf_counter() - t0
    s = result.summary
    n = s["completed"] + s["rejected"]
    print(f"replay {trace.name}: {n} requests, {s['num_steps']} steps, {s['simulated_s']:.0f} simulated s")
    print(f"  wall {wall:.2f} s   {n / wall:,.0f} simulated requests/s   {s['num_steps'] / wall:,.0f} steps/s")
    print(f"  peak RSS {peak_rss_mb():,.0f} MB")


def bench_decode_step(batch: int, steps: int, input_len: int = 1024) -> list[float]:
    """Seconds per decode step of the core alone (no driver, no cost model), at `batch` requests."""
    sched = Scheduler(SchedulerConfig(kv_tokens=batch * (input_len + steps + 64), context_len=1 << 20, max_running_requests=batch))
    for i in range(batch):
        ids = list(range(i * input_len, (i + 1) * input_len))  # no sharing
        sched.add_request(Req(str(i), input_len, (lambda ids=ids: ids), SamplingParams(max_new_tokens=steps + 10), 0.0, index=i))
    now = 0.0
    # Prefill until everything runs, then time decode steps.
    while sched.waiting_queue or sched.chunked_req is not None:
        batch_ = sched.get_next_batch_to_run()
        launched = sched.launch(batch_, now, overlap=False)
        sched.process_batch_result(launched, [1] * launched.plan.batch_size, now)
    times = []
    for _ in range(steps):
        now += 0.01
        t0 = time.perf_counter()
        batch_ = sched.get_next_batch_to_run()
        launched = sched.launch(batch_, now, overlap=True)
        sched.process_batch_result(launched, [1] * launched.plan.batch_size, now)
        times.append(time.perf_counter() - t0)
        assert launched.plan.batch_size == batch
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--max-requests", type=int, default=None)
    ap.add_argument("--skip-replay", action="store_true")
    args = ap.parse_args()
    if not args.skip_replay:
        bench_replay(args.trace, args.max_requests)
    times = bench_decode_step(256, 200)
    print(f"core decode step at batch 256: median {statistics.median(times) * 1e6:.0f} us, "
          f"p90 {statistics.quantiles(times, n=10)[-1] * 1e6:.0f} us over {len(times)} steps")


if __name__ == "__main__":
    main()
