"""Simulator speed and memory, fast-forward beside step by step: two traces, and the core alone.

    python benchmarks/sim_speed.py [--trace PATH] [--max-requests N] [--repeat K] [--skip-replay]

Replays, each in a fresh process (so that its peak RSS is its own), with fast-forward
(the default) and with --no-fast-forward, K times each (default 3), and prints the
median wall seconds, the speedup of the medians and each path's peak RSS:

- the Mooncake conversation trace (12,031 requests; defaults: Llama-3.1-8B on an H100,
  overlap on, FCFS, chunked prefill 8192);
- a light load: 2,000 requests at 2 req/s, made as `testbed trace gen -n 2000 --rate 2
  --seed 0` makes it (prompts of 100-600 tokens, outputs of 50-400);
- the same light load under the vLLM scheduler (`--scheduler vllm`: blocks of 16, prefix
  caching, async scheduling).

Both paths must give the same run: the script checks the step count and the summary.
--max-requests N replays the first N requests of each trace (a quick run).
Then the core alone (no driver, no cost model) at batch 256: the median time of one
decode step stepped, and of one step of a decode stretch taken at once.
Targets on a 2-core machine: light trace under 1 s and at least 5x --no-fast-forward;
Mooncake under 4 s; peak RSS no higher than stepping's.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.core.req import Req  # noqa: E402
from scheduler.core.sampling import SamplingParams  # noqa: E402
from scheduler.sglang.config import SchedulerConfig  # noqa: E402
from scheduler.sglang.scheduler import Scheduler  # noqa: E402
from testbed.options import ReplayOptions  # noqa: E402
from testbed.replay import replay  # noqa: E402
from testbed.traces.gen import GenConfig, generate_trace  # noqa: E402

DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
LIGHT = GenConfig(num_requests=2000, rate=2.0, seed=0)  # = testbed trace gen -n 2000 --rate 2 --seed 0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def one_replay(trace: str, max_requests: int | None, fast_forward: bool, scheduler: str = "sglang") -> dict:
    """One replay in this process: what the parent prints."""
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        result = replay(trace, ReplayOptions(max_requests=max_requests, fast_forward=fast_forward, scheduler=scheduler), out=out)
        wall = time.perf_counter() - t0
    s = result.summary
    return {"wall": wall, "rss_mb": peak_rss_mb(), "summary": s}


def run_child(trace: Path, max_requests: int | None, fast_forward: bool, scheduler: str) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        str(trace),
        "--fast-forward" if fast_forward else "--no-fast-forward",
        "--scheduler",
        scheduler,
    ]
    if max_requests:
        cmd += ["--max-requests", str(max_requests)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def bench_trace(name: str, trace: Path, max_requests: int | None, repeat: int, scheduler: str = "sglang") -> None:
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for _ in range(repeat):  # interleaved: both paths see the same machine load
        for ff in (True, False):
            runs[ff].append(run_child(trace, max_requests, ff, scheduler))
    walls = {ff: statistics.median(r["wall"] for r in rs) for ff, rs in runs.items()}
    s, s_step = runs[True][0]["summary"], runs[False][0]["summary"]
    assert s == s_step, f"{name}: fast-forward and step-by-step summaries differ"
    n = s["completed"] + s["rejected"]
    print(f"replay {name}: {n} requests, {s['num_steps']} steps, {s['simulated_s']:.0f} simulated s (medians of {repeat})")
    for ff, label in ((True, "fast-forward"), (False, "step by step")):
        rss = max(r["rss_mb"] for r in runs[ff])
        print(f"  {label:<13} wall {walls[ff]:6.2f} s   {s['num_steps'] / walls[ff]:>9,.0f} steps/s   peak RSS {rss:,.0f} MB")
    print(f"  speedup {walls[False] / walls[True]:.1f}x (same summary and step count)")


def _prefilled(batch: int, steps: int, input_len: int = 1024, overlap: bool = True) -> Scheduler:
    sched = Scheduler(
        SchedulerConfig(kv_tokens=batch * (input_len + steps + 64), context_len=1 << 20, max_running_requests=batch, overlap=overlap)
    )
    for i in range(batch):
        ids = list(range(i * input_len, (i + 1) * input_len))  # no sharing
        sched.add_request(Req(str(i), input_len, (lambda ids=ids: ids), SamplingParams(max_new_tokens=steps + 10), 0.0, index=i))
    # Prefill until everything runs.
    while sched.waiting_queue or sched.chunked_req is not None:
        batch_ = sched.get_next_batch_to_run()
        launched = sched.launch(batch_, 0.0, overlap=False)
        sched.process_batch_result(launched, [1] * launched.plan.batch_size, 0.0)
    return sched


def bench_decode_step(batch: int, steps: int) -> list[float]:
    """Seconds per decode step of the core alone (no driver, no cost model), at `batch` requests."""
    sched = _prefilled(batch, steps)
    now = 0.0
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


def bench_decode_stretch(batch: int, steps: int, stretch: int = 50) -> list[float]:
    """Seconds per step of decode stretches of `stretch` steps taken at once (the core alone)."""
    from array import array

    sched = _prefilled(batch, steps, overlap=False)
    first = sched.get_next_batch_to_run()  # merge the prefill: from here on the batch decodes
    sched.process_batch_result(sched.launch(first, 0.0, overlap=False), [1] * batch, 0.0)
    times = []
    now = 0.0
    for _ in range(steps // stretch - 1):
        t0 = time.perf_counter()
        s = sched.decode_stretches.decode_stretch(None, 1)
        assert s is not None and s.max_steps >= stretch and s.batch_size == batch
        token_times = array("d", (now + 0.01 * j for j in range(stretch)))
        sched.decode_stretches.advance_decode_stretch(s, stretch, token_times, token_times, 1)  # (launch and process times alike)
        times.append((time.perf_counter() - t0) / stretch)
        now += 0.01 * stretch
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--max-requests", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-replay", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--fast-forward", action=argparse.BooleanOptionalAction, default=True, help=argparse.SUPPRESS)
    ap.add_argument("--scheduler", default="sglang", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_replay(args.child, args.max_requests, args.fast_forward, args.scheduler)))
        return
    if not args.skip_replay:
        bench_trace(args.trace.name, args.trace, args.max_requests, args.repeat)
        with tempfile.TemporaryDirectory() as tmp:
            light = Path(tmp) / "light-2000-2rps.jsonl"
            generate_trace(LIGHT).write(light)
            bench_trace("light load (2,000 requests at 2 req/s)", light, args.max_requests, args.repeat)
            bench_trace("light load under vLLM's scheduler", light, args.max_requests, args.repeat, scheduler="vllm")
    times = bench_decode_step(256, 200)
    print(
        f"core decode step at batch 256: median {statistics.median(times) * 1e6:.0f} us, "
        f"p90 {statistics.quantiles(times, n=10)[-1] * 1e6:.0f} us over {len(times)} steps"
    )
    per_step = bench_decode_stretch(256, 1000)
    print(f"core decode stretch at batch 256 (50 steps at once): median {statistics.median(per_step) * 1e6:.1f} us a step")


if __name__ == "__main__":
    main()
