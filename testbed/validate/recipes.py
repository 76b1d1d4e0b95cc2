"""The server settings that measured points ran with, where they differ from the engine's defaults
and the replay can take them: a point is replayed against the server its benchmark ran.

InferenceMAX publishes each sweep's server command (SemiAnalysisAI/InferenceX,
benchmarks/single_node/<model>_<precision>_<gpu>.sh; benchmarks/*_docker.sh before 2026-01), and
changes it over time. Each point's source says the day it was measured (`measured=`), so a point is
replayed with the version of its recipe in force that day (RECIPES: each version from the day its
commit landed). A point measured before its recipe's first version, or one no recipe covers,
runs the engine's defaults.

What the recipes set that the replay takes:
- the KV cache's dtype (`--kv-cache-dtype fp8`: the pool holds twice the tokens, and attention is
  priced from the database's fp8-KV tables);
- SGLang's `--scheduler-recv-interval` (new requests taken in once every N decode steps);
- expert parallelism over the TP GPUs: the experts spread whole over them instead of split across
  them. vLLM's MiniMax recipes on the H200 (from 2026-03-13) and the B200 (until 2026-04-03) turn
  on `--enable-expert-parallel` whenever `EP_SIZE -ge 1`, that is always, though their rows say
  moe_ep_size 1; SGLang's DeepSeek fp4 recipe ran `--enable-ep-moe` until 2025-11-10;
- the parallel layout, where the script ran another than the row's columns say. A sweep config's
  `dp-attn: true` gives its rows attention_dp_size = TP (and moe_ep_size = ep x TP), but only the
  scripts that read DP_ATTENTION run it: MiniMax's fp4 scripts as `--tensor-parallel-size 1
  --data-parallel-size $TP --enable-expert-parallel` (TP GPUs in all); its fp8 scripts and
  Kimi-K2.5's ignore it and run `--tensor-parallel-size $TP` (with expert parallelism where their
  EP rule turns it on: Kimi's never does, whatever the row's moe_ep_size);
- vLLM's CUDA graphs: the largest step captured (`--max-cudagraph-capture-size`) and which
  steps are (`cudagraph_mode`): a step outside a graph pays the host's dispatch;
- vLLM's async scheduling (`--async-scheduling`: the host schedules the next step while the GPU runs
  this one). vLLM turned it on by default in 0.14.0, so a server of an older version without the
  flag, with or without a recipe, ran every step's host work in series with the GPU
  (`vllm_async_off_by_default`);
- the step's token budget (vLLM's `--max-num-batched-tokens`, SGLang's `--chunked-prefill-size`
  and `--max-prefill-tokens`), the running-request cap (`--max-num-seqs`,
  `--max-running-requests`; but see the Blackwell DeepSeek caps below), the memory share (`--gpu-memory-utilization`,
  `--mem-fraction-static`) and vLLM's `--block-size`.
Not taken: stream intervals (how often tokens reach the client, not when they are made), SGLang's
CUDA graph batch sizes (each recipe's is at least its running cap, and SGLang's default for the GPU
and TP, which the simulator captures up to, holds every decode batch of these points), and kernel
backends (the kernel database prices its own: the Hopper gpt-oss scripts' Marlin MXFP4 kernels,
`VLLM_MXFP4_USE_MARLIN=1`, are the database's w4a16 MXFP4 rows only if it measured the same kernel).

A points file's own `scheduler_recv_interval` and `kv_cache_dtype` columns win over the recipe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

from testbed.validate.points import MeasuredPoint


@dataclass(frozen=True)
class ServerRecipe:
    """The flags of a point's server that the replay takes; None: the engine's default."""

    kv_cache_dtype: str = "auto"
    scheduler_recv_interval: int = 1  # SGLang: take in new requests once every N decode steps
    expert_parallel: bool = False  # experts spread whole over the TP GPUs (vLLM --enable-expert-parallel, SGLang --enable-ep-moe)
    max_num_batched_tokens: int | None = None  # vLLM: the tokens of one step
    chunked_prefill_size: int | None = None  # SGLang: the longest prefill chunk
    max_prefill_tokens: int | None = None  # SGLang: the prefill tokens of one step
    max_running_requests: int | None = None  # vLLM --max-num-seqs, SGLang --max-running-requests
    memory_fraction: float | None = None  # vLLM --gpu-memory-utilization, SGLang --mem-fraction-static
    block_size: int | None = None  # vLLM --block-size (KV page)
    max_cudagraph_capture_size: int | None = None  # vLLM: the largest step a CUDA graph replays
    cudagraph_mode: str | None = None  # vLLM's compilation config's cudagraph_mode
    async_scheduling: bool | None = None  # vLLM --async-scheduling (None: the version's default, vllm_async_off_by_default)
    # The layout the script ran where it differs from the row's columns (None: the row's). Set, the
    # experts go over the tp x dp GPUs with expert_parallel, else split over them (no row's moe_ep).
    tensor_parallel: int | None = None  # --tensor-parallel-size
    data_parallel: int | None = None  # vLLM --data-parallel-size: attention DP ranks (with expert parallelism, vLLM's DP attention)
    source: str = ""  # the recipe and its version, e.g. "InferenceX minimaxm2.5_fp8_b200.sh of 2026-04-03"

    def flags(self, backend: str) -> str:
        """The settings the recipe gives, as the engine's flags (empty: the engine's defaults throughout)."""
        names = {
            "kv_cache_dtype": "--kv-cache-dtype",
            "scheduler_recv_interval": "--scheduler-recv-interval",
            "expert_parallel": "--enable-expert-parallel" if backend == "vllm" else "--enable-ep-moe",
            "max_num_batched_tokens": "--max-num-batched-tokens",
            "chunked_prefill_size": "--chunked-prefill-size",
            "max_prefill_tokens": "--max-prefill-tokens",
            "max_running_requests": "--max-num-seqs" if backend == "vllm" else "--max-running-requests",
            "memory_fraction": "--gpu-memory-utilization" if backend == "vllm" else "--mem-fraction-static",
            "block_size": "--block-size",
            "max_cudagraph_capture_size": "--max-cudagraph-capture-size",
            "cudagraph_mode": "--cudagraph-mode",
            "async_scheduling": "--async-scheduling" if self.async_scheduling else "--no-async-scheduling",
            "tensor_parallel": "--tensor-parallel-size" if backend == "vllm" else "--tp-size",
            "data_parallel": "--data-parallel-size" if backend == "vllm" else "--dp-size",
        }
        default = ServerRecipe()
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in names and value != getattr(default, f.name):
                out.append(names[f.name] if isinstance(value, bool) else f"{names[f.name]} {value}")
        return " ".join(out)


Rule = Callable[[MeasuredPoint], ServerRecipe]


@dataclass(frozen=True)
class ParallelLayout:
    """How a point's server spread the model over its GPUs (tp x dp of them)."""

    tp: int  # tensor parallelism of each attention rank
    dp: int  # attention data-parallel ranks
    ep: int  # expert-parallel ranks the routed experts spread over (1: split over every GPU)


