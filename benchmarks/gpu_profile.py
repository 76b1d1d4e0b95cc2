"""GPU cost profiles from AIConfigurator's kernels: their error, their floor, an independent check, their speed.

    python benchmarks/gpu_profile.py [--profiles FILE ...] [--ground-truth DIR] [--trace PATH] [--json OUT]

For every kernel profile (default: the `source: aiconfigurator` profiles in profiles/):
  1. its error against the database's own measurements it did not use (simulator/profiles/kernel_holdout.py:
     a whole forward at every measured attention shape off a half grid, against the database
     queried at that shape): median and p90 of the relative error, extend and decode;
  2. decode at batch 1 (context 1024) against the HBM floor: one GPU's weights / memory bandwidth.
For the RTX PRO 6000 Server + Llama-3.1-8B profile (vLLM kernels, TP 1):
  3. one layer's forward as the profile prices it against the kernel timings LLMServingSim measured
     on that GPU under vLLM 0.19 (../shared/ground_truth/ops-rtxpro6000-llama-3.1-8b/: eager mode,
     one layer): each GEMM, the norms and activation (dense.csv, at every token count), attention
     (attention.csv: prefill chunks over cached tokens, decode batches, and both in one batch; with
     RoPE, which the profile's attention includes), and the layer (dense + attention);
  4. the hot path: every forward of a replayed trace priced by the roofline, the engine profile and
     an H100 kernel profile (microseconds a forward; a replay of the Mooncake trace has ~143k).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.core.forward_plan import ForwardMode  # noqa: E402
from scheduler.model_config import load_model_config  # noqa: E402
from simulator.costs.kernel_cost import Curve, KernelProfileCostModel  # noqa: E402
from simulator.costs.profile_cost import read_profile  # noqa: E402
from simulator.profiles.gpu_shapes import GpuShapes  # noqa: E402
from simulator.profiles.kernel_db import KernelDatabase  # noqa: E402
from simulator.profiles.kernel_holdout import holdout_errors, uniform_plan  # noqa: E402
from testbed.calibrate_kernels import hbm_floor_s  # noqa: E402
from testbed.options import ReplayOptions  # noqa: E402
from testbed.replay import replay  # noqa: E402

GROUND_TRUTH = ROOT.parent / "shared" / "ground_truth" / "ops-rtxpro6000-llama-3.1-8b"
RTX_PROFILE = ROOT / "profiles" / "rtx_pro_6000_server-vllm-llama-3.1-8b-tp1.json"
H100_PROFILE = ROOT / "profiles" / "h100_sxm-sglang-llama-3.1-8b-tp1.json"
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"


def stats(errors: list[float]) -> dict:
    a = np.abs(errors)
    return {
        "points": len(errors),
        "median_abs": float(np.median(a)),
        "p90_abs": float(np.percentile(a, 90)),
        "median_signed": float(np.median(errors)),
    }


def fmt(s: dict) -> str:
    return (
        f"median {s['median_abs'] * 100:5.1f}%  p90 {s['p90_abs'] * 100:5.1f}%  "
        f"median signed {s['median_signed'] * 100:+6.1f}%  ({s['points']} points)"
    )


# ----------------------------------------------------------------------------- 1 and 2
def profile_checks(path: Path) -> dict:
    profile = read_profile(path)
    db_info = profile["database"]
    db = KernelDatabase.open(db_info["system"], db_info["backend"], db_info["backend_version"])
    model, tp = load_model_config(profile["model"]), profile["tp"]
    holdout = holdout_errors(profile, db, GpuShapes.of(model, tp))
    cost = KernelProfileCostModel(profile)
    decode_1 = cost.forward_time(uniform_plan(ForwardMode.DECODE, 1, 1, 1023))
    floor = hbm_floor_s(model, tp, profile["hardware_spec"]["mem_bandwidth"])
    return {
        "profile": path.name,
        "holdout": holdout,
        "decode_batch1_ms": decode_1 * 1e3,
        "hbm_floor_ms": floor * 1e3,
        "decode_over_floor": decode_1 / floor,
    }


# ----------------------------------------------------------------------------- 3
def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def one_layer_check(profile_path: Path, gt: Path) -> dict:
    """The profile's per-layer prices against the ground truth's kernel timings."""
    profile = read_profile(profile_path)
    k = profile["kernels"]
    layers = k["layers"]
    ours = {op: Curve(k["tokens"], values) for op, values in k["per_layer"].items()}
    cost = KernelProfileCostModel(profile)
    dense_gt: dict[str, dict[int, float]] = defaultdict(dict)
    for row in read_csv(gt / "dense.csv"):
        dense_gt[row["layer"]][int(row["tokens"])] = float(row["time_us"]) * 1e-6
    tokens = sorted(dense_gt["qkv_proj"])
    out: dict[str, dict] = {}
    for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "act_fn"):
        for label, keep in (("decode-sized, <= 256 tokens", lambda n: n <= 256), ("prefill-sized, > 256 tokens", lambda n: n > 256)):
            out[f"{op} ({label})"] = stats([ours[op](n) / dense_gt[op][n] - 1 for n in tokens if keep(n)])
    out["norms (2 x layernorm)"] = stats([ours["norms"](n) / (2 * dense_gt["layernorm"][n]) - 1 for n in tokens])

    def dense_ours(n: int) -> float:
        return sum(curve(n) for curve in ours.values())

    def dense_truth(n: float) -> float:
        ops = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "act_fn")
        return sum(np.interp(n, tokens, [dense_gt[op][t] for t in tokens]) for op in ops) + 2 * np.interp(
            n, tokens, [dense_gt["layernorm"][t] for t in tokens]
        )

    out["dense part of a layer"] = stats([dense_ours(n) / dense_truth(n) - 1 for n in tokens])
    rope = lambda n: float(np.interp(n, tokens, [dense_gt["rotary_emb"][t] for t in tokens]))  # noqa: E731
    attention: dict[str, list[float]] = defaultdict(list)
    layer: dict[str, list[float]] = defaultdict(list)
    for row in read_csv(gt / "attention.csv"):
        pc, kp, nd, kd = (int(row[c]) for c in ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode"))
        n = pc + nd
        if n == 0:
            continue
        t = 0.0
        if pc:
            t += cost.prefill(1, pc, pc * (kp + (pc + 1) / 2)) / layers
        if nd:
            t += cost.decode(nd, kd + 1) / layers  # the new token attends over its context and itself
        truth = float(row["time_us"]) * 1e-6 + rope(n)
        kind = "prefill + decode" if pc and nd else "prefill" if pc else "decode"
        attention[kind].append(t / truth - 1)
        if n <= tokens[-1]:
            layer[kind].append((t + dense_ours(n)) / (truth + dense_truth(n)) - 1)
    for kind, errs in attention.items():
        out[f"attention + RoPE, {kind} rows"] = stats(errs)
    for kind, errs in layer.items():
        out[f"layer (dense + attention), {kind} rows"] = stats(errs)
    return out


# ----------------------------------------------------------------------------- 4
def step_plans(steps) -> list:
    """The forwards of a run (steps.parquet) as plans with the summaries cost models read (requests taken as equal)."""
    plans = []
    for r in steps.itertuples(index=False):
        b = int(r.batch_size)
        if b == 0:
            continue
        mode = ForwardMode(r.mode)
        new, prefix = int(r.num_tokens) // b, int(r.prefix_tokens) // b
        plan = uniform_plan(mode, b, max(new, 1), prefix)
        plan.attention_pairs = float(r.attention_pairs)  # the run's own, not the equal requests'
        plans.append(plan)
    return plans


def hot_path(trace: Path, max_requests: int, repeat: int) -> dict:
    """One roofline replay of the trace (its wall), then the same forwards priced by each cost model."""
    from simulator.costs.profile_cost import ProfileCostModel
    from simulator.costs.roofline import RooflineCostModel
    from simulator.hardware.specs import load_hardware
    from testbed.runs.folder import load_run

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        replay(str(trace), ReplayOptions(max_requests=max_requests), out=d)
        wall = time.perf_counter() - t0
        plans = step_plans(load_run(Path(d)).steps)
    models = {
        "roofline": RooflineCostModel(load_model_config("llama-3.1-8b"), load_hardware("h100")),
        "engine profile": ProfileCostModel.load(ROOT / "profiles" / "cpu-tiny-llama.json"),
        "kernel profile": KernelProfileCostModel(read_profile(H100_PROFILE)),
    }
    out = {"replay_wall_s": wall, "forwards": len(plans)}
    for label, model in models.items():
        f = model.forward_time
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for plan in plans:
                f(plan)
            times.append(time.perf_counter() - t0)
        out[label] = {"us_per_forward": min(times) / len(plans) * 1e6}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", nargs="*", type=Path, default=None, help="kernel profiles (default: those in profiles/)")
    ap.add_argument("--ground-truth", type=Path, default=GROUND_TRUTH)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="trace for the replay speed (default: Azure code)")
    ap.add_argument("--max-requests", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="write every figure here too")
    args = ap.parse_args()
    paths = args.profiles or sorted(p for p in (ROOT / "profiles").glob("*.json") if read_profile(p).get("source") == "aiconfigurator")
    report: dict = {"profiles": [], "one_layer": None, "hot_path": None}

    print("1-2. held-out error (forward, at measured shapes off a half grid) and decode at batch 1 against the HBM floor")
    for path in paths:
        r = profile_checks(path)
        report["profiles"].append(r)
        h = r["holdout"]
        print(f"  {r['profile']}")
        for kind in ("extend", "decode"):
            e = h[kind]
            print(
                f"    {kind:7s} median {e['median_rel_err'] * 100:4.1f}%  p90 {e['p90_rel_err'] * 100:4.1f}%  "
                f"max {e['max_rel_err'] * 100:4.1f}%  ({e['points']} shapes)"
            )
        print(
            f"    decode batch 1, context 1024: {r['decode_batch1_ms']:.2f} ms; floor {r['hbm_floor_ms']:.2f} ms "
            f"({r['decode_over_floor']:.2f}x)"
        )

    if args.ground_truth.is_dir() and RTX_PROFILE.is_file():
        print(
            f"\n3. one layer of Llama-3.1-8B on the RTX PRO 6000: {RTX_PROFILE.name} against {args.ground_truth.name} "
            f"(relative error, profile / measured - 1)"
        )
        report["one_layer"] = one_layer_check(RTX_PROFILE, args.ground_truth)
        for label, s in report["one_layer"].items():
            print(f"  {label:48s} {fmt(s)}")

    if args.trace.is_file() and H100_PROFILE.is_file():
        h = report["hot_path"] = hot_path(args.trace, args.max_requests, args.repeat)
        print(
            f"\n4. hot path: the {h['forwards']:,} forwards of a replay of {args.trace.name} (first {args.max_requests} requests, "
            f"Llama-3.1-8B, roofline: {h['replay_wall_s']:.2f} s wall), priced again by each cost model (best of {args.repeat})"
        )
        for label in ("roofline", "engine profile", "kernel profile"):
            print(f"  {label:15s} {h[label]['us_per_forward']:.2f} us a forward")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
