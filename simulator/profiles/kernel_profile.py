"""A cost profile composed from measured kernels: a model's forward, kernel by kernel, from AIConfigurator.

`build_kernel_profile(system, backend, backend_version, model, tp)` queries the database
(simulator/profiles/kernel_db.py) for every kernel of a Llama-family decoder layer, with the shapes one of
`tp` GPUs runs (the op list AIConfigurator's own LLAMA model uses):

    per layer, over the batch's n tokens:  qkv_proj   GEMM n x hidden -> (heads + 2 kv heads) x head_dim / TP
                                           o_proj     GEMM n x heads x head_dim / TP -> hidden
                                           gate_up_proj GEMM n x hidden -> 2 x intermediate / TP
                                           down_proj  GEMM n x intermediate / TP -> hidden
                                           norms      residual add + RMSNorm, twice
                                           act_fn     SiLU and multiply
                                           all_reduce two, after attention and after the MLP (TP > 1)
    a mixture of experts' layers instead:  router     GEMM n x hidden -> experts (bf16)
    (Qwen3-MoE, Mixtral; each kernel       experts    the backend's fused-MoE kernel over n tokens, each
    weighted by its share of the layers,              routed to k of the experts, split over the TP GPUs,
    beside the dense-MLP layers' share)               under the database's balanced token load
                                           shared_experts  gate-up and down GEMMs of the shared experts
                                           (--ep N: the database's expert-parallel rows, whole experts a rank)
    DeepSeek's MLA instead of qkv_proj:    qkv_a_proj the latents' fused down-projection (q's, the KV's, RoPE key)
                                           q_b_proj   q's up-projection, heads / TP
    per layer, attention:                  prefill attention of the extend requests (with RoPE and
                                           the KV write), decode attention of the decode requests;
                                           MLA: kv_b_proj (the KV latent decompressed) + context_mla,
                                           and two latent BMMs + generation_mla (the MQA over latents);
                                           DeepSeek's sparse attention (GLM-5): the database's DSA
                                           module, projections included, or composed where it has
                                           none (simulator/profiles/sparse_attention.py);
                                           vLLM's MLA (no per-kernel MLA tables): the database's
                                           MLA module, projections included, and what a cached
                                           prefix adds (simulator/profiles/mla_module.py);
                                           gpt-oss's sliding-window layers: the database's rows
                                           of their window, by their share of the layers
                                           (simulator/profiles/sliding_window.py);
                                           Qwen3.5's Gated DeltaNet layers: the database's
                                           linear-attention rows by their share of the layers
                                           (simulator/profiles/linear_attention.py)
    once per forward:                      embedding (+ its all-reduce for TP > 1) over n tokens;
                                           lm_head GEMM over the batch's requests (one row each)

and tabulates them on grids (seconds; attention and per-layer ops for one layer):

    tokens              the database's measured GEMM token counts, then powers of 2 to 131072
    requests            1 to 4096 (lm_head)
    prefill attention   batch 1..256 x new tokens per request 1..131072 x cached prefix 0..131072
    decode attention    batch 1..2048 x context per request 1..131072

The grid points are the database's answers at those shapes: at its measured shapes the measured
time, elsewhere its own interpolation between measurements.

Precision (`quantization`, `kv_cache_dtype`; simulator/costs/precision.py): fp8 weights price the four
layer GEMMs from the database's per-tensor fp8 GEMM table (GEMMQuantMode.fp8: fp8 weights with one
scale each, activations quantized to fp8 on the fly: what SGLang's and vLLM's `--quantization fp8`
run on a bf16 checkpoint, measured as SGLang's sgl_kernel fp8_scaled_mm or vLLM's Cutlass
scaled_mm); fp8_block weights from its `fp8_block` table (128x128-block scales, the kernels of
block-quantized FP8 checkpoints) and nvfp4 weights from its `nvfp4` table (ModelOpt FP4 on
Blackwell's fp4 tensor cores); the LM head stays a bf16 GEMM (neither engine quantizes it). Unset
`quantization`, a checkpoint's own format: one that quantizes the experts only (gpt-oss's MXFP4) keeps
the GEMMs bf16 and prices the experts from that format's MoE rows (simulator/profiles/expert_format.py). A
system without GEMMs of the format (no fp8 tensor cores: the A100; no fp4 ones: Hopper) is refused. An fp8 KV cache prices both attentions from the
database's fp8-KV tables, in the attention dtype the database measured the backend's kernel in
(prefill under SGLang's FA3 on Hopper: fp8, q cast to fp8 too; vLLM's rows are all labelled bf16,
SGLang's FlashInfer on the RTX PRO 6000 is bf16 over fp8 KV); where the database has no fp8-KV
attention for the system and backend (A100), from its bf16-KV tables, and the profile says so
(`precision.kv_cache_dtype.priced_as`, `why`). The profile records its precision (`precision`:
weights and KV cache, and which table priced each kernel); a replay asking for another is refused.

`simulator/costs/kernel_cost.py` prices a forward from these tables; `simulator/profiles/kernel_holdout.py`
reports how far its prices are from the database at measured shapes off the grids. The result is a
profile file (`testbed calibrate --source aiconfigurator` writes it) that `--profile` reads.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from scheduler.model_config import ModelConfig, load_model_config
from simulator.costs.kernel_cost import model_shapes
from simulator.costs.llmservingsim_attention import AttentionTimingsError
from simulator.costs.measured_decode_attention import from_llmservingsim as measured_decode_of
from simulator.costs.mixed_attention import from_llmservingsim as mixed_decode_factor_of
from simulator.costs.precision import BF16, FP8, Precision
from simulator.costs.profile_cost import PROFILE_FORMAT, PROFILE_VERSION
from simulator.hardware.specs import database_system_spec
from simulator.profiles.eager_dispatch import eager_dispatch_s
from simulator.profiles.expert_format import expert_quant_mode
from simulator.profiles.gpu_shapes import GpuShapes, expert_load_name
from simulator.profiles.interconnect_link import InterconnectLink
from simulator.profiles.kernel_catalog import system_spec
from simulator.profiles.kernel_db import KernelDatabase, KernelDatabaseError, KernelDataMissing
from simulator.profiles.mla_module import MlaModule

DATABASE_COLLECTIVES = "the database's rows"  # a profile's `all_reduce` where no link of the machine's priced them
SOURCE = "aiconfigurator"  # the profile's "source" (simulator/costs/sources.py dispatches on it)
Progress = Callable[[str, int, int], None]  # (phase, done, total)

TOP = 131072  # grids reach Llama 3.1's context; past their ends prices extrapolate (kernel_cost.py)
POWERS = [2**k for k in range(18)]  # 1 .. 131072
PREFILL_BATCH = [2**k for k in range(9)]  # 1 .. 256: the database measures prefill batches up to 256
PREFIX = [0, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, TOP]
DECODE_BATCH = [2**k for k in range(12)]  # 1 .. 2048, the database's decode batches
DECODE_CONTEXT = POWERS
REQUESTS = sorted({*range(1, 17), *(2**k for k in range(5, 13))})  # lm_head rows: 1 .. 4096


def _seconds(x: float) -> float:
    return float(f"{x:.5g}")  # 5 significant digits: far below the database's own noise, a small file


def quantized_gemm_check(db: KernelDatabase, g: GpuShapes, quant: str) -> str | None:
    """Refuse --quantization `quant` (fp8, fp8_block, nvfp4) where the database has no GEMMs of that
    format; the kernel it measured them with."""
    try:
        db.gemm(1, g.hidden, g.hidden, quant)
    except KernelDataMissing as e:
        gpu = system_spec(db.system).get("gpu", {})
        cores = {"nvfp4": ("fp4", "fp4_tc_flops")}.get(quant, ("fp8", "fp8_tc_flops"))
        why = (
            f"the GPU has no {cores[0]} tensor cores (its spec has no {cores[1]})"
            if not gpu.get(cores[1])
            else f"its GEMM tables: {', '.join(db.tables.gemm_quant_modes()) or 'none'} ({e})"
        )
        raise KernelDatabaseError(
            f"--quantization {quant}: {db.system}/{db.backend} {db.version} has no {quant} GEMM kernels: {why}"
        ) from None
    return db.tables.gemm_kernel(quant)


def _fp8_kv_fallback_why(db: KernelDatabase, missing: list[str], errors: list[str]) -> str:
    """Why an fp8 KV cache was priced from bf16-KV attention tables: the database has none (A100), or
    none it can answer for these heads (then its own message)."""
    have = sorted(set(db.tables.attention_kv_dtypes(True)) | set(db.tables.attention_kv_dtypes(False)))
    why = f"{db.system}/{db.backend} {db.version} has no fp8-KV {' and '.join(missing)} attention"
    if errors and (FP8 in have or not have):  # fp8 rows, but none for these heads; or no table of its own
        why += f" for these heads ({errors[0]})" if have else f" ({errors[0]})"
    elif have:
        why += f" (its attention tables hold {', '.join(have)} KV only)"
    return why + "; the KV pool still holds fp8, 1 byte an element"


def check_tp(system: str, model: ModelConfig, tp: int, dp: int = 1) -> None:
    """TP must split the model, and its tp x dp GPUs fit in one node of the system (the database measures
    all-reduce and the experts' exchange there)."""
    model.check_tp(tp)
    per_node = int(system_spec(system).get("node", {}).get("num_gpus_per_node", 8))
    if tp * dp > per_node:
        asked = f"--tp {tp}" + (f" x --dp {dp}" if dp > 1 else "")
        raise KernelDatabaseError(f"{asked}: {system} has {per_node} GPUs a node, and the database measures all-reduce within one node")


def profile_header(source: str, model: ModelConfig, tp: int, ep: int = 1, dp: int = 1) -> dict:
    """What every kernel profile opens with: its format, its cost source, and the model and layout it is of."""
    return {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "source": source,
        "model": model.name,
        "model_shapes": model_shapes(model),
        "tp": tp,
        "ep": ep,
        "dp": dp,
    }


def build_kernel_profile(
    system: str,
    backend: str,
    backend_version: str | None,
    model: ModelConfig | str,
    tp: int = 1,
    progress: Progress | None = None,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    mixed_attention: str | Path | None = None,
    ep: int = 1,
    expert_imbalance: float | None = None,
    holdout: bool = True,
    dp: int = 1,
    decode_attention: str | Path | None = None,
    link: InterconnectLink | None = None,
) -> dict:
    """The profile of `model` (a ModelConfig, or a name or path load_model_config takes) over `tp` GPUs
    (a mixture of experts' experts over `ep` ranks of them; with attention data parallelism, `dp` ranks of
    `tp` GPUs each and the experts over all tp x dp GPUs: GpuShapes)
    of `system`, from `backend`'s kernels (version None: the newest the database maintains), with its
    weights quantized (`quantization` fp8, fp8_block or nvfp4, else the model's dtype) and its KV cache in `kv_cache_dtype`
    (auto: the model's dtype; bf16; fp8). `mixed_attention`: LLMServingSim's attention.csv of the same GPU and
    engine, whose mixed batches price decode rows beside a prefill chunk (simulator/costs/mixed_attention.py);
    `decode_attention`: such a file of the same GPU, engine, model and TP, whose decode-only batches
    replace the database's decode attention (simulator/costs/measured_decode_attention.py); `link`: the
    machine's own link between its GPUs, over which every all-reduce is priced instead of the
    database's rows (simulator/profiles/interconnect_link.py)."""
    t0 = time.perf_counter()
    mixed = measured_decode = None
    try:
        if mixed_attention is not None:
            mixed = mixed_decode_factor_of(mixed_attention)
        if decode_attention is not None:
            measured_decode = measured_decode_of(decode_attention)
    except AttentionTimingsError as e:
        raise KernelDatabaseError(str(e)) from None
    if isinstance(model, str):
        model = load_model_config(model)
    try:
        # Unset quantization: the checkpoint's own format, as a replay resolves it (gpt-oss's MXFP4 experts).
        precision = Precision.resolve(
            model.torch_dtype, quantization, kv_cache_dtype, model.checkpoint_quantization, model.checkpoint_quantizes_experts_only
        )
    except ValueError as e:
        raise KernelDatabaseError(str(e)) from None
    db = KernelDatabase.open(system, backend, backend_version)
    db.link = link
    check_tp(system, model, tp, dp)
    try:
        model.check_parallel(tp, ep, dp)
    except ValueError as e:
        raise KernelDatabaseError(str(e)) from None
    g = GpuShapes.of(model, tp, ep, dp)
    gemm_kernel = db.tables.gemm_kernel(BF16)
    if precision.experts_only:  # the layer GEMMs stay bf16; the experts from their format's MoE table
        g = replace(g, expert_quant=expert_quant_mode(precision.weights))
    elif precision.quantized_weights:
        gemm_kernel = quantized_gemm_check(db, g, precision.weights)
        g = replace(g, gemm_quant=precision.weights)
    if expert_imbalance is not None:
        if not model.is_moe:
            raise KernelDatabaseError(f"--expert-imbalance {expert_imbalance:g}: {model.name} is a dense model (no experts to load)")
        g = replace(g, expert_load=expert_load_name(expert_imbalance))
    try:
        g = g.with_experts_priced(db)
    except KernelDataMissing as e:
        if expert_imbalance is None:
            raise
        raise KernelDatabaseError(
            f"--expert-imbalance {expert_imbalance:g}: the database measures the experts under balanced, power_law_1.01 "
            f"and power_law_1.2 loads ({e})"
        ) from None
    if g.sparse is not None:  # DeepSeek's sparse attention: the database's DSA module, or composed (sparse_attention.py)
        g = replace(g, sparse=g.sparse.priced(db, g))
    elif g.kv_lora:  # MLA: the database's MLA module where it has no per-kernel MLA tables (vLLM's: mla_module.py)
        g = replace(g, mla_module=MlaModule.priced(db, g))
    if g.linear_attention is not None:  # Qwen3.5's Gated DeltaNet layers: refused where the database has no gdn rows
        g.linear_attention.priced(db)
    tokens = sorted(set(db.tables.measured_gemm_tokens(g.gemm_quant)) | set(POWERS))

    phases = [
        ("dense", len(tokens) + len(REQUESTS)),
        ("prefill attention", len(PREFILL_BATCH) * len(POWERS)),
        ("decode attention", len(DECODE_BATCH)),
    ]
    total = sum(n for _, n in phases)
    done = 0

    def tick(phase: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(phase, done, total)

    per_layer: dict[str, list[float]] = {}
    all_ranks: dict[str, list[float]] = {}
    embedding = []
    for n in tokens:
        for op, t in g.layer_kernels(db, n).items():
            per_layer.setdefault(op, []).append(_seconds(t))
        for op, t in g.all_ranks_kernels(db, n).items():
            all_ranks.setdefault(op, []).append(_seconds(t))
        embedding.append(_seconds(g.embedding(db, n)))
        tick("dense")
    lm_head = []
    for r in REQUESTS:
        lm_head.append(_seconds(g.lm_head(db, r)))
        tick("dense")

    def prefill_table(shapes: GpuShapes) -> list:
        table = []
        for b in PREFILL_BATCH:
            plane = []
            for s in POWERS:
                plane.append([_seconds(shapes.prefill_attention(db, b, s, p)) for p in PREFIX])
                tick("prefill attention")
            table.append(plane)
        return table

    def decode_table(shapes: GpuShapes) -> list:
        table = []
        for b in DECODE_BATCH:
            table.append([_seconds(shapes.decode_attention(db, b, s)) for s in DECODE_CONTEXT])
            tick("decode attention")
        return table

    def first_that_prices(candidates: list[GpuShapes], build) -> tuple[GpuShapes, list, str | None]:
        """The table of the first precision the database has every shape of; the last one (bf16 KV) always."""
        nonlocal done
        start, error = done, None
        for shapes in candidates[:-1]:
            try:
                return shapes, build(shapes), error
            except KernelDataMissing as e:
                error, done = str(e), start  # the phase again, from its first step
        return candidates[-1], build(candidates[-1]), error

    prefill_kernel, prefill_dtypes = db.tables.attention_kernel(True, precision.kv_cache if precision.fp8_kv else BF16)
    decode_kernel, _ = db.tables.attention_kernel(False, precision.kv_cache if precision.fp8_kv else BF16)
    prefill_candidates, decode_candidates = [g], [g]
    if precision.fp8_kv:
        # The attention dtype the database measured the backend's kernel in over an fp8 KV cache: fp8
        # where it has such rows (FA3 under SGLang on Hopper casts q to fp8 too), else bf16; the other
        # next, then bf16 KV. Without this version's own table (the database fills it from another):
        # AIConfigurator's own rule, fp8 but under vLLM (whose rows are all labelled bf16 attention).
        fp8_first = FP8 in prefill_dtypes if prefill_dtypes else backend != "vllm"
        fmhas = [FP8, BF16] if fp8_first else [BF16, FP8]
        prefill_candidates = [replace(g, prefill_kv=FP8, prefill_fmha=f) for f in fmhas] + [g]
        decode_candidates = [replace(g, decode_kv=FP8), g]
    g_prefill, prefill, prefill_error = first_that_prices(prefill_candidates, prefill_table)
    g_decode, decode, decode_error = first_that_prices(decode_candidates, decode_table)
    g = replace(g, prefill_kv=g_prefill.prefill_kv, prefill_fmha=g_prefill.prefill_fmha, decode_kv=g_decode.decode_kv)

    hardware = database_system_spec(system)
    priced_kv = sorted({g.prefill_kv, g.decode_kv})
    kv_record = {
        "asked": precision.kv_cache,
        "priced_as": priced_kv[0] if len(priced_kv) == 1 else f"{g.prefill_kv} (prefill), {g.decode_kv} (decode)",
    }
    missing = [kind for kind, kv in (("prefill", g.prefill_kv), ("decode", g.decode_kv)) if precision.fp8_kv and kv != FP8]
    if missing:
        kv_record["why"] = _fp8_kv_fallback_why(db, missing, [e for e in (prefill_error, decode_error) if e])
    if not precision.fp8_kv or missing:  # the kernels measured with the KV dtype that priced them
        prefill_kernel = db.tables.attention_kernel(True, g.prefill_kv)[0]
        decode_kernel = db.tables.attention_kernel(False, g.decode_kv)[0]
    if g.kv_lora:  # the database's MLA tables, not its GQA kernels
        prefill_kernel, decode_kernel = "context_mla + kv_b_proj", "generation_mla + latent BMMs"
    if g.sparse is not None:
        prefill_kernel, decode_kernel = g.sparse.kernels(db, g)
    if g.mla_module is not None:
        prefill_kernel, decode_kernel = g.mla_module.kernels(db, g)
    profile = {
        **profile_header(SOURCE, model, tp, ep, dp),
        # The experts' token load the MoE kernel was priced under (None: balanced, or a dense model).
        "expert_imbalance": expert_imbalance,
        "hardware": system,
        # KV capacity follows from one GPU's memory (kv_capacity.py); the roofline's spec of the system.
        "hardware_spec": hardware.to_dict(),
        "database": db.describe(),
        # How a TP group's all-reduces are priced: the database's rows, or the machine's own link.
        "all_reduce": DATABASE_COLLECTIVES if link is None else link.describe(),
        # What a replay must ask for (--quantization, --kv-cache-dtype; it sizes the KV pool), and which
        # of the database's tables priced each kernel (quant mode, and the kernel it measured).
        "precision": precision.to_dict()
        | {
            "gemm": {"quant_mode": g.gemm_quant, "kernel": gemm_kernel},
            **(
                {
                    "experts": {
                        "moe_tp": g.moe_tp,
                        "priced_as": f"extrapolated from the database's moe_tp {g.moe_tp // 2} and "
                        f"{g.moe_tp // 4} rows (t(m) = t(m/2)^2 / t(m/4)): it has none of moe_tp {g.moe_tp}",
                    }
                }
                if g.moe_split_extrapolated
                else {}
            ),
            **(
                {
                    "expert_weights": {
                        "quant_mode": g.expert_quant,
                        "kernel": db.tables.moe_kernel(g.expert_quant, g.hidden, g.expert_intermediate),
                    }
                }
                if g.expert_quant
                else {}
            ),
            "lm_head": {"quant_mode": BF16, "kernel": db.tables.gemm_kernel(BF16)},
            **({"sparse_attention": g.sparse.record()} if g.sparse is not None else {}),
            **({"mla_module": g.mla_module.record()} if g.mla_module is not None else {}),
            **({"sliding_window": g.sliding.record(db, g.prefill_kv, g.decode_kv, model.attention_sinks)} if g.sliding is not None else {}),
            **({"linear_attention": g.linear_attention.record()} if g.linear_attention is not None else {}),
            "prefill_attention": {"kv_cache": g.prefill_kv, "fmha": g.prefill_fmha, "kernel": prefill_kernel},
            "decode_attention": {"kv_cache": g.decode_kv, "kernel": decode_kernel},
            "kv_cache_dtype": kv_record,
        },
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "kernels": {
            "layers": g.layers,
            "tokens": tokens,
            "per_layer": per_layer,
            # dp > 1: a layer's kernels over the tokens of every DP rank together (the routed experts);
            # per_layer's are over one rank's.
            **({"per_layer_all_ranks": all_ranks} if all_ranks else {}),
            "per_forward": {"embedding": embedding},
            "requests": REQUESTS,
            "lm_head": lm_head,
            "prefill_attention": {"batch": PREFILL_BATCH, "new_tokens": POWERS, "prefix": PREFIX, "seconds": prefill},
            "decode_attention": {"batch": DECODE_BATCH, "context": DECODE_CONTEXT, "seconds": decode},
            # What a forward outside a CUDA graph costs beyond its kernels (simulator/costs/cuda_graphs.py).
            "eager_overhead_s": _seconds(eager_dispatch_s(db, model, g.layers)),
        },
    }
    if mixed is not None:
        profile["kernels"]["mixed_decode_factor"] = mixed.to_dict()
    if holdout:  # how far the grids are from the database's measured shapes (calibrate prints it)
        from simulator.profiles.kernel_holdout import holdout_errors

        profile["holdout"] = holdout_errors(profile, db, g)
    if measured_decode is not None:  # after the holdout: it checks the grid against the database it came from
        table = profile["kernels"]["decode_attention"]
        table["seconds"] = measured_decode.overlay(DECODE_BATCH, DECODE_CONTEXT, table["seconds"])
        profile["precision"]["decode_attention"]["measured"] = measured_decode.record()
    profile["wall_s"] = round(time.perf_counter() - t0, 1)
    return profile
