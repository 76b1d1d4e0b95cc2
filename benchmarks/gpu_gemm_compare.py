"""AIConfigurator's measured GEMM times against the same GEMMs timed on a GPU, and both against the spec's floor.

    python benchmarks/gpu_gemm_compare.py GEMM_TIMES.csv [--system h200_sxm] [--backends vllm,sglang]
        [--hardware h200] [--json OUT]

Why: the simulator prices each forward's linear layers from the database's GEMM rows
(simulator/profiles/kernel_db.py). GEMM_TIMES.csv is what benchmarks/gpu_gemm_times.py measured on
a GPU (torch's F.linear in bf16, torch._scaled_mm in per-tensor fp8); for each of its points this
asks the database of --system for the same (m, n, k, quant), per backend, and prints measured,
database and their ratio (database / measured: below 1, the database is faster than torch here),
then the ratio's median and p10 / p90 per dtype and backend, over all m, m <= 64 (weight reads)
and m >= 1024 (tensor-core bound). Beside them the floor of --hardware's spec, max(bytes / HBM
bandwidth, FLOPs / peak) with the bytes of weights, input and output and the spec's bf16 or fp8
peak, with no efficiency factor: neither figure can be below it, and how far each is says how much
of the GPU each kernel gets. "L2-hot": the measured GEMM on one weight copy, which the L2 cache can
hold where it is small (measured: copies that make every call read its weight from HBM). Without aiconfigurator-core installed, only the measured and the floor.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_gemm_times import SHAPES  # noqa: E402
from simulator.hardware.specs import HardwareSpec, load_hardware  # noqa: E402
from simulator.profiles.kernel_catalog import KernelDatabaseError  # noqa: E402

LAYER = {(n, k): f"{model.removeprefix('llama-3.1-')} {layer}" for model, layer, n, k in SHAPES}


def read_times(path: Path) -> tuple[list[str], list[dict]]:
    """(the '#' header lines, the rows with numbers parsed)."""
    lines = path.read_text().splitlines()
    header = [line[1:].strip() for line in lines if line.startswith("#")]
    rows = []
    for r in csv.DictReader(line for line in lines if not line.startswith("#")):
        rows.append({"m": int(r["m"]), "n": int(r["n"]), "k": int(r["k"]), "dtype": r["dtype"], "measured_s": float(r["median_s"])})
        if r.get("hot_s"):
            rows[-1]["hot_s"] = float(r["hot_s"])
    return header, rows


def floor_s(hw: HardwareSpec, m: int, n: int, k: int, dtype: str) -> float:
    """max(bytes / bandwidth, FLOPs / peak): weights and input in the GEMM's dtype, a bf16 output."""
    wb = 1 if dtype == "fp8" else 2
    peak = hw.peak_flops_fp8 if dtype == "fp8" and hw.peak_flops_fp8 > 0 else hw.peak_flops
    return max((n * k * wb + m * k * wb + m * n * 2) / hw.mem_bandwidth, 2 * m * n * k / peak)


def spread(xs: list[float]) -> dict:
    """median, p10 and p90 (of one value, that value)."""
    if not xs:
        return {}
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else [xs[0]] * 9
    return {"n": len(xs), "median": statistics.median(xs), "p10": q[0], "p90": q[8]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("times", type=Path, help="benchmarks/gpu_gemm_times.py's CSV")
    ap.add_argument("--system", default="h200_sxm", help="AIConfigurator's system (default h200_sxm)")
    ap.add_argument("--backends", default="vllm,sglang", help="comma-separated; those the system lacks are said and skipped")
    ap.add_argument("--hardware", default="h200", help="the spec the floor is taken from (a bundled name or a JSON)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    header, rows = read_times(args.times)
    hw = load_hardware(args.hardware)
    print(f"{args.times}: {len(rows)} points; {'; '.join(header)}")
    print(
        f"floor: {hw.name}, {hw.mem_bandwidth / 1e12:.2f} TB/s, {hw.peak_flops / 1e12:.0f} / {hw.peak_flops_fp8 / 1e12:.0f} TFLOP/s bf16 / fp8"
    )
    dbs = {}
    for backend in args.backends.split(","):
        try:
            from simulator.profiles.kernel_db import KernelDatabase

            db = dbs[backend] = KernelDatabase.open(args.system, backend)
            kernels = {q: db.tables.gemm_kernel(q) for q in ("bfloat16", "fp8")}
            print(f"database: {args.system}/{backend} {db.version}: bf16 {kernels['bfloat16']}, fp8 {kernels['fp8']}")
        except KernelDatabaseError as e:  # no package, or no such system or backend
            print(f"database: {backend}: {e}")
    for r in rows:
        r["layer"] = LAYER.get((r["n"], r["k"]), f"{r['n']}x{r['k']}")
        r["floor_s"] = floor_s(hw, r["m"], r["n"], r["k"], r["dtype"])
        for backend, db in dbs.items():
            try:
                r[backend] = db.gemm(r["m"], r["n"], r["k"], r["dtype"])
            except KernelDatabaseError:
                r[backend] = None
    cols = "".join(f" {b + ' us':>11s} {'/meas':>6s} {'/floor':>6s}" for b in dbs)
    print(f"\n{'layer':11s} {'m':>5s} {'dtype':8s} {'floor us':>9s} {'meas us':>10s} {'/floor':>6s} {'L2-hot us':>10s}{cols}")
    for r in rows:
        line = f"{r['layer']:11s} {r['m']:5d} {r['dtype']:8s} {r['floor_s'] * 1e6:9.2f} {r['measured_s'] * 1e6:10.2f} {r['measured_s'] / r['floor_s']:6.2f}"
        line += f" {r['hot_s'] * 1e6:10.2f}" if "hot_s" in r else f" {'-':>10s}"
        for b in dbs:
            t = r[b]
            line += f" {t * 1e6:11.2f} {t / r['measured_s']:6.2f} {t / r['floor_s']:6.2f}" if t else f" {'-':>11s} {'':6s} {'':6s}"
        print(line)
    ranges = {"all": lambda m: True, "m<=64": lambda m: m <= 64, "m>=1024": lambda m: m >= 1024}
    summary: dict = {}
    print(f"\n{'ratio':22s} {'dtype':8s} " + "  ".join(f"{name + ': median [p10, p90]':>31s}" for name in ranges))
    for dtype in sorted({r["dtype"] for r in rows}):
        mine = [r for r in rows if r["dtype"] == dtype]
        series = {"measured / floor": lambda r: r["measured_s"] / r["floor_s"]}
        for b in dbs:
            series[f"{b} / measured"] = lambda r, b=b: r[b] / r["measured_s"] if r[b] else None
            series[f"{b} / L2-hot"] = lambda r, b=b: r[b] / r["hot_s"] if r[b] and "hot_s" in r else None
            series[f"{b} / floor"] = lambda r, b=b: r[b] / r["floor_s"] if r[b] else None
        for label, f in series.items():
            cells = []
            for name, keep in ranges.items():
                s = spread([v for r in mine if keep(r["m"]) and (v := f(r)) is not None])
                summary.setdefault(label, {}).setdefault(dtype, {})[name] = s
                cells.append(f"{s['median']:7.3f} [{s['p10']:6.3f}, {s['p90']:6.3f}] (n={s['n']:3d})" if s else f"{'-':>31s}")
            print(f"{label:22s} {dtype:8s} " + "  ".join(cells))
    if args.json:
        args.json.write_text(
            json.dumps({"times": str(args.times), "header": header, "system": args.system, "rows": rows, "summary": summary}, indent=1)
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
