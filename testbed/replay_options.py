"""The options of one replay (ReplayOptions) and the defaults that depend on the machine.

What a replay runs with, as run.json records it once resolved. The command-line flags, their
checks and parsing are in options.py; what each scheduler makes of its options, in schedulers/.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_CPU_MODEL = "tiny-llama"  # what --mode real runs without a GPU
DEFAULT_HARDWARE = "h100"
MODES = ("sim", "real", "server")


@dataclass(frozen=True)
class ReplayOptions:
    mode: str = "sim"
    policy: str = "fcfs"
    chunked_prefill_size: int | None = None  # None: SGLang's default for the device memory
    max_prefill_tokens: int = 16384
    page_size: int | None = None  # None: 1 for sglang, 16 for vllm (its block size)
    kv_tokens: int | None = None  # None: from the model and the device memory
    mem_fraction_static: float | None = None  # None: SGLang's default for the device memory
    # None: on, except for the real engine on a CPU, where the forward on a worker thread
    # competes with the loop for the cores (the example trace's TPOT was 3.8x worse).
    overlap: bool | None = None
    disable_radix_cache: bool = False
    max_running_requests: int | None = None
    model: str | None = None  # None: llama-3.1-8b, or tiny-llama for --mode real on a CPU
    # A hardware spec (simulator/hardware/specs.py). None: h100 (or a profile's own) for the simulator,
    # the spec of the device it runs on for the real engine (cpu, or the GPU's). See default_hardware.
    hardware: str | None = None
    time_scale: float = 1.0  # arrival times are multiplied by this: 2 = half the load
    max_requests: int | None = None
    seed: int = 0
    format: str | None = None
    rate: float | None = None  # arrivals for traces without them (ShareGPT lengths)
    # The real engine.
    load_format: str | None = None  # auto | dummy; None: auto for a model folder, dummy for a bundled config
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on the CPU
    attention_backend: str = "auto"  # auto | torch | flashinfer
    disable_cuda_graph: bool = False  # CUDA: decode batches run eagerly (engine/cuda_graph.py)
    kv_memory_gb: float = 1.0  # CPU: KV cache budget when --kv-tokens is not given
    # The simulator: a calibrated profile (testbed calibrate) instead of the roofline.
    profile: str | None = None
    # Tensor parallelism over this many GPUs (the simulator; the real engine runs on one).
    tp: int = 1
    # The simulator: fp8 weights (--quantization fp8) and KV cache (--kv-cache-dtype auto|bf16|fp8);
    # None and auto: the model's dtype (simulator/costs/precision.py).
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    # Which scheduler runs; the vLLM scheduler's budgets (None: vLLM's defaults).
    scheduler: str = "sglang"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    # vLLM's CUDA graphs: the largest step a graph is captured for (None: min(2 x max_num_seqs, 512))
    # and which steps get one (None: FULL_AND_PIECEWISE, every step up to that size).
    max_cudagraph_capture_size: int | None = None
    cudagraph_mode: str | None = None
    # SGLang's scheduling options, as SGLang names them.
    enable_mixed_chunk: bool = False  # decodes ride along in a prefill batch
    enable_priority_scheduling: bool = False  # waiting queue by priority; preemption of running requests
    priority_scheduling_preemption_threshold: int = 10  # priority gap a preemption needs
    schedule_conservativeness: float = 1.0  # scales the decode estimate (new_token_ratio)
    scheduler_recv_interval: int = 1  # new requests taken in once every N decode steps
    # The simulator takes decode stretches at once (equal results); off steps one by one.
    fast_forward: bool = True
    # Closed loop: this many clients, each sending its next request (in trace order) when its last
    # one is done; the trace's arrival times are not used (scheduler/loop/arrivals.py). None: open loop.
    concurrency: int | None = None
    # A live OpenAI-compatible server (--mode server, testbed/live/): its address, the endpoint the
    # requests go to, the model name they give (None: the server's first), a request's time limit.
    url: str | None = None
    endpoint: str = "completions"
    served_model: str | None = None
    request_timeout: float | None = None
    # A cluster (simulator/cluster/): this many replicas of the instance behind a router, its policy,
    # how stale its view of the instances is and how long a request takes to reach one, and the
    # policies' knobs (cache-aware: SGLang's router's; weighted: its scorers' weights).
    replicas: int = 1
    router: str = "round-robin"
    router_refresh_ms: float = 0.0
    router_latency_ms: float = 0.0
    router_weights: str | None = None
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.0001
    # Prefill/decode disaggregation (simulator/cluster/pd.py), instead of replicas: this many
    # prefill and decode instances (both, or neither), and the link the KV crosses
    # (simulator/cluster/kv_link.py: nvlink, rdma, tcp or GBPS,LATENCY_US).
    prefill_replicas: int | None = None
    decode_replicas: int | None = None
    kv_link: str = "rdma"
    # A mixture of experts (simulator/costs/moe_roofline.py): expert parallelism over ep
    # of the tp x dp GPUs, attention data parallelism over dp ranks (with enable_dp_attention, as
    # SGLang names it), the experts' load (None: balanced; ALPHA: AIConfigurator's power law).
    ep: int = 1
    dp: int = 1
    enable_dp_attention: bool = False
    expert_imbalance: float | None = None

    @property
    def disaggregated(self) -> bool:
        return self.prefill_replicas is not None and self.decode_replicas is not None


OPTION_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ReplayOptions))


def recorded_options(opts: ReplayOptions) -> dict:
    """The options as run.json and a sweep's table record them: every field."""
    return asdict(opts)


