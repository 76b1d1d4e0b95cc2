"""AIConfigurator's own estimate of one aggregated ("agg") serving point: the anchor to beat.

`testbed validate` sets the simulator's TTFT/TPOT beside the measured points of AIConfigurator's
``systems/silicon_sample.csv``; this module computes, for the same point, what AIConfigurator
itself predicts, the way its ``aiconfigurator cli estimate --mode agg`` (``cli_estimate`` in the
upper ``aiconfigurator`` package, which its ``tools/accuracy_regression_testing/
predict_silicon_sample.py`` calls on every row of that file) does it, with only the core SDK
(``aiconfigurator-core``) that this project installs:

1. the perf database of (system, backend, version): ``perf_database.get_database_view(...,
   database_mode="SILICON")``;
2. a ``ModelConfig`` (``config_builders.build_model_config``: TP, PP, attention DP, MoE TP/EP,
   quant modes), then the CLI's three resolvers: context-FMHA dtype by the data the database has,
   DeepSeek-V4/Kimi-K3 MoE lanes, nvfp4 -> nvfp4_wo on non-Blackwell GPUs;
3. ``models.get_model(model_path, model_config, backend)``: the model's op lists;
4. ``backend.run_agg(model, db, RuntimeConfig(isl, osl, batch_size), ctx_tokens=isl)``: a
   mean-field continuous-batching model. It prices two kinds of forward pass with the compiled
   engine over the measured kernels (one "mix" step: ``ctx_tokens`` prompt tokens plus the other
   requests' decode tokens; one decode-only step of ``batch_size`` tokens), counts how many of each
   a request's life takes, and derives TTFT = (prefill step x ceil(isl / ctx_tokens) + a
   per-backend dispatch overhead) x a per-backend queueing factor, TPOT = the step-weighted mean
   of the mix and decode-only steps. A batch whose weights + activations + full-length KV cache
   exceed the GPU's memory is the CLI's OOM error (EstimateUnavailable here); one past the engine's
   KV budget (vLLM's gpu_memory_utilization, SGLang's mem_fraction_static) is only flagged
   (``AicEstimate.kv_cache_oom``), as the CLI only warns.

Speculative decoding (``nextn``) is off, as in the CLI's default.

Nothing here imports ``aiconfigurator_core`` at module import. Databases, models and results are
cached per process: the first estimate on a (system, backend, version) loads its database (2-5 s
on a 2-core machine); a new point then takes about 0.3 ms, a repeated one microseconds.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from testbed.validate.aiconfigurator_sdk import (  # noqa: F401 - EstimateUnavailable, resolve_database_version re-exported
    EXTRA_HINT,
    EstimateUnavailable,
    database,
    first_line,
    memo,
    resolve_database_version,
    sdk,
    supported,
)

__all__ = [
    "AicEstimate",
    "EstimateUnavailable",
    "MODEL_ALIASES",
    "aiconfigurator_estimate",
    "estimate_of",
    "resolve_database_version",
]


# Hugging Face names of checkpoints whose config.json AIConfigurator's bundled registry holds under
# another name (it would download these from the Hub, which `testbed validate` must not need). Each
# alias has the same architecture (layers, widths, heads, vocabulary); the quantization the point
# ran with is passed explicitly (gemm/moe quant), so only the shapes come from the alias.
MODEL_ALIASES: dict[str, str] = {
    # meta-llama renamed its Llama 3.1 repositories (Meta-Llama-3.1-* -> Llama-3.1-*); Instruct
    # differs from the base only in its eos tokens.
    "meta-llama/Llama-3.1-8B": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-405B": "meta-llama/Meta-Llama-3.1-405B",
    "meta-llama/Llama-3.1-405B-Instruct": "meta-llama/Meta-Llama-3.1-405B",
    # NVIDIA's ModelOpt quantizations of the same models.
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
    "nvidia/DeepSeek-R1-NVFP4": "nvidia/DeepSeek-V3.1-NVFP4",
    # Zhipu's organisation moved to zai-org.
    "zhipuai/GLM-5": "zai-org/GLM-5",
}

# The quant spellings measured points use, onto AIConfigurator's enum names.
_QUANT_SYNONYMS = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp4": "nvfp4"}


@dataclass(frozen=True)
class AicEstimate:
    """AIConfigurator's prediction of one agg point (milliseconds), and what it was computed with."""

    ttft_ms: float
    tpot_ms: float
    database_version: str  # the perf database version used (the point's own, or the nearest maintained)
    requested_version: str | None = None  # the backend version the point names
    model: str = ""  # the registry entry whose config.json gave the shapes (an alias of the point's model)
    batch_size: int = 0  # run_agg's batch: concurrent requests per attention-DP rank
    quant: str = ""  # the resolved modes: "gemm=fp8 moe=bfloat16 kv=bfloat16 fmha=bfloat16"
    kv_cache_oom: bool = False  # AIConfigurator's memory model says the batch exceeds its KV cache

    @property
    def version_exact(self) -> bool:
        return self.requested_version == self.database_version


