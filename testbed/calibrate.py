"""testbed calibrate: measure the real engine on this machine, fit a profile for the simulator.

Three sweeps on the engine of this device (CUDA if present, else the CPU):
- extend forwards over a grid of new tokens x cached prefix length (batches of 1
  and several requests), timed as the real driver times a forward;
- decode forwards over a grid of batch size x context length;
- a real replay of a generated trace without overlap: the CPU cost of each loop
  stage (schedule, launch, process) against batch size and tokens, and every
  forward it ran, timed in place (ragged batches, a KV pool in real use) beside
  the grid's;
- the same replay with overlap: how much slower a forward and the CPU stages are
  when they run at the same time (on a CPU they compete for the cores; on a GPU
  they should not).
The profile keeps the raw measurements, the fitted models, and the fits' errors
on held-out measurements.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np

from scheduler.core.forward_plan import ForwardMode, ForwardPlan, synthetic_plan
from scheduler.model_config import load_model_config
from simulator.costs.profile_cost import PROFILE_FORMAT, PROFILE_VERSION
from testbed.calibrate_fit import fit_profile
from testbed.runs.folder import load_run, versions, write_json

Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass
class CalibrationConfig:
    model: str = "tiny-llama"
    hardware: str | None = None  # the hardware spec of this machine (as replay's --hardware); default: cpu or the GPU's
    load_format: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    attention_backend: str = "auto"
    reps: int = 5
    extend_tokens: list[int] = field(default_factory=lambda: [16, 64, 256, 512, 1024, 2048])
    extend_prefixes: list[int] = field(default_factory=lambda: [0, 256, 1024, 2048])
    extend_batches: list[int] = field(default_factory=lambda: [1, 4])
    decode_batches: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])
    decode_lens: list[int] = field(default_factory=lambda: [64, 256, 1024, 2048])
    cpu_trace_requests: int = 200
    # The replay's arrivals (50 req/s, a burst) at these time scales; e.g. [1, 4] adds a light
    # load (smaller batches). [1, 4] had better held-out errors but, in the one fidelity run it
    # had, a worse error against real runs (see README: machine drift made that run moot).
    replay_time_scales: list[float] = field(default_factory=lambda: [1.0])
    seed: int = 0


class ForwardTimer:
    """Times runner.forward the way RealDriver does: CUDA events on a GPU, the wall clock on the CPU."""

    def __init__(self, runner) -> None:
        import torch

        self.runner, self.torch = runner, torch
        self.cuda = runner.device.type == "cuda"

    def time(self, plan: ForwardPlan, reps: int) -> list[float]:
        torch = self.torch
        self.runner.forward(plan)  # warm up; extend plans keep their row writes, as a real step has
        out = []
        for _ in range(reps):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                self.runner.forward(plan)
                end.record()
                end.synchronize()
                out.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                self.runner.forward(plan)
                out.append(time.perf_counter() - t0)
        return out


def _extend_grid(cfg: CalibrationConfig, context: int) -> list[tuple[int, int, int]]:
    return [
        (b, n, p) for b in cfg.extend_batches for n in cfg.extend_tokens for p in cfg.extend_prefixes if n >= b and p + n // b <= context
    ]


def measure_forwards(runner, cfg: CalibrationConfig, context: int, progress: Progress | None) -> tuple[list[dict], list[dict]]:
    timer = ForwardTimer(runner)
    ext_grid = _extend_grid(cfg, context)
    # Uniform batches, and ragged ones (lengths spread from s/8 to s) where padding shows.
    dec_grid = [
        (b, s, ragged)
        for b in cfg.decode_batches
        for s in cfg.decode_lens
        for ragged in (False, True)
        if s < context and (b > 1 or not ragged)
    ]
    total = len(ext_grid) + len(dec_grid)
    extend, decode = [], []
    for k, (b, n, p) in enumerate(ext_grid):
        plan = synthetic_plan(ForwardMode.EXTEND, [p] * b, [n // b] * b, with_rows=True)
        secs = timer.time(plan, cfg.reps)
        extend.append(
            {
                "batch_size": b,
                "num_tokens": plan.num_tokens,
                "prefix_len": p,
                "attention_pairs": plan.attention_pairs,
                "sum_prefix_len": plan.sum_prefix_len,
                "seconds": secs,
                "median_s": statistics.median(secs),
            }
        )
        if progress:
            progress("forward", k + 1, total)
    for k, (b, s, ragged) in enumerate(dec_grid):
        lens = [max(1, s // 8 + (s - s // 8) * i // max(b - 1, 1)) for i in range(b)] if ragged else [s] * b
        # Rows are written once (a decode step only appends to them).
        setup = synthetic_plan(ForwardMode.EXTEND, [0] * b, lens, with_rows=True)
        runner.cache.apply_row_writes(setup)
        plan = synthetic_plan(ForwardMode.DECODE, lens, [1] * b, with_rows=False)
        secs = timer.time(plan, cfg.reps)
        decode.append(
            {
                "batch_size": b,
                "max_seq_len": max(plan.seq_lens),
                "sum_seq_len": plan.sum_seq_len,
                "ragged": ragged,
                "seconds": secs,
                "median_s": statistics.median(secs),
            }
        )
        if progress:
            progress("forward", len(ext_grid) + k + 1, total)
    return extend, decode


def insitu_forwards(steps) -> list[dict]:
    """The forwards of a run without overlap (steps.parquet), with the features their cost depends on."""
    cols = ("mode", "batch_size", "num_tokens", "prefix_tokens", "attention_pairs", "max_seq_len")
    rows = []
    for r in steps[list(cols) + ["device_start", "device_end"]].itertuples(index=False):
        row = {
            c: (getattr(r, c) if c == "mode" else int(getattr(r, c)) if c != "attention_pairs" else float(r.attention_pairs)) for c in cols
        }
        row["seconds"] = float(r.device_end - r.device_start)
        rows.append(row)
    return rows


def stage_rows(steps) -> list[dict]:
    """Each step's CPU stages (schedule, launch, process) as rows: their time, batch size and tokens."""
    cpu = []
    for stage in ("schedule", "launch", "process"):
        dur = (steps[f"{stage}_end"] - steps[f"{stage}_start"]).to_numpy().copy()
        if stage == "launch":
            # Without overlap on the CPU the forward runs inside the launch: only the rest is launch work.
            dev = (steps["device_end"] - steps["device_start"]).to_numpy()
            inside = (steps["device_start"] >= steps["launch_start"]).to_numpy() & (steps["device_end"] <= steps["launch_end"]).to_numpy()
            dur = np.where(inside, np.maximum(dur - dev, 0.0), dur)
        if stage == "process":
            # The loop's own bookkeeping until the next schedule belongs to this stage,
            # unless the loop went idle (waited for an arrival) in between.
            gap = steps["schedule_start"].to_numpy()[1:] - steps["process_end"].to_numpy()[:-1]
            dur[:-1] += np.where((gap >= 0) & (gap < 0.002), gap, 0.0)
        for b, n, t in zip(steps["batch_size"], steps["num_tokens"], dur):
            cpu.append({"stage": stage, "num_reqs": int(b), "num_tokens": int(n), "seconds": float(t)})
    return cpu


