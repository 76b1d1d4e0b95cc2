"""Hybrid linear attention in a kernel profile (Qwen3.5): Gated DeltaNet layers beside full-attention ones.

Most of Qwen3.5's layers (layer_types "linear_attention", 45 of 60) are Gated DeltaNet: a causal conv over
q, k and v, then a delta-rule recurrence whose fixed-size state replaces the KV cache, so their time does
not grow with the context. They are priced as AIConfigurator's SDK prices them (sdk/models/qwen35.py,
Qwen35Model): the projections as GEMMs (in_proj_qkvz: q, k, v and the output gate z; in_proj_ba: a decay
and a beta a value head; out_proj), and the kernels from the database's linear_attention tables (gdn_perf):
a prefill's causal_conv1d_fn and chunk_gated_delta_rule over its new tokens (a cached prefix is carried in
the state, not re-read), a decode's causal_conv1d_update and fused_sigmoid_gating_delta_rule_update.
The other layers are full (gated) attention from the attention tables; one (average) layer weights each
kind by its share of the layers. Where the database has no gdn_perf rows for the system and backend, the
profile is refused with the database's reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.model_config import ModelConfig

if TYPE_CHECKING:
    from simulator.profiles.kernel_db import KernelDatabase

PREFILL_KERNELS = ("causal_conv1d_fn", "chunk_gated_delta_rule")
DECODE_KERNELS = ("causal_conv1d_update", "fused_sigmoid_gating_delta_rule_update")


@dataclass(frozen=True)
class LinearAttention:
    """One GPU's Gated DeltaNet shapes (heads split over TP, as SGLang and the SDK shard them) and their share."""

    share: float  # linear-attention layers over all layers
    hidden: int
    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int
    conv_kernel: int
    state_dtype: str  # the recurrent state's (mamba_ssm_dtype)

    @classmethod
    def of(cls, model: ModelConfig, tp: int) -> "LinearAttention | None":
        if not model.is_hybrid_linear:
            return None
        return cls(
            model.linear_attention_layers / model.num_hidden_layers,
            model.hidden_size,
            model.linear_num_key_heads // tp,
            model.linear_key_head_dim,
            model.linear_num_value_heads // tp,
            model.linear_value_head_dim,
            model.linear_conv_kernel_dim,
            "float32" if model.linear_state_dtype_bytes == 4 else "bfloat16",
        )

    def _kernel(self, db: KernelDatabase, kernel: str, context: bool, batch: int, tokens: int) -> float:
        k, v = (self.key_heads, self.key_dim), (self.value_heads, self.value_dim)
        return db.gated_delta_net(kernel, context, batch, tokens, self.hidden, *k, *v, self.conv_kernel, self.state_dtype)

    def projections(self, db: KernelDatabase, linear, n: int) -> dict[str, float]:
        """The linear layers' projections over n tokens, weighted by their share (`linear`: GpuShapes.linear)."""
        kv_in = 2 * self.key_heads * self.key_dim + 2 * self.value_heads * self.value_dim  # q, k, v and z
        return {
            "linear_in_proj": self.share * (linear(db, n, kv_in, self.hidden) + linear(db, n, 2 * self.value_heads, self.hidden)),
            "linear_out_proj": self.share * linear(db, n, self.hidden, self.value_heads * self.value_dim),
        }

    def prefill(self, db: KernelDatabase, batch: int, new_tokens: int) -> float:
        """The linear layers' share of one average layer's prefill kernels (the prefix lives in the state)."""
        return self.share * sum(self._kernel(db, k, True, batch, new_tokens) for k in PREFILL_KERNELS)

    def decode(self, db: KernelDatabase, batch: int) -> float:
        """The linear layers' share of one average layer's decode kernels (the same at any context)."""
        return self.share * sum(self._kernel(db, k, False, batch, 1) for k in DECODE_KERNELS)

    def priced(self, db: KernelDatabase) -> "LinearAttention":
        """Itself, once the database answers each kernel (KernelDataMissing, its reason, where it cannot)."""
        self.prefill(db, 1, 1)
        self.decode(db, 1)
        return self

    def record(self) -> dict:
        """What the profile says of it (precision.linear_attention)."""
        return {
            "linear_layers_share": round(self.share, 6),
            "priced_as": "the database's linear_attention gdn_perf rows for the linear layers (prefill: "
            f"{' + '.join(PREFILL_KERNELS)}; decode: {' + '.join(DECODE_KERNELS)}), its attention tables for the full ones",
            "heads_per_gpu": {"key": self.key_heads, "value": self.value_heads},
            "state_dtype": self.state_dtype,
        }