# --------------------------------------------------------------------------- models


@memo
def _registry_model(model_path: str, allow_download: bool) -> str:
    """The name AIConfigurator's registry knows `model_path` by (itself, or an alias), or a local dir."""
    from aiconfigurator_core.sdk.common import DefaultHFModels

    if model_path in DefaultHFModels or os.path.isdir(model_path):
        return model_path
    alias = MODEL_ALIASES.get(model_path)
    if alias is not None and alias in DefaultHFModels:
        return alias
    if allow_download:
        return model_path
    raise EstimateUnavailable(
        f"model {model_path!r} is not in AIConfigurator's bundled model registry (it would download its config from the Hugging Face Hub)"
    )


@memo
def _is_moe(registry_name: str) -> bool:
    try:
        return bool(sdk().check_is_moe(registry_name))
    except Exception as e:  # a config the SDK cannot parse
        raise EstimateUnavailable(f"{registry_name}: AIConfigurator cannot read its config: {first_line(e)}") from None


def _quant(enum, value: str | None, what: str):
    """A quant mode's enum name, or None for the checkpoint's own; EstimateUnavailable if unknown."""
    if value is None:
        return None
    text = str(value).strip()
    if not text or text.lower() in ("nan", "none"):
        return None
    text = _QUANT_SYNONYMS.get(text.lower(), text)
    if text not in enum.__members__:
        raise EstimateUnavailable(f"unknown {what} quant mode {value!r} (AIConfigurator has: {', '.join(enum.__members__)})")
    return text


@memo
def _model_and_backend(
    system: str,
    backend: str,
    version: str,
    registry_name: str,
    tp: int,
    pp: int,
    attention_dp: int,
    moe_tp: int | None,
    moe_ep: int | None,
    gemm: str | None,
    moe: str | None,
    kv: str | None,
    fmha: str | None,
):
    """The model built as the CLI builds it, and a backend of its own (run_agg caches results per
    backend instance, keyed by isl/osl/batch/ctx tokens only: one instance per model and database)."""
    the_sdk = sdk()
    db = database(system, backend, version)
    try:
        if _is_moe(registry_name):
            if moe_tp is None and moe_ep is None:
                raise EstimateUnavailable(f"{registry_name} is a MoE model: give moe_tp or moe_ep")
            cfg = the_sdk.build_model_config(tp, pp, attention_dp, moe_tp, moe_ep)
            moe_tp, moe_ep = cfg.resolve_moe_parallelism()
        mc = the_sdk.build_model_config(
            tp, pp, attention_dp, moe_tp, moe_ep, gemm_quant_mode=gemm, kvcache_quant_mode=kv, fmha_quant_mode=fmha, moe_quant_mode=moe
        )
        mc.nextn = 0
        the_sdk.resolve_context_fmha_by_data(mc, registry_name, db, backend, is_context_role=True)
        the_sdk.resolve_dsv4_moe_arch(mc, registry_name, system_name=system, backend_name=backend)
        the_sdk.resolve_nvfp4_for_system(mc, system, registry_name)
        model = the_sdk.get_model(registry_name, mc, backend)
    except EstimateUnavailable:
        raise
    except Exception as e:
        raise EstimateUnavailable(f"{registry_name} on {system}/{backend} {version}: the model did not build: {first_line(e)}") from None
    c = model.config
    fields = (("gemm", "gemm_quant_mode"), ("moe", "moe_quant_mode"), ("kv", "kvcache_quant_mode"), ("fmha", "fmha_quant_mode"))
    quant = " ".join(
        f"{k}={getattr(c, a).name}" for k, a in fields if getattr(c, a, None) is not None and (k != "moe" or _is_moe(registry_name))
    )
    return model, the_sdk.get_backend(backend), quant


