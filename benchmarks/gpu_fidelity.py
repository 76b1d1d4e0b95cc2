"""GPU fidelity: the simulator against real vLLM serving runs on GPUs (a benchmark, not a test).

    python benchmarks/gpu_fidelity.py [--ground-truth ../shared/ground_truth | ground_truth] [--out runs/gpu-fidelity]
                                      [--hardware NAME|JSON] [--profile PATH] [--no-kernels] [--json]

For every run folder ground_truth/vllm-* (LLMServingSim's format: requests.jsonl + meta.json):

1. `testbed run import` it into OUT/<run>/real (arrival = queued_ts), with trace.jsonl beside it.
2. From its meta.json: the model (a bundled config of its Hugging Face id), the GPU (one of
   AIConfigurator's systems, else a bundled spec, matched to meta.hardware.device_name, else to
   the folder name vllm-<gpu>-<model>; --hardware overrides),
   tensor parallelism, and the engine settings: max_num_seqs, max_num_batched_tokens, block size,
   prefix caching, async scheduling, the KV pool (kv_cache.num_kv_tokens, else sized from
   gpu_memory_utilization). What meta.json leaves out takes vLLM 0.19's defaults (block 16,
   prefix caching on, async scheduling on, gpu_memory_utilization 0.9).
3. Builds the kernel profile of that GPU, model and TP from AIConfigurator's database with the
   run's backend (vllm, at the database's version nearest the run's), as `testbed calibrate
   --source aiconfigurator` does, into OUT/<run>/kernels.json.
4. Replays the trace in sim, every variant on the same KV pool and at the run's TP (--tp):
     vllm / kernels      the vLLM scheduler with the run's settings, the kernel profile
     vllm / roofline     the same scheduler, the roofline of the GPU
     sglang / kernels    SGLang's scheduler, its nearest settings (max_running_requests =
     sglang / roofline   max_num_seqs, chunked_prefill_size = max_num_batched_tokens, each
                         times the DP ranks: SGLang's limits are the server's, vLLM's an engine's)
     vllm / profile, sglang / profile   the same with --profile PATH, when given
   so the table shows what the cost model and what the scheduler contribute.
5. Prints the relative error (sim - real) / real of TTFT and TPOT (mean, p50, p90) and of the
   mean E2E for each variant, against the 5% target, and writes OUT/gpu_fidelity.json. Every
   run folder stays under OUT (`testbed compare OUT/<run>/real OUT/<run>/<variant>`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.hardware.specs import HardwareConfigError  # noqa: E402
from testbed.errors import USER_ERRORS  # noqa: E402
from testbed.options import ReplayOptions  # noqa: E402
from testbed.replay import replay  # noqa: E402
from testbed.runs.compare import rel_err, summary_from, ttft_basis  # noqa: E402
from testbed.runs.folder import load_run  # noqa: E402
from testbed.runs.import_run import import_run  # noqa: E402
from testbed.validate.runs import FIGURES, HEADERS, GroundTruthRun, kernel_profile, settings_of  # noqa: E402

GROUND_TRUTH = ROOT.parent / "shared" / "ground_truth"
TARGET = 0.05  # every TTFT and TPOT figure


def variants(run: GroundTruthRun, kernels: str | None, profile: str | None) -> dict[str, ReplayOptions]:
    vllm = replace(run.options, hardware=run.gpu, tp=run.tp)
    o = run.options
    # vLLM's limits are each DP engine's; SGLang's are the server's, divided over its DP ranks
    # (testbed/schedulers/vllm.py): the nearest SGLang settings are vLLM's times the ranks.
    sglang = replace(
        vllm,
        scheduler="sglang",
        max_num_seqs=None,
        max_num_batched_tokens=None,
        max_running_requests=o.max_num_seqs * o.dp if o.max_num_seqs else None,
        chunked_prefill_size=(o.max_num_batched_tokens or ReplayOptions().chunked_prefill_size) * o.dp,
        page_size=1,
    )
    out = {}
    if kernels:
        out |= {"vllm / kernels": replace(vllm, profile=kernels), "sglang / kernels": replace(sglang, profile=kernels)}
    out |= {"vllm / roofline": vllm, "sglang / roofline": sglang}
    if profile:
        out |= {"vllm / profile": replace(vllm, profile=profile), "sglang / profile": replace(sglang, profile=profile)}
    return out


def measure(folder: Path, out: Path, hardware: str | None, profile: str | None, kernels: bool) -> dict:
    run_out = out / folder.name
    real_dir = run_out / "real"
    imported = import_run(folder / "requests.jsonl", real_dir, "llmservingsim")
    run = settings_of(folder, real_dir, hardware)
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").is_file() else {}
    kernels_path, kernels_note = kernel_profile(run, meta, run_out) if kernels else (None, "not asked for (--no-kernels)")
    real_run = load_run(real_dir)
    real = real_run.summary
    result = {
        "run": run.name,
        "model": run.model,
        "gpu": run.gpu,
        "tp": run.tp,
        "kernels": kernels_note,
        "real": {k: real.get(k) for k in FIGURES},
        "variants": {},
    }
    # Every variant on the first variant's KV pool: the schedulers and the costs are what differs.
    kv_tokens = run.options.kv_tokens
    for label, opts in variants(run, kernels_path, profile).items():
        if kv_tokens is not None:
            opts = replace(opts, kv_tokens=kv_tokens)
        sim_dir = run_out / label.replace(" / ", "-")
        try:
            res = replay(str(imported.trace_path), opts, out=sim_dir)
        except USER_ERRORS as e:
            result["variants"][label] = {"error": str(e)}
            continue
        if kv_tokens is None:
            kv_tokens = res.summary["kv_tokens"]  # the vLLM variant's pool, for the others
        sim_run = load_run(sim_dir)
        sim = summary_from(sim_run, ttft_basis(real_run, sim_run))  # TTFT from each engine's intake, as the run's
        result["variants"][label] = {
            "run_dir": str(sim_dir),
            "summary": {k: sim.get(k) for k in FIGURES},
            "rel_err": {k: rel_err(real.get(k), sim.get(k)) for k in FIGURES},
            "kv_tokens": res.summary["kv_tokens"],
            "wall_s": round(res.wall_s, 2),
        }
    return result


def format_table(result: dict) -> str:
    lines = [
        f"{result['run']}: {result['model']} on {result['gpu']} x{result['tp']}   rel. err = (sim - real) / real, target {TARGET:.0%}",
        f"kernels: {result['kernels']}",
    ]
    real = result["real"]
    head = f"{'':<20}" + "".join(f"{h:>11}" for h in HEADERS)
    lines += [head, "-" * len(head)]
    lines.append(f"{'real (ms)':<20}" + "".join(f"{real[k]:>11,.1f}" if real[k] is not None else f"{'-':>11}" for k in FIGURES))
    for label, v in result["variants"].items():
        if "error" in v:
            lines.append(f"{label:<20}error: {v['error']}")
            continue
        cells = []
        for k in FIGURES:
            e = v["rel_err"][k]
            mark = "" if e is None or abs(e) <= TARGET or "e2e" in k else "*"
            cells.append(f"{'-' if e is None else f'{e * 100:+.1f}%'}{mark}".rjust(11))
        lines.append(f"{label:<20}" + "".join(cells))
    lines.append("* outside the target")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ground-truth", type=Path, default=GROUND_TRUTH, help="folder of vllm-* runs (default %(default)s)")
    p.add_argument("--out", type=Path, default=Path("runs") / "gpu-fidelity")  # beside where it runs, as every command
    p.add_argument("--hardware", default=None, help="hardware spec (name or JSON) for every run instead of the one its meta.json names")
    p.add_argument("--profile", default=None, help="also replay with this cost profile (the run's GPU and model)")
    p.add_argument(
        "--no-kernels", action="store_true", help="no kernel profile (AIConfigurator's database): the roofline and --profile only"
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    folders = sorted(f for f in args.ground_truth.glob("vllm-*") if (f / "requests.jsonl").is_file())
    if not folders:
        print(f"no vllm-*/requests.jsonl under {args.ground_truth}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for folder in folders:
        try:
            result = measure(folder, args.out, args.hardware, args.profile, not args.no_kernels)
        except (ValueError, HardwareConfigError, *USER_ERRORS) as e:
            result = {"run": folder.name, "error": str(e)}
            print(f"{folder.name}: skipped: {e}", file=sys.stderr)
        results.append(result)
        if "error" not in result and not args.json:
            print(format_table(result) + "\n")
    (args.out / "gpu_fidelity.json").write_text(json.dumps(results, indent=2) + "\n")
    if args.json:
        print(json.dumps(results, indent=2))
    print(f"results: {args.out / 'gpu_fidelity.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
