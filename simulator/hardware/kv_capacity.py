"""How many tokens of KV cache fit on a device, as SGLang sizes its pool.

SGLang gives weights + KV pool a static share of device memory
(``mem_fraction_static``); the rest is left to activations and CUDA graphs.
Inside that share we also keep a small reserve for the sampler and workspaces
(``HardwareSpec.activation_reserve_bytes``), then divide by the KV bytes of
one token. A hybrid linear-attention model (Qwen3.5) caches K and V in its full-attention layers only,
and SGLang gives part of that memory to its requests' recurrent states instead
(scheduler/sglang/mamba_pool.py).
"""

from __future__ import annotations

from scheduler.model_config import ModelConfig
from scheduler.sglang.mamba_pool import kv_share
from simulator.costs.precision import Precision
from simulator.hardware.specs import HardwareSpec


def kv_capacity_tokens(
    model: ModelConfig,
    hw: HardwareSpec,
    mem_fraction_static: float = 0.88,
    dtype_bytes: int = 2,
    page_size: int = 1,
    reserve_bytes: int | None = None,
    tp: int = 1,
    precision: Precision | None = None,
    ep: int = 1,
    dp: int = 1,
) -> int:
    """Tokens of KV that fit, rounded down to a multiple of page_size.

    With tensor parallelism over `tp` GPUs of this kind, each holds its share of the
    weights and of every token's KV (ModelConfig: heads divided, or replicated), so the
    pool holds as many tokens as one GPU's memory left after its weights.

    A mixture of experts (ModelConfig.check_parallel): each GPU holds its attention rank's share
    of the dense weights and num_experts / ep experts split over (tp x dp) / ep GPUs; MLA's latent
    KV whole on every GPU of a TP group. With attention data parallelism (`dp` ranks) each rank
    holds its own requests' KV: the pool is dp ranks' pools, each rounded to pages, together.

    precision (--quantization, --kv-cache-dtype): fp8 weights take 1 byte a weight of the
    linear layers (the embedding and LM head stay at dtype_bytes), so more memory is left for
    KV; an fp8 KV cache takes 1 byte an element, so the pool holds twice the tokens.

    Raises ValueError if the weights (plus reserve) do not fit in the static
    share, or if not even one page of KV is left.
    """
    if not 0 < mem_fraction_static <= 1:
        raise ValueError(f"mem_fraction_static must be in (0, 1], got {mem_fraction_static}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    reserve = hw.activation_reserve_bytes if reserve_bytes is None else reserve_bytes

    static = hw.memory_bytes * mem_fraction_static
    p = precision or Precision()
    linear = p.linear_weight_bytes if p.quantized_weights else None
    weights = model.weight_bytes(dtype_bytes, tp, linear_bytes=linear, ep=ep, dp=dp, experts_only=p.experts_only)
    free = static - weights - reserve
    gib = 1 << 30
    if free <= 0:
        layout = f" x {tp} (TP)" if tp > 1 else ""
        if ep > 1 or dp > 1:
            layout = f" x {tp * dp} (TP {tp}, DP {dp}, EP {ep})"
        raise ValueError(
            f"model {model.name!r} does not fit on {hw.name!r}{layout}: weights {weights / gib:.2f} GiB "
            f"+ reserve {reserve / gib:.2f} GiB > {mem_fraction_static:.2f} x "
            f"{hw.memory_bytes / gib:.1f} GiB = {static / gib:.2f} GiB"
        )
    tokens = int(free * kv_share(model) // model.kv_bytes_per_token(p.kv_bytes if p.fp8_kv else dtype_bytes, tp))
    tokens -= tokens % page_size
    if tokens <= 0:
        raise ValueError(
            f"model {model.name!r} on {hw.name!r}: {free / gib:.3f} GiB left after weights "
            f"holds less than one page ({page_size} tokens) of KV"
        )
    return tokens * dp