# --------------------------------------------------------------------------- the estimate


def aiconfigurator_estimate(
    system: str,
    backend: str,
    backend_version: str | None,
    model_path: str,
    isl: int,
    osl: int,
    concurrency: int,
    tp: int,
    gemm_quant: str | None,
    kv_cache_quant: str | None = None,
    *,
    pp: int = 1,
    attention_dp: int = 1,
    moe_tp: int | None = None,
    moe_ep: int | None = None,
    moe_quant: str | None = None,
    fmha_quant: str | None = None,
    ctx_tokens: int | None = None,
    allow_download: bool = False,
) -> AicEstimate:
    """AIConfigurator's TTFT/TPOT for an agg worker serving `concurrency` requests at a time.

    system / backend: the database's names (h200_sxm, vllm|sglang|trtllm). backend_version: the
    measured engine's version; the nearest the database maintains is used where it lacks it (see
    resolve_database_version; the result says which). concurrency: client concurrency of one worker;
    AIConfigurator's batch is per attention-DP rank, so it gets ceil(concurrency / (attention_dp x
    pp)). gemm_quant / moe_quant / kv_cache_quant / fmha_quant: AIConfigurator's mode names (fp8,
    fp8_block, nvfp4, ...; bf16 accepted), None for the checkpoint's own. moe_tp / moe_ep: MoE models
    only (one may be None: it is inferred). ctx_tokens: the scheduler's prefill token budget per step
    (default isl, as the CLI's). allow_download: let the SDK fetch a model's config from the Hugging
    Face Hub when neither its registry nor MODEL_ALIASES has it (off: raise instead).

    Raises EstimateUnavailable with a one-line reason when it cannot estimate the point."""
    the_sdk = sdk()
    common = the_sdk.common
    isl, osl, concurrency, tp, pp, attention_dp = (int(x) for x in (isl, osl, concurrency, tp, pp, attention_dp))
    if isl <= 0 or osl <= 0 or concurrency <= 0 or tp <= 0 or pp <= 0 or attention_dp <= 0:
        raise EstimateUnavailable(
            f"isl, osl, concurrency, tp, pp and attention_dp must be positive (got {isl}, {osl}, {concurrency}, {tp}, {pp}, {attention_dp})"
        )
    try:
        common.BackendName[backend]
    except KeyError:
        raise EstimateUnavailable(
            f"unknown backend {backend!r} (AIConfigurator has: {', '.join(b.name for b in common.BackendName)})"
        ) from None
    version = resolve_database_version(system, backend, backend_version)
    gemm = _quant(common.GEMMQuantMode, gemm_quant, "gemm")
    moe = _quant(common.MoEQuantMode, moe_quant, "moe")
    kv = _quant(common.KVCacheQuantMode, kv_cache_quant, "kv cache")
    fmha = _quant(common.FMHAQuantMode, fmha_quant, "fmha")
    registry_name = _registry_model(model_path, allow_download)
    if _is_moe(registry_name):
        moe_tp = None if moe_tp is None else int(moe_tp)
        moe_ep = None if moe_ep is None else int(moe_ep)
    else:  # MoE settings mean nothing to a dense model: one cache entry whatever the row says
        moe_tp = moe_ep = moe = None
    batch = max(1, math.ceil(concurrency / (attention_dp * pp)))
    ctx = int(ctx_tokens) if ctx_tokens else isl
    ttft, tpot, kv_oom, quant = _run_agg(
        system, backend, version, registry_name, isl, osl, batch, ctx, tp, pp, attention_dp, moe_tp, moe_ep, gemm, moe, kv, fmha
    )
    return AicEstimate(ttft, tpot, version, None if backend_version is None else str(backend_version), registry_name, batch, quant, kv_oom)