def parallel_layout(p: MeasuredPoint, recipe: ServerRecipe) -> ParallelLayout:
    """The layout p ran: its recipe's where the script states one, else its row's (experts over every
    GPU where the recipe turned expert parallelism on)."""
    if recipe.data_parallel is None and recipe.tensor_parallel is None:
        tp, dp = p.tp or 1, p.dp
        return ParallelLayout(tp, dp, tp * dp if recipe.expert_parallel else p.moe_ep)
    tp, dp = recipe.tensor_parallel or p.tp or 1, recipe.data_parallel or 1
    return ParallelLayout(tp, dp, tp * dp if recipe.expert_parallel else 1)


@dataclass(frozen=True)
class RecipeVersion:
    backend: str
    models: tuple[str, ...]  # model_path as the points file says it
    systems: tuple[str, ...]
    precisions: tuple[str, ...]  # the row's precision column
    script: str  # InferenceX's script of this recipe
    since: str  # the day this version's commit landed (YYYY-MM-DD)
    rule: Rule  # the settings it gives a point (some depend on TP, clients and lengths)


def _sglang_clients_interval(p: MeasuredPoint) -> int:
    # `if [[ $CONC -ge 16 ]]; then SCHEDULER_RECV_INTERVAL=30 else 10`
    return 30 if (p.concurrency or 1) >= 16 else 10


