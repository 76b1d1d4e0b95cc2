"""Analytic roofline cost model: a forward's time from its FLOPs and bytes.

For a ForwardPlan with n = num_tokens new tokens, b = batch_size requests,
S = sum_seq_len (= sum_prefix_len + n) and A = attention_pairs (causal
query-key pairs), on a model with L layers, H query heads of size d:

    forward_time = kernel_launch_s + L * per_layer_overhead_s
                 + max(dense_flops / F, dense_bytes / B)        # linear layers + lm_head
                 + max(attn_flops / F,  attn_bytes / B)         # attention over the KV cache

    F = peak_flops * compute_efficiency
    B = mem_bandwidth * bandwidth_efficiency

    dense_flops = 2 * P_layers * n                # every new token passes every matmul
                + 2 * hidden * vocab * b          # logits only for each request's last token
    dense_bytes = (P_layers + hidden * vocab) * w # all layer weights and lm_head, read once
                + act_bytes_per_token * n         # activations in and out of each kernel
                + 4 * vocab * b                   # fp32 logits written
    attn_flops  = 4 * L * H * d * A               # QK^T and PV: 2 FLOPs per MAC each
    attn_bytes  = kv_bytes_per_token * S          # read the whole KV of every request
                + kv_bytes_per_token * n          # write the new tokens' K and V

P_layers counts the matmul weights of the decoder layers (the embedding
lookup does no FLOPs; norms are negligible) and w is the bytes per weight.

Why per component: a decode batch is memory bound in the linear layers
(weights dominate) and in attention (KV dominates), while a large prefill is
compute bound in both; a mixed batch can be compute bound in its matmuls and
memory bound in its attention. Summing the per-component maxima captures that;
``per_component=False`` gives the classic single max(total FLOPs, total bytes).

Everything that depends only on the model and hardware is folded into
per-unit seconds at construction, so ``forward_time`` is a few multiply-adds
on the plan's precomputed summaries (O(1) per plan, ~1 µs in CPython).
"""

from __future__ import annotations

from scheduler.forward_plan import ForwardPlan
from scheduler.model_config import ModelConfig
from simulator.hardware import HardwareSpec


def activation_bytes_per_token(model: ModelConfig, dtype_bytes: int = 2) -> int:
    """Bytes of activations one token moves through the layers (reads + writes).

    Per layer: qkv_proj reads hidden and writes q+2kv; o_proj reads q and writes
    hidden; gate_up reads hidden and writes 2*intermediate; down reads
    intermediate and writes hidden; norms and residual adds move ~4*hidden.
    Plus the embedding row read at the start.
    """
    h, q, kv, i = model.hidden_size, model.q_size, model.kv_size, model.intermediate_size
    per_layer = (h + q + 2 * kv) + (q + h) + (h + 2 * i) + (i + h) + 4 * h
    return (model.num_hidden_layers * per_layer + h) * dtype_bytes


class RooflineCostModel:
    """CostModel from FLOPs and bytes over the hardware's (efficiency-scaled) peaks."""

    __slots__ = (
        "name", "model", "hw", "dtype_bytes", "per_component",
        "_overhead_s", "_tok_flop_s", "_req_flop_s", "_pair_flop_s",
        "_weight_mem_s", "_tok_mem_s", "_req_mem_s", "_kv_read_s", "_kv_write_s",
    )  # fmt: skip

    def __init__(
        self,
        model: ModelConfig,
        hw: HardwareSpec,
        dtype_bytes: int = 2,
        per_component: bool = True,
    ) -> None:
        self.name = f"roofline:{model.name}@{hw.name}"
        self.model = model
        self.hw = hw
        self.dtype_bytes = dtype_bytes
        self.per_component = per_component

        flops = hw.peak_flops * hw.compute_efficiency
        bw = hw.mem_bandwidth * hw.bandwidth_efficiency
        m = model
        layer_mm_params = m.num_hidden_layers * m.matmul_params_per_layer
        logit_mm_params = m.hidden_size * m.vocab_size
        kv_tok = m.kv_bytes_per_token(dtype_bytes)

        self._overhead_s = hw.kernel_launch_s + m.num_hidden_layers * hw.per_layer_overhead_s
        # Compute seconds per unit.
        self._tok_flop_s = 2.0 * layer_mm_params / flops
        self._req_flop_s = 2.0 * logit_mm_params / flops
        self._pair_flop_s = 4.0 * m.num_hidden_layers * m.num_attention_heads * m.head_dim / flops
        # Memory seconds: weights once per forward, then per token / request / KV token.
        self._weight_mem_s = (m.num_layer_params + logit_mm_params) * dtype_bytes / bw
        self._tok_mem_s = activation_bytes_per_token(m, dtype_bytes) / bw
        self._req_mem_s = 4.0 * m.vocab_size / bw  # fp32 logits
        self._kv_read_s = kv_tok / bw
        self._kv_write_s = kv_tok / bw

    # ------------------------------------------------------------------ hot path
    def forward_time(self, plan: ForwardPlan) -> float:
        n = plan.num_tokens
        if n <= 0:
            if plan.req_pool_indices:
                raise ValueError(
                    "ForwardPlan has requests but num_tokens == 0: fill its cost summaries "
                    "(ForwardPlan.summarize) before costing it"
                )
            return 0.0  # idle: nothing is launched
        b = len(plan.req_pool_indices)
        dense_c = n * self._tok_flop_s + b * self._req_flop_s
        dense_m = self._weight_mem_s + n * self._tok_mem_s + b * self._req_mem_s
        attn_c = plan.attention_pairs * self._pair_flop_s
        attn_m = plan.sum_seq_len * self._kv_read_s + n * self._kv_write_s
        if self.per_component:
            return (
                self._overhead_s
                + (dense_c if dense_c > dense_m else dense_m)
                + (attn_c if attn_c > attn_m else attn_m)
            )
        c, mem = dense_c + attn_c, dense_m + attn_m
        return self._overhead_s + (c if c > mem else mem)

    def cpu_time(self, stage: str, num_reqs: int, num_tokens: int) -> float:
        return self.hw.cpu.time(stage, num_reqs, num_tokens)

    # ------------------------------------------------------------- inspection
    def breakdown(self, plan: ForwardPlan) -> dict[str, float]:
        """Seconds of each term of forward_time, for reports and debugging (not the hot path)."""
        n, b = plan.num_tokens, len(plan.req_pool_indices)
        return {
            "overhead_s": self._overhead_s if n > 0 else 0.0,
            "dense_compute_s": n * self._tok_flop_s + b * self._req_flop_s,
            "dense_memory_s": (self._weight_mem_s + n * self._tok_mem_s + b * self._req_mem_s)
            if n > 0
            else 0.0,
            "attn_compute_s": plan.attention_pairs * self._pair_flop_s,
            "attn_memory_s": plan.sum_seq_len * self._kv_read_s + n * self._kv_write_s,
            "total_s": self.forward_time(plan),
        }

    def __repr__(self) -> str:
        return f"RooflineCostModel({self.name!r}, dtype_bytes={self.dtype_bytes})"