def measure_replay(cfg: CalibrationConfig, model_name: str, overlap: bool, progress: Progress | None) -> tuple[list[dict], list[dict]]:
    """CPU stage times and in-place forward times from real replays of a generated trace, at
    each of cfg.replay_time_scales (a burst at 1; a lighter load, with smaller batches, at more)."""
    from testbed.options import ReplayOptions
    from testbed.replay import replay
    from testbed.traces.gen import GenConfig, generate_trace

    trace = generate_trace(
        GenConfig(
            num_requests=cfg.cpu_trace_requests,
            rate=50.0,
            input_len="uniform:32,512",
            output_len="uniform:16,128",
            system_prompts=4,
            system_prompt_len=128,
            shared_fraction=0.5,
            seed=cfg.seed + 1000,
        )
    )
    phase = "replay overlap" if overlap else "replay"
    n, scales = len(trace), cfg.replay_time_scales
    cpu: list[dict] = []
    forwards: list[dict] = []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "calibration.jsonl"
        trace.write(path)
        for k, scale in enumerate(scales):
            opts = ReplayOptions(
                mode="real",
                model=model_name,
                load_format=cfg.load_format,
                device=cfg.device,
                dtype=cfg.dtype,
                attention_backend=cfg.attention_backend,
                seed=cfg.seed,
                overlap=overlap,
                time_scale=scale,
            )
            report = (lambda p, k=k: progress(phase, k * n + p.done, n * len(scales))) if progress else None
            out = Path(d) / f"run-{k}"
            replay(str(path), opts, out=out, progress=report)
            steps = load_run(out).steps
            cpu += stage_rows(steps)
            forwards += insitu_forwards(steps)
    return cpu, forwards