# The Blackwell DeepSeek scripts also pass --max-running-requests (TP 8: 128, TP 4: 32, fp4: 256),
# which their points contradict: past that many clients the measured TPOT keeps growing (TP 8, 1,024
# in and out: 28.7 ms at 128 clients, 42.6 at 256, 68.8 at 512), as a decode batch does that keeps
# growing, and at 256 clients the mean TTFT is 2.1 s where a 128-request cap would hold half the
# clients back for a whole request (about 40 s). A cap the points show the server did not keep is
# not replayed (replayed, it made those TTFTs 10-100x the measured ones).


def _dsr1_fp8_blackwell(p: MeasuredPoint) -> ServerRecipe:
    """dsr1_fp8_b200/b300: TP 8 polls every 30 steps from 16 clients (else 10), 32,768-token chunks;
    TP 4 (8,192/1,024 only) every 10, 8,192-token chunks."""
    if p.tp == 4:
        return ServerRecipe("fp8", 10, chunked_prefill_size=8192, max_prefill_tokens=8192, memory_fraction=0.95)
    return ServerRecipe("fp8", _sglang_clients_interval(p), chunked_prefill_size=32768, max_prefill_tokens=32768, memory_fraction=0.82)


def _dsr1_fp8_b200_2025(p: MeasuredPoint) -> ServerRecipe:
    """dsr1_fp8_b200_docker.sh until 2026-01-13: the TP-8 settings at every TP."""
    return ServerRecipe("fp8", _sglang_clients_interval(p), chunked_prefill_size=32768, max_prefill_tokens=32768, memory_fraction=0.82)


def _dsr1_fp4_blackwell(ep_moe: bool) -> Rule:
    """dsr1_fp4_b200/b300 (and the docker script before them): 16,384-token chunks (and SGLang's
    default --max-prefill-tokens, 16,384). Until 2025-11-10 it ran `--enable-ep-moe` (experts over
    every TP GPU), then `--ep-size $EP_SIZE` (the row's)."""
    return lambda p: ServerRecipe("fp8", _sglang_clients_interval(p), ep_moe, chunked_prefill_size=16384, memory_fraction=0.85)


def _dsr1_fp8_h200(p: MeasuredPoint) -> ServerRecipe:
    """dsr1_fp8_h200.sh: 512 running requests at 1,024/1,024, else 256; 32,768-token chunks."""
    running = 512 if (p.isl, p.osl) == (1024, 1024) else 256
    return ServerRecipe(chunked_prefill_size=32768, max_prefill_tokens=32768, max_running_requests=running, memory_fraction=0.82)


def _minimax_vllm_first(memory: float, expert_parallel: bool, block: int | None) -> Rule:
    """minimaxm2.5_fp8 on H200/B200 before their 2026-04 upgrades: `EP_SIZE -ge 1` turns expert
    parallelism on for every row."""
    return lambda p: ServerRecipe(expert_parallel=expert_parallel, memory_fraction=memory, block_size=block)


def _tp_layout(p: MeasuredPoint) -> dict:
    """A script that ignores DP_ATTENTION: a `dp-attn` row ran plain `--tensor-parallel-size $TP`."""
    return {"tensor_parallel": p.tp, "data_parallel": 1} if p.attention_dp > 1 else {}


