"""The linear layers' GEMMs of Llama-3.1-8B and -70B (TP 1), timed on this GPU, bf16 and per-tensor fp8.

    python benchmarks/gpu_gemm_times.py [--out gemm-times.csv] [--device cuda|cpu] [--quick] [--budget-s 50]

Why: the simulator prices every forward from AIConfigurator's measured kernels
(simulator/profiles/kernel_db.py); benchmarks/gpu_gemm_compare.py sets the database's GEMM times
beside these, measured here, and beside the floor of the GPU's spec. It needs torch alone, so it
runs where aiconfigurator-core is not installed.

What: for each layer (qkv, o, gate_up, down as nn.Linear holds them, w [n, k]) and m tokens from 1
to 8192, `F.linear(x, w)` in bf16 and `torch._scaled_mm` of e4m3 operands with float32 per-tensor
scales and a bf16 output (vLLM's and SGLang's per-tensor fp8 path; cuBLASLt here, CUTLASS there). On CUDA a graph of `iters`
calls (about 1 ms of work, at most 200 calls) is captured and replayed 5 times after warm-up, each
replay timed with CUDA events; median_s is the median per call, free of the host's launch time.
Each call reads another copy of the weight, enough copies to cover twice the L2 cache, as a
forward reads every layer's weights from HBM (median_s); hot_s is the same GEMM on one copy
(the weight in L2 where it fits). Bounded: 8 + 6 x iters calls a timing, at most 200 calls a graph,
and --budget-s of wall time (default 50 s), after which the points left are skipped with a line
saying so; the 224 points took 4.7 s on an H200 (2026-11-28).

Writes CSV: m,n,k,dtype,median_s,iters,hot_s,copies (dtype bfloat16 or fp8, the database's names),
after '#' lines naming the GPU and torch. `--device cpu --quick`: a dry run (bf16 only, three m,
the 8B layers; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# (model, layer, n, k): nn.Linear's out and in features at TP 1.
SHAPES: list[tuple[str, str, int, int]] = [
    ("llama-3.1-8b", "qkv", 6144, 4096),
    ("llama-3.1-8b", "o", 4096, 4096),
    ("llama-3.1-8b", "gate_up", 28672, 4096),
    ("llama-3.1-8b", "down", 4096, 14336),
    ("llama-3.1-70b", "qkv", 10240, 8192),
    ("llama-3.1-70b", "o", 8192, 8192),
    ("llama-3.1-70b", "gate_up", 57344, 8192),
    ("llama-3.1-70b", "down", 8192, 28672),
]
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
QUICK_TOKENS = [1, 4, 16]
REPEATS = 5
TARGET_S = 1e-3  # GPU work a timed replay holds
MAX_ITERS = 200
CAPTURE_FAILED: list[int] = []  # said once


def timed(fn: Callable[[int], object], device: str, side: torch.cuda.Stream | None = None, repeats: int = REPEATS) -> tuple[float, int]:
    """(median seconds a call, calls a repeat) of fn(i), i the call's index (which weight copy); side: the
    CUDA stream that warm-ups, capture and replays run on (one for all points: cuBLAS keeps a workspace a stream)."""
    import torch

    if device == "cpu":
        fn(0)
        times = []
        for r in range(repeats):
            t0 = time.perf_counter()
            fn(r)
            times.append(time.perf_counter() - t0)
        return statistics.median(times), 1
    assert side is not None
    side.wait_stream(torch.cuda.current_stream())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(side):
        for i in range(3):
            fn(i)
        start.record()
        for i in range(5):
            fn(i)
        end.record()
        end.synchronize()
        guess = start.elapsed_time(end) / 5e3  # the launch gaps in it too: a bound from above
        iters = max(1, min(MAX_ITERS, math.ceil(TARGET_S / max(guess, 1e-7))))
        graph = torch.cuda.CUDAGraph()
        try:  # capture_begin/end on the side stream: torch.cuda.graph would also collect garbage at each capture
            graph.capture_begin()
            try:
                for i in range(iters):
                    fn(i)
            finally:
                graph.capture_end()
            run = graph.replay
        except RuntimeError as e:  # no capture: time the eager loop (host launches may then show)
            if not CAPTURE_FAILED:
                print(f"CUDA graph capture failed ({str(e).splitlines()[0][:120]}): timing eager loops")
            CAPTURE_FAILED.append(1)

            def run() -> None:
                for i in range(iters):
                    fn(i)

        run()
        times = []
        for _ in range(repeats):
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / iters)
    torch.cuda.current_stream().wait_stream(side)
    return statistics.median(times), iters


def gemm_fn(m: int, n: int, k: int, dtype: str, device: str, copies: int) -> Callable[[int], object]:
    """A call that runs one GEMM of x [m, k] by the i-th of `copies` weights [n, k]."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    if dtype == "bfloat16":
        ws = [torch.randn(n, k, device=device, dtype=torch.bfloat16) for _ in range(copies)]
        return lambda i: F.linear(x, ws[i % copies])
    x8 = x.to(torch.float8_e4m3fn)
    w8 = [torch.randn(n, k, device=device, dtype=torch.bfloat16).to(torch.float8_e4m3fn) for _ in range(copies)]
    one = torch.ones((), device=device, dtype=torch.float32)
    # mat2 column-major: the transpose of a row-major [n, k] weight, as vLLM and SGLang pass it; fast
    # accumulation, as their CUTLASS kernels for Hopper (the database's fp8 rows) use.
    return lambda i: torch._scaled_mm(x8, w8[i % copies].t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("gemm-times.csv"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="m in 1, 4, 16 and the 8B layers only (a dry run)")
    ap.add_argument("--budget-s", type=float, default=50.0, help="wall time after which the points left are skipped")
    args = ap.parse_args(argv)
    import torch

    t_start = time.perf_counter()
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        print("gpu_gemm_times: no CUDA device (use --device cpu for a dry run)")
        return 2
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    l2 = (getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 64 * 2**20) if dev == "cuda" else 0
    dtypes = ["bfloat16"] + (["fp8"] if dev == "cuda" else [])
    if dev == "cpu":
        print("fp8: skipped on the CPU (torch._scaled_mm needs CUDA fp8 tensor cores)")
    shapes = [s for s in SHAPES if s[0] == "llama-3.1-8b"] if args.quick else SHAPES
    tokens = QUICK_TOKENS if args.quick else TOKENS
    print(f"{name}, torch {torch.__version__}, L2 {l2 / 2**20:.0f} MiB; {len(shapes)} layers x {len(tokens)} m x {len(dtypes)} dtypes")
    torch.manual_seed(0)
    side = torch.cuda.Stream() if dev == "cuda" else None  # a capture must not run on the default stream
    if dev == "cuda":  # clocks up before the first timing: about half a second of large GEMMs
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.5:
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()
        del a
    args.out.parent.mkdir(parents=True, exist_ok=True)
    f = args.out.open("w", newline="")  # written a row at a time: a run stopped at its limit keeps its points
    f.write(f"# gpu: {name}\n# torch: {torch.__version__} cuda {torch.version.cuda}; L2 {l2} bytes; repeats {REPEATS}\n")
    out = csv.writer(f)
    out.writerow(["m", "n", "k", "dtype", "median_s", "iters", "hot_s", "copies"])
    rows, skipped = 0, 0
    for model, layer, n, k in shapes:
        for dtype in dtypes:
            w_bytes = n * k * (2 if dtype == "bfloat16" else 1)
            copies = max(1, math.ceil(2 * l2 / w_bytes)) if l2 else 1
            for m in tokens:
                if time.perf_counter() - t_start > args.budget_s:
                    skipped += 1
                    continue
                try:
                    cold, iters = timed(gemm_fn(m, n, k, dtype, dev, copies), dev, side)
                    hot = timed(gemm_fn(m, n, k, dtype, dev, 1), dev, side)[0] if copies > 1 else cold
                except (RuntimeError, TypeError) as e:  # one shape the kernel refuses: say so, go on
                    print(f"{model} {layer} m={m} {dtype}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    continue
                out.writerow([m, n, k, dtype, f"{cold:.6e}", iters, f"{hot:.6e}", copies])
                f.flush()
                rows += 1
                flops = 2 * m * n * k / cold
                print(
                    f"{model:13s} {layer:7s} m={m:5d} {dtype:8s} {cold * 1e6:10.2f} us  hot {hot * 1e6:10.2f} us  {flops / 1e12:6.1f} TFLOP/s  x{iters}"
                )
            if dev == "cuda":
                torch.cuda.empty_cache()
    if skipped:
        print(f"budget of {args.budget_s:.0f} s spent: {skipped} points skipped")
    f.close()
    print(f"wrote {args.out}: {rows} points in {time.perf_counter() - t_start:.1f} s")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
