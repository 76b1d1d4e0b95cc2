"""The two clocks a replay can run on: the simulator and the real engine.

Each builder returns a Backend: the driver that runs the event loop, the KV
pool size the scheduler gets, the vocabulary prompts are drawn from, and what
run.json records about it. torch is imported only for the real engine (in build_real), so a
simulation starts fast on any machine; the simulator's modules are imported with this one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from engine.support import BUILT, engine_refusal
from scheduler.model_config import ModelConfig
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.mamba_pool import cap_running_requests
from simulator.costs.moe_roofline import roofline_cost_model
from simulator.costs.precision import Precision
from simulator.driver.sim_driver import SimDriver
from simulator.hardware.kv_capacity import kv_capacity_tokens
from simulator.hardware.specs import load_hardware
from testbed.errors import ConfigError
from testbed.replay_options import DEFAULT_HARDWARE
from testbed.schedulers import scheduler_kind


@dataclass
class Backend:
    driver: Any  # SimDriver | RealDriver: clock() and run(loop)
    kv_tokens: int
    vocab_size: int | None  # None: the simulator takes any int as a token
    meta: dict = field(default_factory=dict)  # for run.json: hardware, cost model or device


def build_sim(opts, model: ModelConfig, make_config: Callable[[int], SchedulerConfig]) -> tuple[Backend, SchedulerConfig]:
    hw = load_hardware(opts.hardware or DEFAULT_HARDWARE)
    model.check_parallel(opts.tp, opts.ep, opts.dp)
    if opts.expert_imbalance is not None and not model.is_moe:
        raise ConfigError(f"--expert-imbalance {opts.expert_imbalance:g}: {model.name} is a dense model (no experts to load)")
    try:
        # Unset --quantization: the checkpoint's own format (DeepSeek-V3's fp8 blocks, gpt-oss's mxfp4 experts).
        precision = Precision.resolve(
            model.torch_dtype,
            opts.quantization,
            opts.kv_cache_dtype,
            model.checkpoint_quantization,
            model.checkpoint_quantizes_experts_only,
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
    profile = None
    if opts.profile is not None:
        from simulator.costs.profile_cost import ProfileError
        from simulator.costs.sources import load_profile

        graphs = scheduler_kind(opts.scheduler).cuda_graphs(opts)
        try:
            profile = load_profile(opts.profile, overlap=bool(opts.overlap), graphs=graphs)
            profile.check_model(model, opts.tp, opts.ep, opts.dp)
            profile.check_expert_load(opts.expert_imbalance)
            profile.check_precision(precision)
        except ProfileError as e:
            raise ConfigError(str(e)) from None
        # A kernel profile sizes the KV pool from its own system's memory.
        hw = profile.hardware_spec or hw
    try:
        # An engine profile knows the KV pool its engine had; otherwise it follows from the hardware.
        kv_tokens = (
            opts.kv_tokens
            or (profile and profile.engine_kv_tokens)
            or kv_capacity_tokens(
                model, hw, opts.mem_fraction_static, page_size=opts.page_size, tp=opts.tp, precision=precision, ep=opts.ep, dp=opts.dp
            )
        )
        config = make_config(kv_tokens)
        if isinstance(config, SchedulerConfig):  # SGLang's: a hybrid model's running requests its state pool admits
            kv_bytes = model.kv_bytes_per_token(precision.kv_bytes if precision.fp8_kv else 2, opts.tp)
            config = cap_running_requests(config, model, kv_bytes, opts.tp, opts.dp)
        cost_model = profile or roofline_cost_model(model, hw, opts.tp, precision, opts.ep, opts.dp, opts.expert_imbalance)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    hardware = profile.profile.get("hardware") if profile else hw.name
    meta = {"hardware": hardware, "cost_model": cost_model.name}
    return Backend(SimDriver(cost_model, fast_forward=opts.fast_forward), kv_tokens, None, meta), config


def build_real(opts, model: ModelConfig, make_config: Callable[[int], SchedulerConfig]) -> tuple[Backend, SchedulerConfig]:
    if refusal := engine_refusal(model):
        raise ConfigError(real_engine_refusal(refusal))
    from engine.device import DeviceError, choose_device
    from engine.model_runner import EngineConfig, ModelRunner
    from engine.real_driver import RealDriver
    from engine.rope import UnsupportedRopeError
    from engine.weights import WeightLoadError

    try:
        choice = choose_device(opts.device, opts.dtype, opts.attention_backend)
    except DeviceError as e:
        raise ConfigError(str(e)) from None
    if choice.device.type == "cuda":
        _free_earlier_engines()
    folder = model.folder
    load_format = opts.load_format or ("auto" if folder else "dummy")
    if load_format == "auto" and not folder:
        raise ConfigError(
            f"--load-format auto: {model.name} is a bundled config without weights; use --load-format dummy or a model folder"
        )
    engine_cfg = EngineConfig(
        load_format=load_format,
        seed=opts.seed,
        kv_tokens=opts.kv_tokens,
        mem_fraction_static=opts.mem_fraction_static,
        kv_memory_gb=opts.kv_memory_gb,
        cuda_graph=not opts.disable_cuda_graph,
    )
    try:
        runner = ModelRunner(model, choice, engine_cfg, folder)
        kv_tokens = runner.kv_tokens_that_fit()
        config = make_config(kv_tokens)
    except (ValueError, WeightLoadError, UnsupportedRopeError) as e:
        raise ConfigError(str(e)) from None
    runner.init_cache(kv_tokens, config.effective_max_running_requests + 2)
    warm_up_started = time.perf_counter()
    runner.warm_up()
    meta = {
        "hardware": str(choice.device) if choice.device.type == "cpu" else _gpu_name(choice.device),
        "device": choice.reason,
        "attention_backend": choice.attention_backend,
        "cuda_graph": runner.graphs is not None,
        # Graphs captured before the first request, and the warm-up's seconds (they hold it).
        **({"cuda_graphs": len(runner.graphs.graphs)} if runner.graphs is not None else {}),
        "warm_up_s": round(time.perf_counter() - warm_up_started, 2),
        "dtype": str(choice.dtype).removeprefix("torch."),
        "load_format": load_format,
        **({"cpu_threads": _torch_threads()} if choice.device.type == "cpu" else {}),
    }
    return Backend(RealDriver(runner, opts.overlap), kv_tokens, model.vocab_size, meta), config


def real_engine_refusal(refusal: str) -> str:
    """The one line --mode real gives a model the engine cannot build (engine/support.py says why)."""
    return f"--mode real: {refusal}; the real engine builds {BUILT} (simulate it with --mode sim)"


def _free_earlier_engines() -> None:
    """A process that replays more than once (calibrate, the benchmarks) must not hold the last
    engine's weights and KV pool while it builds the next: the engine's objects refer to each
    other, so they wait for the cycle collector, and the pool is sized from free memory.
    On an H100, an 8B model's second replay ran out of memory without this."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


def describe_engine(meta: dict) -> str:
    """The line a real run or a calibration prints first: which device, dtype, backend, weights (from Backend.meta)."""
    graphs = ""
    if meta.get("cuda_graph"):
        graphs = f"; decode batches replay CUDA graphs ({meta.get('cuda_graphs', 0)} captured, {meta.get('warm_up_s', 0):.1f} s)"
    return f"real engine: {meta['device']}; {meta['load_format']} weights{graphs}"


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _gpu_name(device) -> str:
    import torch

    return torch.cuda.get_device_name(device)
