"""Why is the real engine slower with overlap on CUDA than without? A probe (a benchmark for a
CUDA machine, not a test).

    python benchmarks/cuda_overlap_probe.py [--model llama-3.1-8b] [-n 8] [--in 128] [--out 64]

For each run of --runs (overlap on or off : decode CUDA graphs, eager, or eager with cuDNN's
attention allowed, which engine/attention.py leaves out of eager forwards), one replay of n requests that arrive
together, each in a fresh engine, in that order (what a process has loaded and planned once
stays: a run after another of its kind shows what is left when shapes repeat). Per run it
prints the median device time of a decode step (CUDA events), the median host time spent inside the launch
(RealDriver._launch: enqueueing the forward; when it is close to the device time, the launch
waited for the device), the wall time, and the host-device synchronisations that torch reported
inside the launch (torch.cuda.set_sync_debug_mode), grouped by the innermost frame of this
project. Last, a torch.profiler table of the host's own time over one eager replay with
overlap on: where the host time of a launch goes.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine import attention  # noqa: E402
from engine.real_driver import RealDriver  # noqa: E402
from testbed.options import ReplayOptions  # noqa: E402
from testbed.replay import replay  # noqa: E402
from testbed.runs.folder import load_run  # noqa: E402
from testbed.traces.schema import Trace, TraceRequest  # noqa: E402


class LaunchProbe:
    """Wraps RealDriver._launch: host seconds per launch, and torch's sync warnings raised in it."""

    def __init__(self) -> None:
        self.launch_s: list[float] = []
        self.syncs: collections.Counter[str] = collections.Counter()
        self._original = RealDriver._launch
        self._in_launch = False

    def __enter__(self) -> LaunchProbe:
        probe = self

        def timed_launch(driver, plan):
            probe._in_launch = True
            t0 = time.perf_counter()
            try:
                return probe._original(driver, plan)
            finally:
                probe.launch_s.append(time.perf_counter() - t0)
                probe._in_launch = False

        def record(message, category, filename, lineno, file=None, line=None):
            if not probe._in_launch or "synchroniz" not in str(message):
                return
            frames = [f for f in traceback.extract_stack()[:-1] if str(ROOT) in f.filename and "benchmarks" not in f.filename]
            where = f"{Path(frames[-1].filename).relative_to(ROOT)}:{frames[-1].lineno} {frames[-1].line}" if frames else filename
            probe.syncs[where] += 1

        RealDriver._launch = timed_launch
        self._showwarning = warnings.showwarning
        warnings.showwarning = record
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = self._showwarning
        RealDriver._launch = self._original


def one_run(path: Path, out: Path, spec: str, model: str | None) -> None:
    overlap, forwards = spec.split(":")
    opts = ReplayOptions(mode="real", model=model, device="cuda", overlap=overlap == "on", disable_cuda_graph=forwards != "graphs", seed=0)
    cudnn = forwards == "eager-cudnn"
    if cudnn:
        attention.SDPA_BACKENDS.append(torch.nn.attention.SDPBackend.CUDNN_ATTENTION)
    try:
        with LaunchProbe() as probe:
            t0 = time.perf_counter()
            replay(str(path), opts, out=out)
            wall = time.perf_counter() - t0
    finally:
        if cudnn:
            attention.SDPA_BACKENDS.pop()
    steps = load_run(out).steps
    dec = steps[steps["mode"] == "decode"]
    device_ms = statistics.median((dec["device_end"] - dec["device_start"]).tolist()) * 1e3 if len(dec) else float("nan")
    launch_ms = statistics.median(probe.launch_s) * 1e3 if probe.launch_s else float("nan")
    ext = steps[steps["mode"] != "decode"]
    extend_ms = statistics.median((ext["device_end"] - ext["device_start"]).tolist()) * 1e3 if len(ext) else float("nan")
    print(
        f"overlap {overlap:<3} {forwards:<11}: decode step on the device {device_ms:7.2f} ms (extend {extend_ms:7.2f} ms), "
        f"host time in a launch {launch_ms:7.2f} ms, {len(steps)} steps, wall {wall:6.2f} s, syncs in launches {sum(probe.syncs.values())}"
    )
    for where, count in probe.syncs.most_common(6):
        print(f"    {count:>6} x {where}")


def host_profile(path: Path, out: Path, model: str | None) -> None:
    from torch.profiler import ProfilerActivity, profile

    opts = ReplayOptions(mode="real", model=model, device="cuda", overlap=True, disable_cuda_graph=True, seed=0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        replay(str(path), opts, out=out)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=48))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: llama-3.1-8b on CUDA")
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--in", dest="input_len", type=int, default=128)
    ap.add_argument("--out", dest="output_len", type=int, default=64)
    ap.add_argument(
        "--runs",
        default="off:graphs,on:graphs,off:eager,on:eager,on:eager-cudnn,on:eager-cudnn",
        help="overlap:forwards in run order; forwards one of graphs, eager, eager-cudnn",
    )
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("cuda_overlap_probe: needs a CUDA device")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        path = tmp / "probe.jsonl"
        Trace([TraceRequest(0.0, args.input_len, args.output_len, rid=f"r{k}") for k in range(args.n)]).write(path)
        for k, spec in enumerate(args.runs.split(",")):
            one_run(path, tmp / f"run-{k}", spec, args.model)
        if not args.no_profile:
            host_profile(path, tmp / "profiled", args.model)


if __name__ == "__main__":
    main()