# --- defaults that depend on the machine ------------------------------------------------------


def _real_on_cuda(opts: ReplayOptions) -> bool:
    if opts.device != "auto":
        return opts.device == "cuda"
    import torch

    return torch.cuda.is_available()


def default_overlap(opts: ReplayOptions) -> bool:
    """On, but for the real engine on a CPU; a simulation from a profile takes the default of the
    engine it measured (a CPU profile: off), so that it replays what a real run there does."""
    if opts.overlap is not None:
        return opts.overlap
    if opts.mode == "real":
        return _real_on_cuda(opts)
    if opts.profile is not None:
        from simulator.costs.profile_cost import engine_defaults

        return bool(engine_defaults(opts.profile).get("overlap", True))
    return True


def default_hardware(opts: ReplayOptions) -> str | None:
    """The real engine: the spec of its device (cpu; h100, h200, a100 by the GPU's name; None for
    another GPU). The simulator: the spec a profile was calibrated on, else h100."""
    if opts.hardware is not None:
        return opts.hardware
    from simulator.hardware.specs import bundled_hardware_names, hardware_of_device

    if opts.mode == "real":
        if not _real_on_cuda(opts):
            return "cpu"
        import torch

        return hardware_of_device(torch.cuda.get_device_name(0))
    if opts.profile is not None:
        from simulator.costs.profile_cost import engine_defaults

        calibrated_on = engine_defaults(opts.profile).get("hardware")
        if calibrated_on in bundled_hardware_names() or (isinstance(calibrated_on, str) and Path(calibrated_on).is_file()):
            return calibrated_on
    return DEFAULT_HARDWARE


def default_model(mode: str) -> str:
    if mode == "real":
        import torch

        return DEFAULT_MODEL if torch.cuda.is_available() else DEFAULT_CPU_MODEL
    return DEFAULT_MODEL


def _simulated_device(opts: ReplayOptions, fact: str) -> int | None:
    """A fact of the GPU a simulation runs on (memory_bytes, sm_version): a kernel profile's GPU's,
    else the hardware spec's; None where the spec does not load (the replay reports it)."""
    from simulator.hardware.specs import HardwareConfigError, load_hardware

    if opts.profile is not None:
        from simulator.costs.profile_cost import engine_defaults

        value = engine_defaults(opts.profile).get(fact)
        if isinstance(value, int):
            return value
    try:
        return getattr(load_hardware(default_hardware(opts)), fact)
    except HardwareConfigError:
        return None


def device_sm_version(opts: ReplayOptions) -> int:
    """The compute capability (major x 10 + minor) of the GPU the replay runs on, which some of
    SGLang's defaults follow: a kernel profile's GPU or the hardware spec's (sim), the device's
    (real); 0 where unknown or on a CPU."""
    if opts.mode == "sim":
        return _simulated_device(opts, "sm_version") or 0
    import torch

    if opts.device != "cpu" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        return 10 * major + minor
    return 0


def device_memory_bytes(opts: ReplayOptions) -> int | None:
    """The memory of the device the replay runs on, which SGLang's defaults follow: a kernel
    profile's GPU or the hardware spec's (sim), the GPU's, or the host's on a CPU (as SGLang on
    a CPU device)."""
    if opts.mode == "sim":
        return _simulated_device(opts, "memory_bytes")
    import torch

    if opts.device != "cpu" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def flag(name: str) -> str:
    """The command-line flag of a ReplayOptions field: chunked_prefill_size -> --chunked-prefill-size."""
    return "--" + name.replace("_", "-")
