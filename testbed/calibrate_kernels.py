"""testbed calibrate --source aiconfigurator: a profile of a GPU system from AIConfigurator's measured kernels.

No engine runs: the profile is composed from the database's kernel timings for the model's shapes
over TP GPUs (simulator/profiles/kernel_profile.py), in seconds, and written where --out says, in the
profile format `--profile` reads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from scheduler.core.forward_plan import ForwardMode
from scheduler.model_config import ModelConfig, load_model_config
from simulator.costs.mixed_attention import MixedDecodeFactor
from simulator.costs.precision import BF16, Precision
from simulator.profiles.kernel_catalog import KernelDatabaseError, available
from simulator.profiles.kernel_holdout import uniform_plan
from simulator.profiles.kernel_profile import DATABASE_COLLECTIVES, build_kernel_profile
from testbed.errors import ConfigError

DEFAULT_MODEL = "llama-3.1-8b"


def profile_text(profile: dict) -> str:
    """JSON with every list of numbers on one line: the kernel tables stay a small, readable file."""
    text = json.dumps(profile, indent=1)
    return re.sub(r"\[[-+0-9.eE,\s]*\]", lambda m: re.sub(r"\s+", "", m.group(0)).replace(",", ", "), text) + "\n"


def hbm_floor_s(model: ModelConfig, tp: int, mem_bandwidth: float, precision: Precision | None = None, ep: int = 1, dp: int = 1) -> float:
    """One decode step at batch 1 can not beat reading one GPU's weights once from memory (fp8 weights:
    1 byte a weight of the linear layers, the embedding and LM head at 2); of a mixture of experts'
    routed experts (E / ep of them on a GPU, with attention DP over tp x dp GPUs), only the k its one
    token goes to, at most all of the GPU's."""
    p = precision or Precision()
    linear = p.linear_weight_bytes if p.quantized_weights else None
    read = model.weight_bytes(2, tp, linear_bytes=linear, ep=ep, dp=dp)
    if model.is_moe:
        local = model.num_experts / ep
        untouched = 1 - min(model.num_experts_per_tok, local) / local
        read -= model.routed_expert_params(tp, ep, dp) * (linear or 2) * untouched
    return read / mem_bandwidth


def profile_precision(profile: dict) -> Precision:
    kept = profile.get("precision") or {}
    return Precision(kept.get("weights", BF16), kept.get("kv_cache", BF16))


def decode_at_batch_1_s(profile: dict, context: int = 1024) -> float:
    from simulator.costs.kernel_cost import KernelProfileCostModel

    return KernelProfileCostModel(profile).forward_time(uniform_plan(ForwardMode.DECODE, 1, 1, context - 1))


def calibrate_kernels(
    system: str | None,
    backend: str,
    backend_version: str | None,
    model_name: str | None,
    tp: int,
    out: str | Path,
    progress=None,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    mixed_attention: str | None = None,
    ep: int = 1,
    expert_imbalance: float | None = None,
    dp: int = 1,
    decode_attention: str | None = None,
    link=None,
) -> dict:
    """Build the profile and write it; bad input raises ConfigError (one line, exit 2). link: the
    machine's InterconnectLink, over which collectives are priced instead of the database's rows."""
    if not system:
        try:
            systems = ", ".join(available())
        except KernelDatabaseError as e:
            raise ConfigError(str(e)) from None
        raise ConfigError(f"--source aiconfigurator needs --system: one of {systems}")
    model = load_model_config(model_name or DEFAULT_MODEL)
    try:
        profile = build_kernel_profile(
            system,
            backend,
            backend_version,
            model,
            tp,
            progress,
            quantization,
            kv_cache_dtype,
            mixed_attention,
            ep,
            expert_imbalance,
            dp=dp,
            decode_attention=decode_attention,
            link=link,
        )
    except KernelDatabaseError as e:
        raise ConfigError(str(e)) from None
    write_profile(profile, out)
    return profile


def write_profile(profile: dict, out: str | Path) -> None:
    """The profile to `out` (its folder made), as profile_text lays it out."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profile_text(profile))


def summary_lines(profile: dict, out: str | Path) -> list[str]:
    db, spec = profile["database"], profile["hardware_spec"]
    model, tp, ep, dp = load_model_config(profile["model"]), profile["tp"], profile.get("ep", 1), profile.get("dp", 1)
    lines = [
        f"profile {out}: {profile['model']} at TP {tp}{f', EP {ep}' if ep > 1 else ''}{f', DP {dp}' if dp > 1 else ''} on {db['system']}, {db['backend']} {db['backend_version']} kernels "
        f"(aiconfigurator-core {db['package_version']}), {profile['wall_s']} s"
    ]
    precision = profile_precision(profile)
    lines.append("  " + precision_line(profile))
    decode, floor = decode_at_batch_1_s(profile), hbm_floor_s(model, tp, spec["mem_bandwidth"], precision, ep, dp)
    lines.append(
        f"  decode at batch 1, context 1024: {decode * 1e3:.2f} ms; weights / memory bandwidth "
        f"(the floor): {floor * 1e3:.2f} ms ({decode / floor:.2f}x)"
    )
    if profile.get("all_reduce", DATABASE_COLLECTIVES) != DATABASE_COLLECTIVES and tp * dp > 1:
        lines.append(f"  collectives: {profile['all_reduce']}")
    mixed = profile["kernels"].get("mixed_decode_factor")
    if mixed:
        factor = MixedDecodeFactor.from_dict(mixed)
        lines.append(
            f"  decode rows beside a prefill chunk, from {factor.source}: {factor(8, 1024):.2f}x at 8 decodes of 1,024 tokens, "
            f"{factor(64, 4096):.2f}x at 64 of 4,096 (the decode table's time)"
        )
    measured = profile["precision"].get("decode_attention", {}).get("measured")
    if measured:
        (n0, n1), (kv0, kv1) = measured["n_decode"], measured["kv_decode"]
        lines.append(
            f"  decode attention from {measured['source']}: measured at {n0}-{n1} requests of {kv0:,}-{kv1:,} tokens "
            f"(elsewhere the database's, scaled as at the nearest measured shape)"
        )
    for kind, e in profile["holdout"].items():
        if not e.get("points"):
            lines.append(f"  {kind}: no measured shapes to check against (this version's attention tables come from another)")
        else:
            lines.append(
                f"  {kind}: error at {e['points']} measured shapes off a half grid: median {e['median_rel_err'] * 100:.1f}%, "
                f"p90 {e['p90_rel_err'] * 100:.1f}%, max {e['max_rel_err'] * 100:.1f}%"
            )
    return lines


def precision_line(profile: dict) -> str:
    """Which of the database's tables priced the weights and the KV cache; where fp8 KV attention was
    priced from bf16-KV tables (the database has none for the system), that, and why."""
    p = profile.get("precision") or {}
    gemm, kv = p.get("gemm", {}), p.get("kv_cache_dtype", {})
    weights = f"{p.get('weights', BF16)} weights (layer GEMMs from the {gemm.get('quant_mode', BF16)} table"
    weights += f": {gemm['kernel']})" if gemm.get("kernel") else ")"
    if kv.get("why"):
        return f"{weights}; --kv-cache-dtype {kv['asked']}: attention priced as {kv['priced_as']} KV: {kv['why']}"
    fmha = p.get("prefill_attention", {}).get("fmha", BF16)
    return f"{weights}, {p.get('kv_cache', BF16)} KV cache (attention from the {kv.get('priced_as', BF16)}-KV tables, prefill in {fmha})"
