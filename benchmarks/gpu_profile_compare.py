"""Two GPU cost sources side by side: a `testbed calibrate` profile of a GPU against an AIConfigurator profile.

    python benchmarks/gpu_profile_compare.py CALIBRATED.json KERNELS.json [--json OUT]

CALIBRATED is what `testbed calibrate` measured on a GPU (this project's engine, its forwards
timed with CUDA events); KERNELS is a `testbed calibrate --source aiconfigurator` profile of the
same GPU and model (kernel timings measured under SGLang, vLLM or TRT-LLM). For every forward the
calibration measured (extend over new tokens x cached prefix, decode over batch x context) it
prints the measured median, what each profile prices it at, and their ratios; then the median
ratio by mode. The two engines are not the same (this one runs eager torch with the attention
backend it found; the database's engines run fused kernels inside CUDA graphs), so the ratio
says how far this engine is from a production one on that GPU, shape by shape.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.core.forward_plan import ForwardMode  # noqa: E402
from simulator.costs.profile_cost import read_profile  # noqa: E402
from simulator.costs.sources import load_profile  # noqa: E402
from simulator.profiles.kernel_holdout import uniform_plan  # noqa: E402


def measured_points(calibrated: dict) -> list[tuple[ForwardMode, int, int, int, float]]:
    """(mode, batch, new tokens a request, prefix or context, measured median s) of the calibration's uniform grid."""
    m = calibrated["measurements"]
    out = [(ForwardMode.EXTEND, r["batch_size"], r["num_tokens"] // r["batch_size"], r["prefix_len"], r["median_s"]) for r in m["extend"]]
    out += [(ForwardMode.DECODE, r["batch_size"], 1, r["max_seq_len"] - 1, r["median_s"]) for r in m["decode"] if not r["ragged"]]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("calibrated", type=Path)
    ap.add_argument("kernels", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    calibrated = read_profile(args.calibrated)
    fit, kernels = load_profile(args.calibrated), load_profile(args.kernels)
    rows = []
    print(f"{'mode':<7}{'batch':>6}{'new':>6}{'prefix':>8}{'measured ms':>13}{'fit ms':>9}{'kernels ms':>12}{'measured/kernels':>18}")
    for mode, b, new, prefix, t in measured_points(calibrated):
        plan = uniform_plan(mode, b, new, prefix)
        f, k = fit.forward_time(plan), kernels.forward_time(plan)
        rows.append({"mode": mode.value, "batch": b, "new_tokens": new, "prefix": prefix, "measured_s": t, "fit_s": f, "kernels_s": k})
        print(f"{mode.value:<7}{b:>6}{new:>6}{prefix:>8}{t * 1e3:>13.2f}{f * 1e3:>9.2f}{k * 1e3:>12.2f}{t / k:>18.2f}")
    summary = {}
    for mode in ("extend", "decode"):
        ratios = [r["measured_s"] / r["kernels_s"] for r in rows if r["mode"] == mode]
        if ratios:
            summary[mode] = {
                "points": len(ratios),
                "median_measured_over_kernels": statistics.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
            }
            print(
                f"{mode}: {len(ratios)} shapes, measured / kernels median {statistics.median(ratios):.2f}x "
                f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)"
            )
    if args.json:
        args.json.write_text(
            json.dumps({"calibrated": str(args.calibrated), "kernels": str(args.kernels), "rows": rows, "summary": summary}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
