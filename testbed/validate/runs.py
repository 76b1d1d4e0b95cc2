"""Real per-request serving runs (`testbed validate --runs DIR ...`): what ran, and the simulator's replay of it.

A run folder in LLMServingSim's format (requests.jsonl: one request a line with its timestamps;
meta.json: the model, vLLM's version and engine arguments, the GPU) is imported as `testbed run
import` does, its settings read from meta.json (what it leaves out takes vLLM 0.19's defaults),
and its trace replayed in sim with the vLLM scheduler at those settings, every forward priced
from AIConfigurator's kernels of the run's GPU (the database's vLLM version nearest the run's).
The errors of TTFT and TPOT (mean, p50, p90) are (sim - real) / real. TTFT is measured as the run
measured it: vLLM's engine core stamps queued_ts when it reads a request in between two steps, so the
replay's TTFT runs from its own scheduler's intake (testbed/runs/compare.py, summary_from).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from simulator.hardware.specs import bundled_hardware_names
from simulator.profiles import kernel_catalog
from simulator.profiles.interconnect_link import InterconnectLink, llmservingsim_link
from simulator.profiles.kernel_profile import build_kernel_profile
from testbed.options import ReplayOptions
from testbed.runs.compare import summary_from, ttft_basis
from testbed.runs.folder import load_run
from testbed.validate.points import bundled_model_of

FIGURES = ("mean_ttft_ms", "p50_ttft_ms", "p90_ttft_ms", "mean_tpot_ms", "p50_tpot_ms", "p90_tpot_ms", "mean_e2e_ms")
HEADERS = ("TTFT mean", "TTFT p50", "TTFT p90", "TPOT mean", "TPOT p50", "TPOT p90", "E2E mean")
# vLLM 0.19's defaults for what a meta.json may leave out.
VLLM_DEFAULTS = {"block_size": 16, "enable_prefix_caching": True, "async_scheduling": True, "gpu_memory_utilization": 0.9}


@dataclass(frozen=True)
class GroundTruthRun:
    name: str
    folder: Path
    model: str  # a bundled config
    gpu: str  # an AIConfigurator system, a bundled hardware spec, or a JSON spec's path
    tp: int
    options: ReplayOptions  # the vLLM scheduler with the run's settings


FORM_FACTORS = ("sxm", "pcie", "server", "nvl")  # words of a system name that a device name may leave out


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def gpu_of(meta: dict, folder: Path) -> str | None:
    """The run's GPU as a hardware name: an AIConfigurator system (its kernels price the forwards)
    whose name without its form factor is in meta.json's device name (else in the folder name
    vllm-<gpu>-<model>), preferring the form factor the name mentions, then SXM; else a bundled
    spec found the same way. Names are compared without case, spaces and punctuation."""
    device = _squash(((meta.get("hardware") or {}).get("device_name")) or "")
    stem = _squash(folder.name.removeprefix("vllm-").split("-")[0])
    text = device or stem
    matches = []
    for system in kernel_catalog.system_names():
        words = system.split("_")
        core = _squash("".join(w for w in words if w not in FORM_FACTORS))
        if core and core in text:
            form = next((w for w in words if w in FORM_FACTORS), "")
            matches.append((len(core), form != "" and form in text, form == "sxm", system))
    if matches:
        return max(matches)[3]
    for hw in sorted(bundled_hardware_names(), key=len, reverse=True):
        if hw in text:
            return hw
    return None


def settings_of(folder: Path, real: Path, hardware: str | None) -> GroundTruthRun:
    """The model, GPU, TP and vLLM settings of one ground-truth run (ValueError saying what is missing)."""
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").is_file() else {}
    imported = load_run(real).meta
    model = imported.get("model")
    from scheduler.model_config import bundled_model_names

    if model not in bundled_model_names():
        raise ValueError(f"model {imported.get('source_model')!r} has no bundled config ({', '.join(bundled_model_names())})")
    gpu = hardware or gpu_of(meta, folder)
    if gpu is None:
        raise ValueError(
            f"no hardware spec for its GPU ({(meta.get('hardware') or {}).get('device_name') or folder.name}); give --hardware"
        )
    kwargs = meta.get("engine_kwargs") or {}
    kv = meta.get("kv_cache") or {}
    sched = (meta.get("resolved_config") or {}).get("scheduler_config") or {}
    d = VLLM_DEFAULTS
    opts = ReplayOptions(
        scheduler="vllm",
        model=model,
        max_num_seqs=kwargs.get("max_num_seqs"),
        max_num_batched_tokens=kwargs.get("max_num_batched_tokens"),
        page_size=kv.get("block_size") or d["block_size"],
        disable_radix_cache=not kv.get("enable_prefix_caching", d["enable_prefix_caching"]),
        overlap=sched.get("async_scheduling", d["async_scheduling"]),
        kv_tokens=kv.get("num_kv_tokens"),
        mem_fraction_static=kv.get("gpu_memory_utilization") or d["gpu_memory_utilization"],
        seed=kwargs.get("seed") or 0,
    )
    tp, dp = int(kwargs.get("tensor_parallel_size") or 1), int(kwargs.get("data_parallel_size") or 1)
    # vLLM's data parallelism: dp engines, each its own attention over tp GPUs; a mixture of experts'
    # experts over all tp x dp GPUs (--enable-expert-parallel), else each engine's split over its tp.
    ep = tp * dp if kwargs.get("enable_expert_parallel") else 1
    opts = replace(opts, tp=tp, ep=ep, dp=dp, enable_dp_attention=dp > 1)
    return GroundTruthRun(folder.name, folder, model, gpu, tp, opts)


@dataclass(frozen=True)
class GpuTimings:
    """LLMServingSim's kernel timings of a run's GPU under vLLM, beside the run (../shared/ground_truth/ops-*)."""

    attention: Path  # attention.csv
    same_model: bool  # of the run's model
    # meta.yaml's engine tensor_parallel_size (1 where it says none). LLMServingSim emulates TP on one
    # GPU, so its engine says 1 for every degree: a flattened copy's attention.csv is taken as TP 1.
    tp: int


def gpu_timings_of(run: GroundTruthRun) -> GpuTimings | None:
    """A sibling folder's timings of the run's GPU (a meta.yaml whose `gpu` names the same GPU and that
    names a vLLM version, beside attention.csv, or beside tp<N>/attention.csv as LLMServingSim's
    profiler lays out each TP degree it emulates); those of the run's model at its TP first."""
    found = []
    for folder in sorted(run.folder.parent.iterdir()):
        meta = folder / "meta.yaml"
        if folder == run.folder or not meta.is_file():
            continue
        text = meta.read_text(errors="replace")
        gpu = re.search(r"^gpu:\s*(.+)$", text, re.M)
        engine = re.search(r"^vllm_version:", text, re.M)
        if not (gpu and engine and gpu_of({"hardware": {"device_name": gpu.group(1).strip()}}, folder) == run.gpu):
            continue
        model = re.search(r"^model:\s*(.+)$", text, re.M)
        same_model = bool(model) and bundled_model_of(model.group(1).strip()) == run.model
        engine_tp = re.search(r"^\s*tensor_parallel_size:\s*(\d+)", text, re.M)
        candidates = [(folder / "attention.csv", int(engine_tp.group(1)) if engine_tp else 1)]
        candidates += [(d / "attention.csv", int(d.name[2:])) for d in folder.glob("tp*") if d.name[2:].isdigit()]
        for timings, tp in candidates:
            if timings.is_file():
                found.append((not same_model, tp != run.tp, str(timings), GpuTimings(timings, same_model, tp)))
    return min(found)[3] if found else None


