"""Real-engine offline throughput, overlap on and off, and device idle time.

    python benchmarks/engine_throughput.py [-n 256] [--model NAME_OR_FOLDER] [--device auto|cpu|cuda]

The workload: n requests, all arriving at once, input and output lengths
uniform in [lo, hi] (default [100, 1024]), ignore_eos. For each of overlap on and
off it prints output and total tokens per second and the share of wall time the
device sat idle between steps (the loop's CPU work that overlap hides). On CUDA
it also times decode steps at batch 1 against the floor: weight bytes / HBM
bandwidth of the detected GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testbed.options import ReplayOptions  # noqa: E402
from testbed.replay import replay  # noqa: E402
from testbed.runs.folder import load_run  # noqa: E402
from testbed.traces.schema import Trace, TraceRequest  # noqa: E402


def workload(n: int, lo: int, hi: int, seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    ins, outs = rng.integers(lo, hi + 1, n), rng.integers(lo, hi + 1, n)
    return Trace([TraceRequest(0.0, int(i), int(o), rid=f"r{k}") for k, (i, o) in enumerate(zip(ins, outs))])


def device_idle_share(steps) -> float:
    """Share of [first launch, last device end] in which no forward ran."""
    starts, ends = steps["device_start"].to_numpy(), steps["device_end"].to_numpy()
    span = ends.max() - steps["schedule_start"].min()
    busy = float(np.sum(ends - starts))  # forwards run one after another: no overlap between them
    return max(0.0, 1.0 - busy / span) if span > 0 else 0.0


def run(trace_path: Path, out: Path, overlap: bool, args) -> dict:
    opts = ReplayOptions(mode="real", model=args.model, device=args.device, overlap=overlap, kv_tokens=args.kv_tokens, seed=0)
    result = replay(str(trace_path), opts, out=out)
    r = load_run(out)
    s = result.summary
    tokens = s["total_input_tokens"] + s["total_output_tokens"]
    return {
        "overlap": "on" if overlap else "off",
        "output_tok_s": s["output_throughput"],
        "total_tok_s": tokens / s["duration_s"],
        "steps": s["num_steps"],
        "device_idle": device_idle_share(r.steps),
        "wall_s": result.wall_s,
    }


def decode_floor(args, tmp: Path) -> None:
    import torch

    from scheduler.model_config import load_model_config
    from simulator.hardware.specs import load_hardware

    name = torch.cuda.get_device_name().lower()
    hw = load_hardware("h200" if "h200" in name else "h100" if "h100" in name else "a100")
    trace = Trace([TraceRequest(0.0, 128, 256, rid="solo")])
    path = tmp / "solo.jsonl"
    trace.write(path)
    model = load_model_config(args.model or "llama-3.1-8b")
    floor = model.weight_bytes(2) / hw.mem_bandwidth
    for graphs in (True, False):
        run_dir = tmp / f"solo-graphs-{graphs}"
        opts = ReplayOptions(mode="real", model=args.model, device="cuda", overlap=True, disable_cuda_graph=not graphs)
        replay(str(path), opts, out=run_dir)
        steps = load_run(run_dir).steps
        dec = steps[steps["mode"] == "decode"]
        per_step = statistics.median((dec["device_end"] - dec["device_start"]).tolist())
        print(
            f"decode at batch 1 on {name}, CUDA graphs {'on' if graphs else 'off'}: median {per_step * 1e3:.2f} ms/step; "
            f"floor (weights / HBM) {floor * 1e3:.2f} ms; ratio {per_step / floor:.2f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--lo", type=int, default=100)
    ap.add_argument("--hi", type=int, default=1024)
    ap.add_argument("--model", default=None, help="default: tiny-llama on the CPU, llama-3.1-8b on CUDA")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--kv-tokens", type=int, default=None)
    ap.add_argument(
        "--order",
        default="on,off",
        help="overlap settings in run order; on CUDA the first run of a process pays for kernel loads and "
        "library plans that later runs find ready, so compare runs after the first (e.g. on,off,on,off)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        path = tmp / "offline.jsonl"
        workload(args.n, args.lo, args.hi, seed=0).write(path)
        rows = [run(path, tmp / f"run-{k}", setting == "on", args) for k, setting in enumerate(args.order.split(","))]
        print(f"{'overlap':<8}{'output tok/s':>14}{'total tok/s':>14}{'steps':>8}{'device idle':>13}{'wall s':>9}")
        for r in rows:
            print(
                f"{r['overlap']:<8}{r['output_tok_s']:>14,.0f}{r['total_tok_s']:>14,.0f}{r['steps']:>8}{r['device_idle'] * 100:>12.1f}%{r['wall_s']:>9.1f}"
            )
        import torch

        if torch.cuda.is_available() and args.device in ("auto", "cuda"):
            decode_floor(args, tmp)


if __name__ == "__main__":
    main()