def _minimax_vllm_blackwell(block: int | None, dp_attention: bool) -> Rule:
    """minimaxm2.5 on B200/B300 from 2026-04: an fp8 KV cache, a step of twice the prompt, and CUDA
    graphs for steps of up to 2,048 tokens. The fp4 scripts (dp_attention) run a `dp-attn` row as
    `-tp 1 -dp $TP --enable-expert-parallel`; the fp8 ones ignore DP_ATTENTION."""

    def rule(p: MeasuredPoint) -> ServerRecipe:
        if dp_attention and p.attention_dp > 1:
            layout = {"tensor_parallel": 1, "data_parallel": p.tp}
        else:
            layout = _tp_layout(p)
        return ServerRecipe(
            "fp8",
            expert_parallel=p.moe_ep > 1,
            max_num_batched_tokens=2 * p.isl,
            memory_fraction=0.90,
            block_size=block,
            max_cudagraph_capture_size=2048,
            **layout,
        )

    return rule


def _minimax_vllm_h100(p: MeasuredPoint) -> ServerRecipe:
    """minimaxm2.5_fp8_h100.sh: 256 running requests, piecewise CUDA graphs, expert parallelism where
    `EP_SIZE -gt 1`; DP_ATTENTION ignored."""
    return ServerRecipe(expert_parallel=p.moe_ep > 1, max_running_requests=256, cudagraph_mode="PIECEWISE", **_tp_layout(p))


def _kimi_vllm(fp8_kv: bool) -> Rule:
    """kimik2.5_fp4_b200/b300: `--tensor-parallel-size $TP` alone (no expert parallelism, whatever the
    row's moe_ep_size; DP_ATTENTION ignored), running cap the clients; the B200's from 2026-04-20 an
    fp8 KV cache, a step of twice the prompt and CUDA graphs up to 2,048 tokens."""

    def rule(p: MeasuredPoint) -> ServerRecipe:
        layout = {"tensor_parallel": p.tp, "data_parallel": 1}
        if not fp8_kv:
            return ServerRecipe(max_running_requests=p.concurrency, **layout)
        return ServerRecipe(
            "fp8", max_running_requests=p.concurrency, max_num_batched_tokens=2 * p.isl, max_cudagraph_capture_size=2048, **layout
        )

    return rule


def _llama70b_vllm(p: MeasuredPoint) -> ServerRecipe:
    """70b_fp8_{h100,h200,b200} and 70b_fp4_b200 (until the model left on 2025-10-29): an fp8 KV
    cache; their 8,192-token steps, 0.9 memory share and running caps (the clients, or 512) are
    vLLM's defaults in effect. The B200 recipes capture CUDA graphs of decode-only steps alone
    (`"cudagraph_mode": "FULL_DECODE_ONLY"`). Their configs pass `async-scheduling: true` (from each
    script's second version, 2025-09-15 to 09-23, on)."""
    return ServerRecipe("fp8", cudagraph_mode="FULL_DECODE_ONLY" if p.system == "b200_sxm" else None, async_scheduling=True)


def _glm5_fp8_b200(p: MeasuredPoint) -> ServerRecipe:
    """glm5_fp8_b200.sh: an fp8 KV cache, 32,768-token chunks and prefill steps, as many running requests
    as clients, 0.85 of the memory."""
    return ServerRecipe(
        "fp8", chunked_prefill_size=32768, max_prefill_tokens=32768, max_running_requests=p.concurrency, memory_fraction=0.85
    )