def link_of(run: GroundTruthRun) -> InterconnectLink | None:
    """The link between the run's GPUs as LLMServingSim's cluster config of the run states it: a
    config.json in the run's folder, or beside it (LLMServingSim's bench/examples/<GPU>/<model>/
    holds config.json and the run in vllm/), with an instance of the run's model at its TP."""
    if run.tp * run.options.dp == 1:
        return None  # one GPU: nothing to exchange
    for config in (run.folder / "config.json", run.folder.parent / "config.json"):
        link = llmservingsim_link(config, run.model, run.tp)
        if link is not None:
            return link
    return None


def kernel_profile(run: GroundTruthRun, meta: dict, out: Path) -> tuple[str | None, str]:
    """The kernel profile of the run's GPU, model and TP with vLLM's kernels (path, or None and why not),
    with the GPU's own attention timings where they lie beside the run: their mixed batches price the
    decode rows beside a prefill chunk, and, where they are of the run's model at its TP, their decode
    batches the decode attention (simulator/costs/measured_decode_attention.py)."""
    versions = kernel_catalog.available().get(run.gpu, {}).get("vllm", [])
    path = out / "kernels.json"
    timings = gpu_timings_of(run)
    if not versions:
        return _llmservingsim_profile(run, timings, path)
    version = kernel_catalog.nearest_version(versions, meta.get("vllm_version"))
    mixed = timings.attention if timings else None
    decode = timings.attention if timings and timings.same_model and timings.tp == run.tp else None
    link = link_of(run)
    o = run.options
    try:
        profile = build_kernel_profile(
            run.gpu, "vllm", version, run.model, run.tp, ep=o.ep, dp=o.dp, mixed_attention=mixed, decode_attention=decode, link=link
        )
    except kernel_catalog.KernelDatabaseError as e:
        return None, str(e)
    path.write_text(json.dumps(profile) + "\n")
    said = f"{run.gpu} vllm {profile['database']['backend_version']} kernels (the run: vLLM {meta.get('vllm_version', '?')})"
    if decode is not None:
        said += f", decode and mixed batches' attention from {_short(decode)}"
    elif mixed is not None:
        said += f", mixed batches from {_short(mixed)}"
    if link is not None:
        said += f", collectives over the run's link ({link.bandwidth / 1e9:g} GB/s, {link.latency_s * 1e6:g} us a hop: {_short(Path(link.source))})"
    return str(path), said