@memo
def _run_agg(
    system, backend, version, registry_name, isl, osl, batch, ctx, tp, pp, attention_dp, moe_tp, moe_ep, gemm, moe, kv, fmha
) -> tuple[float, float, bool, str]:
    the_sdk = sdk()
    db = database(system, backend, version)
    model, be, quant = _model_and_backend(
        system, backend, version, registry_name, tp, pp, attention_dp, moe_tp, moe_ep, gemm, moe, kv, fmha
    )
    where = f"{registry_name} tp{tp} on {system}/{backend} {version}"
    try:
        summary = be.run_agg(
            model,
            db,
            the_sdk.RuntimeConfig(isl=isl, osl=osl, batch_size=batch),
            ctx_tokens=ctx,
            max_seq_len=None,
            free_gpu_memory_fraction=None,
        )
    except Exception as e:  # missing kernel data (a quant mode never measured there), interpolation out of range
        raise EstimateUnavailable(f"{where}: {type(e).__name__}: {first_line(e)}") from None
    if summary.check_oom():  # the CLI's "OOM" error: weights + activations + the batch's full KV cache
        mem = summary.get_memory() or {}
        cap = db.system_spec["gpu"]["mem_capacity"] / (1 << 30)
        raise EstimateUnavailable(
            f"{where} batch {batch}: out of memory by AIConfigurator's memory model: {float(mem.get('total', 0)):.0f} GiB "
            f"(weights {float(mem.get('weights', 0)):.0f}, KV cache {float(mem.get('kvcache', 0)):.0f}) > {cap:.0f} GiB"
        )
    result = summary.get_result_dict()
    if not result:
        raise EstimateUnavailable(f"{where}: the estimate produced no result")
    ttft, tpot = float(result["ttft"]), float(result["tpot"])
    if not (math.isfinite(ttft) and math.isfinite(tpot)) or ttft <= 0 or (osl > 1 and tpot <= 0):
        raise EstimateUnavailable(f"{where}: a non-positive or non-finite estimate (ttft={ttft}, tpot={tpot})")
    return ttft, tpot, bool(summary.check_kv_cache_oom()), quant


def estimate_of(p) -> AicEstimate:
    """AIConfigurator's estimate of a MeasuredPoint (testbed/validate/points.py, which reads the rows):
    the inputs its own predict_silicon_sample.py passes to cli_estimate; EstimateUnavailable with its
    reason where the SDK has none."""
    if p.mode != "agg":
        raise EstimateUnavailable(f"mode {p.mode!r}: only agg points are estimated here")
    if p.concurrency is None or p.tp is None:
        raise EstimateUnavailable("the point has no client concurrency or no tp_size")
    # aiconfigurator_estimate takes the clients (the point's concurrency: every attention-DP rank's).
    return aiconfigurator_estimate(
        p.system,
        p.backend,
        p.backend_version,
        p.model_path,
        p.isl,
        p.osl,
        p.concurrency * p.pp,
        p.tp,
        p.gemm_quant,
        pp=p.pp,
        attention_dp=p.dp,
        moe_ep=p.moe_ep,
        moe_quant=p.row.get("moe_quant_mode") or None,
    )


def estimate_point(p) -> tuple[float, float, str]:
    """estimate_of(p) as validate's table takes it: (TTFT ms, TPOT ms, which database priced it)."""
    e = estimate_of(p)
    return e.ttft_ms, e.tpot_ms, f"{p.system} {p.backend} {e.database_version}" + (" (KV cache over memory)" if e.kv_cache_oom else "")