def _gptoss_vllm(p: MeasuredPoint) -> ServerRecipe:
    """gptoss_fp4_{h100,h200,b200} (the same settings in the docker and slurm scripts from 2025-09 and
    the single_node ones from 2026-02): 8,192-token steps, CUDA graphs up to 2,048 tokens, 0.9 of the
    memory, async scheduling (`async-scheduling: true` in the docker and slurm scripts' configs from
    their second versions, 2025-09-15 to 09-24; vLLM 0.14's default under the single_node scripts);
    the Hopper scripts cap the running requests at the clients, the B200's at 512 with an fp8 KV cache."""
    settings = {"max_num_batched_tokens": 8192, "memory_fraction": 0.9, "max_cudagraph_capture_size": 2048, "async_scheduling": True}
    if p.system == "b200_sxm":
        return ServerRecipe("fp8", max_running_requests=512, **settings)
    return ServerRecipe(max_running_requests=p.concurrency, **settings)


DEEPSEEK = ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3")  # the db-dump labels rows of the dsr1 sweeps either way
MINIMAX = ("MiniMaxAI/MiniMax-M2.5",)
KIMI = ("moonshotai/Kimi-K2.5",)
GLM5 = ("zhipuai/GLM-5",)
LLAMA_70B = ("meta-llama/Llama-3.1-70B",)
GPT_OSS = ("openai/gpt-oss-120b",)
BLACKWELL = ("b200_sxm", "b300_sxm")
RECIPES = (
    RecipeVersion("vllm", LLAMA_70B, ("h100_sxm", "h200_sxm", "b200_sxm"), ("fp8", "fp4"), "70b_*_docker.sh", "2025-09-12", _llama70b_vllm),
    RecipeVersion("sglang", DEEPSEEK, ("b200_sxm",), ("fp8",), "dsr1_fp8_b200_docker.sh", "2025-11-10", _dsr1_fp8_b200_2025),
    RecipeVersion("sglang", DEEPSEEK, BLACKWELL, ("fp8",), "dsr1_fp8_b200.sh / dsr1_fp8_b300.sh", "2026-01-13", _dsr1_fp8_blackwell),
    RecipeVersion("sglang", DEEPSEEK, BLACKWELL, ("fp4",), "dsr1_fp4_b200_docker.sh", "2025-10-01", _dsr1_fp4_blackwell(ep_moe=True)),
    RecipeVersion(
        "sglang", DEEPSEEK, BLACKWELL, ("fp4",), "dsr1_fp4_b200.sh / dsr1_fp4_b300.sh", "2025-11-10", _dsr1_fp4_blackwell(ep_moe=False)
    ),
    RecipeVersion("sglang", DEEPSEEK, ("h200_sxm",), ("fp8",), "dsr1_fp8_h200.sh", "2026-03-06", _dsr1_fp8_h200),
    RecipeVersion(
        "vllm",
        MINIMAX,
        ("h100_sxm",),
        ("fp8",),
        "minimaxm2.5_fp8_h100.sh",
        "2026-03-02",
        _minimax_vllm_h100,
    ),
    RecipeVersion(
        "vllm", MINIMAX, ("h200_sxm",), ("fp8",), "minimaxm2.5_fp8_h200.sh", "2026-03-01", _minimax_vllm_first(0.95, False, None)
    ),
    RecipeVersion("vllm", MINIMAX, ("h200_sxm",), ("fp8",), "minimaxm2.5_fp8_h200.sh", "2026-03-13", _minimax_vllm_first(0.95, True, None)),
    RecipeVersion("vllm", MINIMAX, ("b200_sxm",), ("fp8",), "minimaxm2.5_fp8_b200.sh", "2026-03-11", _minimax_vllm_first(0.95, True, 32)),
    RecipeVersion("vllm", MINIMAX, ("b200_sxm",), ("fp8",), "minimaxm2.5_fp8_b200.sh", "2026-04-03", _minimax_vllm_blackwell(32, False)),
    RecipeVersion("vllm", MINIMAX, ("b300_sxm",), ("fp8",), "minimaxm2.5_fp8_b300.sh", "2026-04-17", _minimax_vllm_blackwell(32, False)),
    RecipeVersion("vllm", MINIMAX, ("b200_sxm",), ("fp4",), "minimaxm2.5_fp4_b200.sh", "2026-04-08", _minimax_vllm_blackwell(None, True)),
    RecipeVersion("vllm", MINIMAX, ("b300_sxm",), ("fp4",), "minimaxm2.5_fp4_b300.sh", "2026-04-17", _minimax_vllm_blackwell(None, True)),
    RecipeVersion("sglang", GLM5, ("h200_sxm",), ("fp8",), "glm5_fp8_h200.sh", "2026-03-18", lambda p: ServerRecipe(memory_fraction=0.85)),
    RecipeVersion("sglang", GLM5, ("b200_sxm",), ("fp8",), "glm5_fp8_b200.sh", "2026-03-20", _glm5_fp8_b200),
    RecipeVersion("vllm", KIMI, ("b200_sxm",), ("fp4",), "kimik2.5_fp4_b200.sh", "2026-03-11", _kimi_vllm(fp8_kv=False)),
    RecipeVersion("vllm", KIMI, ("b200_sxm",), ("fp4",), "kimik2.5_fp4_b200.sh", "2026-04-20", _kimi_vllm(fp8_kv=True)),
    RecipeVersion("vllm", KIMI, ("b300_sxm",), ("fp4",), "kimik2.5_fp4_b300.sh", "2026-04-17", _kimi_vllm(fp8_kv=False)),
    RecipeVersion(
        "vllm", GPT_OSS, ("h100_sxm", "h200_sxm"), ("fp4",), "gptoss_fp4_h100/h200 (docker, slurm, single_node)", "2025-09-12", _gptoss_vllm
    ),
    RecipeVersion("vllm", GPT_OSS, ("b200_sxm",), ("fp4",), "gptoss_fp4_b200 (docker, single_node)", "2025-09-21", _gptoss_vllm),
)