def _llmservingsim_profile(run: GroundTruthRun, timings: GpuTimings | None, path: Path) -> tuple[str | None, str]:
    """For a GPU the database has no kernels of: the profile of LLMServingSim's timings of the run's
    model at its TP beside it (simulator/profiles/llmservingsim_profile.py), else none (the roofline)."""
    from simulator.profiles.llmservingsim_profile import TimingsFolderError, build_llmservingsim_profile

    no_kernels = f"AIConfigurator has no vLLM kernels of {run.gpu}"
    folder = timings.attention.parent.parent if timings else None
    if timings is None or not timings.same_model or timings.tp != run.tp or timings.attention.parent.name != f"tp{run.tp}":
        return None, no_kernels
    try:
        profile = build_llmservingsim_profile(folder, run.model, run.tp, hardware=run.gpu, link=link_of(run))
    except TimingsFolderError as e:
        return None, f"{no_kernels}, and its timings beside the run make no profile: {e}"
    path.write_text(json.dumps(profile) + "\n")
    return (
        str(path),
        f"{no_kernels}: its own kernels from {folder.name}/tp{run.tp}/ (LLMServingSim's timings under vLLM {profile['database']['backend_version']})",
    )


def _short(path: Path) -> str:
    """A file by its folder and name (tp2/attention.csv: the folder above too)."""
    parts = path.parts[-3:] if path.parent.name.startswith("tp") else path.parts[-2:]
    return "/".join(parts)


def run_folders(paths: list[str]) -> list[Path]:
    """The run folders named: each path a run folder (requests.jsonl beside meta.json), or a folder of them."""
    found: list[Path] = []
    for text in paths:
        path = Path(text)
        if not path.is_dir():
            raise FileNotFoundError(f"--runs {text}: no such folder")
        if (path / "requests.jsonl").is_file():
            found.append(path)
            continue
        inner = sorted(f for f in path.iterdir() if (f / "requests.jsonl").is_file())
        if not inner:
            raise FileNotFoundError(f"--runs {text}: neither a run folder (requests.jsonl) nor a folder of them")
        found += inner
    return found


@dataclass
class RunResult:
    name: str
    model: str | None = None
    gpu: str | None = None
    tp: int | None = None
    layout: str = ""  # beyond TP: ", data parallel 2, experts over 2 GPUs"
    kernels: str | None = None
    real: dict | None = None
    sim: dict | None = None
    skipped: str | None = None  # why it was not simulated
    ttft_from: str = "arrival"  # what both TTFTs are measured from (testbed/runs/compare.py, ttft_basis)

    def error(self, figure: str) -> float | None:
        from testbed.runs.compare import rel_err

        if not self.real or not self.sim:
            return None
        return rel_err(self.real.get(figure), self.sim.get(figure))


def validate_run(folder: Path, out: Path, hardware: str | None = None) -> RunResult:
    """Import `folder` into out/real, replay its trace in sim (vLLM scheduler, kernel profile) into out/sim."""
    from testbed.errors import USER_ERRORS
    from testbed.replay import replay
    from testbed.runs.import_run import import_run

    result = RunResult(folder.name)
    try:
        imported = import_run(folder / "requests.jsonl", out / "real", "llmservingsim")
        run = settings_of(folder, out / "real", hardware)
    except (ValueError, *USER_ERRORS) as e:
        result.skipped = str(e)
        return result
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").is_file() else {}
    result.model, result.gpu, result.tp = run.model, run.gpu, run.tp
    o = run.options
    result.layout = (f", data parallel {o.dp}" if o.dp > 1 else "") + (f", experts over {o.ep} GPUs" if o.ep > 1 else "")
    real = load_run(out / "real")
    result.real = {k: real.summary.get(k) for k in FIGURES}
    path, result.kernels = kernel_profile(run, meta, out)
    opts = replace(run.options, hardware=run.gpu, tp=run.tp, profile=path)
    try:
        replay(str(imported.trace_path), opts, out=out / "sim")
    except USER_ERRORS as e:
        result.skipped = f"the simulator refused it: {e}"
        return result
    # TTFT as the run measured it: from when vLLM's engine core took each request in, in the replay
    # from when its scheduler did (the first schedule after the arrival), not from the arrival.
    sim = load_run(out / "sim")
    result.ttft_from = ttft_basis(real, sim)
    measured = summary_from(sim, result.ttft_from)
    result.sim = {k: measured.get(k) for k in FIGURES}
    return result