def calibrate(cfg: CalibrationConfig, out: str | Path, progress: Progress | None = None) -> dict:
    from simulator.hardware.specs import hardware_of_device
    from testbed.backends import build_real, describe_engine
    from testbed.options import ReplayOptions, default_overlap, resolved_options
    from testbed.replay import scheduler_config

    model = load_model_config(cfg.model)
    # Resolved as a replay resolves its options (the KV pool's memory share above all), so the
    # engine measured here is the one a default real run gets.
    opts = resolved_options(
        ReplayOptions(
            mode="real",
            model=cfg.model,
            load_format=cfg.load_format,
            device=cfg.device,
            dtype=cfg.dtype,
            attention_backend=cfg.attention_backend,
            seed=cfg.seed,
        )
    )
    t0 = time.perf_counter()
    backend, _ = build_real(opts, model, lambda kv: scheduler_config(opts, model, kv))
    print(describe_engine(backend.meta), flush=True)  # once: the replays below run on the same engine
    runner = backend.driver.runner
    backend_hardware = backend.meta["hardware"]
    # The KV pool a default real run of this model gets here: what a sim with this profile uses.
    engine_kv_tokens = backend.kv_tokens
    largest_decode = max(cfg.decode_batches) * (max(cfg.decode_lens) + 1)
    largest_extend = max(cfg.extend_batches) * (max(cfg.extend_prefixes) + max(cfg.extend_tokens))
    runner.init_cache(max(largest_decode, largest_extend), max(max(cfg.decode_batches), max(cfg.extend_batches)) + 2)
    extend, decode = measure_forwards(runner, cfg, model.context_len, progress)
    del runner, backend
    cpu, insitu = measure_replay(cfg, cfg.model, False, progress)
    overlap_cpu, overlap_forwards = measure_replay(cfg, cfg.model, True, progress)
    fitted, errors = fit_profile(extend, decode, cpu, insitu, overlap_cpu, overlap_forwards)
    profile = {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "model": model.name,
        "hardware": cfg.hardware or hardware_of_device(backend_hardware) or backend_hardware,
        # What a default real run here gets: a sim with this profile defaults to the same.
        "engine": {"kv_tokens": engine_kv_tokens, "overlap": default_overlap(opts)},
        "calibration": asdict(cfg),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - t0, 1),
        "versions": versions(),
        "fit": fitted,
        "holdout": errors,
        "measurements": {
            "extend": extend,
            "decode": decode,
            "cpu": cpu,
            "replay_forwards": insitu,
            "overlap_cpu": overlap_cpu,
            "overlap_replay_forwards": overlap_forwards,
        },
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, profile)
    return profile


def refit(path: str | Path) -> dict:
    """Fit a profile again from the measurements it holds (after a change to the fit), in place."""
    from simulator.costs.profile_cost import ProfileError

    path = Path(path)
    try:
        profile = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}:{e.lineno}: bad JSON: {e.msg}") from None
    m = profile.get("measurements") or {}
    if profile.get("format") != PROFILE_FORMAT or "replay_forwards" not in m:
        raise ProfileError(f"{path}: no measurements of this testbed's calibrate to fit again")
    fitted, errors = fit_profile(
        m["extend"], m["decode"], m["cpu"], m["replay_forwards"], m.get("overlap_cpu"), m.get("overlap_replay_forwards")
    )
    profile |= {"version": PROFILE_VERSION, "fit": fitted, "holdout": errors}
    write_json(path, profile)
    return profile