def recipe_version(p: MeasuredPoint, harness: str) -> RecipeVersion | None:
    """The version of InferenceMAX's recipe that p ran (the latest landed on or before the day it was measured);
    None for another client's points, a point measured before its recipe's first version, or one no recipe covers."""
    if harness != "inferencemax":
        return None
    found = None
    for v in RECIPES:
        if p.backend == v.backend and p.model_path in v.models and p.system in v.systems and p.precision in v.precisions:
            if p.measured_on is None or v.since <= p.measured_on:  # an undated point: the latest version
                if found is None or v.since > found.since:
                    found = v
    return found


VLLM_ASYNC_SCHEDULING_BY_DEFAULT = (0, 14)  # vLLM 0.14.0 turned async scheduling on by default (off in 0.12 and 0.13's SchedulerConfig)


def vllm_async_off_by_default(version: str | None) -> bool:
    """Whether a vLLM server of `version` ran without async scheduling unless its flags asked for it:
    a release before 0.14 (an unknown version or a nightly: the newest behaviour, on)."""
    numbers = (version or "").split(".")[:2]
    if len(numbers) < 2 or not all(n.isdigit() for n in numbers):
        return False
    return (int(numbers[0]), int(numbers[1])) < VLLM_ASYNC_SCHEDULING_BY_DEFAULT


def server_recipe(p: MeasuredPoint, harness: str) -> ServerRecipe:
    """The server settings p is replayed with: its recipe's, with the points file's columns winning,
    and vLLM's async scheduling as its version ran it where no recipe sets it."""
    v = recipe_version(p, harness)
    recipe = ServerRecipe() if v is None else replace(v.rule(p), source=f"InferenceX {v.script} of {v.since}")
    if p.backend == "vllm" and recipe.async_scheduling is None and vllm_async_off_by_default(p.backend_version):
        recipe = replace(recipe, async_scheduling=False)
    if p.scheduler_recv_interval is not None:
        recipe = replace(recipe, scheduler_recv_interval=p.scheduler_recv_interval)
    if p.kv_cache_dtype is not None:
        recipe = replace(recipe, kv_cache_dtype=p.kv_cache_dtype)
    return recipe
