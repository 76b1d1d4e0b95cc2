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

Precision (simulator/costs/precision.py): with fp8 weights (--quantization fp8 or
fp8_block) P_layers is read at 1 byte a weight (the LM head, norms and biases
stay at w) and its FLOPs run at the hardware's fp8 peak (`peak_flops_fp8`;
where the spec has none, as on an A100, the engines dequantize into bf16
GEMMs: the bf16 peak); with NVFP4 weights (--quantization nvfp4) at 0.5625
bytes a weight and the fp4 peak (`peak_flops_fp4`, Blackwell; else the bf16
peak, weight-only). The LM head's FLOPs stay at the bf16 peak. With an fp8 KV
cache (--kv-cache-dtype fp8) kv_bytes_per_token is 1 byte an element;
attention's FLOPs stay at the bf16 peak (FlashAttention under vLLM and
SGLang casts q to fp8 and attends in fp8 on Hopper, which this prices
as bf16: an upper bound of its compute-bound part). Activations and the
all-reduces stay at w.

Tensor parallelism over T GPUs: every quantity above is one GPU's share (heads,
MLP columns and vocabulary divided by T, KV heads divided or replicated; see
ModelConfig), and each of the 2 L + 1 all-reduces of the activations (after
attention and after the MLP in every layer, after the vocabulary-parallel
embedding) adds, as a ring all-reduce over the interconnect:

    allreduce = (2 L + 1) * (latency + 2 (T - 1) / T * n * hidden * w / B_link)

outside the maxima (communication does not overlap the layer's compute).

Why per component: a decode batch is memory bound in the linear layers
(weights dominate) and in attention (KV dominates), while a large prefill is
compute bound in both; a mixed batch can be compute bound in its matmuls and
memory bound in its attention. Summing the per-component maxima captures that;
``per_component=False`` gives the classic single max(total FLOPs, total bytes).

A mixture of experts or a model with MLA (DeepSeek) is priced by moe_roofline.py instead
(roofline_cost_model picks), which adds the routed experts, MLA, --ep and --dp; this model is
the dense Llama family's.

Everything that depends only on the model and hardware is folded into
per-unit seconds at construction, so ``forward_time`` is a few multiply-adds
on the plan's precomputed summaries (O(1) per plan, ~1 µs in CPython).
"""

from __future__ import annotations

import numpy as np

from scheduler.core.forward_plan import ForwardPlan
from scheduler.model_config import ModelConfig
from simulator.costs.precision import MXFP4, NVFP4, Precision
from simulator.hardware.specs import HardwareConfigError, HardwareSpec


def activation_bytes_per_token(model: ModelConfig, dtype_bytes: int = 2, tp: int = 1) -> int:
    """Bytes of activations one token moves through the layers (reads + writes), on one of `tp` GPUs.

    Per layer: qkv_proj reads hidden and writes q+2kv; o_proj reads q and writes
    hidden; gate_up reads hidden and writes 2*intermediate; down reads
    intermediate and writes hidden; norms and residual adds move ~4*hidden.
    Plus the embedding row read at the start.
    """
    h, q = model.hidden_size, model.q_size // tp
    kv, i = model.kv_heads_per_gpu(tp) * model.head_dim, model.intermediate_size // tp
    per_layer = (h + q + 2 * kv) + (q + h) + (h + 2 * i) + (i + h) + 4 * h
    return (model.num_hidden_layers * per_layer + h) * dtype_bytes


def linear_peak_flops(hw: HardwareSpec, p: Precision) -> float:
    """Peak FLOP/s of the decoder layers' GEMMs: the tensor cores of the weights' format where the GPU
    has them, else bf16 ones (weight-only dequantization)."""
    if p.fp8_weights and hw.peak_flops_fp8 > 0:
        return hw.peak_flops_fp8
    if p.weights in (NVFP4, MXFP4) and hw.peak_flops_fp4 > 0:
        return hw.peak_flops_fp4
    return hw.peak_flops


class RooflineCostModel:
    """CostModel from FLOPs and bytes over the hardware's (efficiency-scaled) peaks."""

    __slots__ = (
        "name", "model", "hw", "dtype_bytes", "per_component", "precision",
        "_overhead_s", "_tok_flop_s", "_req_flop_s", "_pair_flop_s",
        "_weight_mem_s", "_tok_mem_s", "_req_mem_s", "_kv_read_s", "_kv_write_s",
        "tp", "_ar_fixed_s", "_ar_tok_s",
    )  # fmt: skip

    def __init__(
        self,
        model: ModelConfig,
        hw: HardwareSpec,
        dtype_bytes: int = 2,
        per_component: bool = True,
        tp: int = 1,
        precision: Precision | None = None,
    ) -> None:
        p = self.precision = precision or Precision()
        self.name = (
            f"roofline:{model.name}@{hw.name}"
            + (f",tp{tp}" if tp > 1 else "")
            + (f",{p.weights}-weights" if p.quantized_weights else "")
            + (",fp8-kv" if p.fp8_kv else "")
        )
        self.model = model
        self.hw = hw
        self.dtype_bytes = dtype_bytes
        self.per_component = per_component
        self.tp = tp
        if tp > 1 and hw.interconnect_bandwidth <= 0:
            raise HardwareConfigError(f"hardware {hw.name!r} has no interconnect (interconnect_bandwidth 0): --tp must be 1")

        flops = hw.peak_flops * hw.compute_efficiency
        # Quantized weights: the layers' GEMMs on the tensor cores of their format (fp8, fp4) where the
        # GPU has them, else bf16 ones (the engines dequantize weight-only there).
        linear_flops = linear_peak_flops(hw, p) * hw.compute_efficiency
        bw = hw.mem_bandwidth * hw.bandwidth_efficiency
        m = model
        layers = m.num_hidden_layers
        layer_mm_params = layers * m.layer_matmul_params(tp)
        logit_mm_params = -(-m.hidden_size * m.vocab_size // tp)
        kv_tok = m.kv_bytes_per_token(p.kv_bytes if p.fp8_kv else dtype_bytes, tp)
        linear_bytes = p.linear_weight_bytes if p.quantized_weights else dtype_bytes

        self._overhead_s = hw.kernel_launch_s + layers * hw.per_layer_overhead_s
        # Compute seconds per unit.
        self._tok_flop_s = 2.0 * layer_mm_params / linear_flops
        self._req_flop_s = 2.0 * logit_mm_params / flops
        self._pair_flop_s = 4.0 * layers * (m.num_attention_heads // tp) * m.head_dim / flops
        # Memory seconds: weights once per forward (the layers' matmul weights at linear_bytes, the
        # rest and the LM head at dtype_bytes), then per token / request / KV token.
        weight_bytes = (
            layer_mm_params * linear_bytes + (layers * m.layer_params(tp) - layer_mm_params) * dtype_bytes + logit_mm_params * dtype_bytes
        )
        self._weight_mem_s = weight_bytes / bw
        self._tok_mem_s = activation_bytes_per_token(m, dtype_bytes, tp) / bw
        self._req_mem_s = 4.0 * m.vocab_size / bw  # fp32 logits
        self._kv_read_s = kv_tok / bw
        self._kv_write_s = kv_tok / bw
        # All-reduces (TP > 1): a fixed time each, and a ring's 2 (T - 1) / T of the activations per token.
        all_reduces = 2 * layers + 1 if tp > 1 else 0
        self._ar_fixed_s = all_reduces * hw.interconnect_latency_s
        self._ar_tok_s = all_reduces * 2 * (tp - 1) / tp * m.hidden_size * dtype_bytes / hw.interconnect_bandwidth if tp > 1 else 0.0

    # ------------------------------------------------------------------ hot path
    def forward_time(self, plan: ForwardPlan) -> float:
        n = plan.num_tokens
        if n <= 0:
            if plan.req_pool_indices:
                raise ValueError(
                    "ForwardPlan has requests but num_tokens == 0: fill its cost summaries (ForwardPlan.summarize) before costing it"
                )
            return 0.0  # idle: nothing is launched
        b = len(plan.req_pool_indices)
        dense_c = n * self._tok_flop_s + b * self._req_flop_s
        dense_m = self._weight_mem_s + n * self._tok_mem_s + b * self._req_mem_s
        attn_c = plan.attention_pairs * self._pair_flop_s
        attn_m = plan.sum_seq_len * self._kv_read_s + n * self._kv_write_s
        # All-reduces (TP > 1; 0 otherwise) add outside the maxima: they do not overlap compute.
        fixed = self._overhead_s + self._ar_fixed_s + n * self._ar_tok_s if self.tp > 1 else self._overhead_s
        if self.per_component:
            return fixed + (dense_c if dense_c > dense_m else dense_m) + (attn_c if attn_c > attn_m else attn_m)
        c, mem = dense_c + attn_c, dense_m + attn_m
        return fixed + (c if c > mem else mem)

    def decode_forward_times(self, batch_size: int, sum_prefix_len: int, max_seq_len: int, num_steps: int) -> np.ndarray:
        """forward_time of num_steps consecutive decode steps of the same batch_size requests
        (step j: sum_prefix_len + j x batch_size prefix tokens), each equal to forward_time on
        that step's plan: the same float operations in the same order, elementwise."""
        n = b = batch_size
        # Each step's sum_seq_len (= attention_pairs) as floats: integers below 2**53, exact, as
        # forward_time's int-to-float conversions are. Then forward_time's operations in place
        # (a + b and b + a are the same float; the maxima of positive floats are np.maximum's).
        first = sum_prefix_len + n
        seq = np.arange(first, first + n * num_steps, n, dtype=np.float64)
        dense_c = n * self._tok_flop_s + b * self._req_flop_s
        dense_m = self._weight_mem_s + n * self._tok_mem_s + b * self._req_mem_s
        fixed = self._overhead_s + self._ar_fixed_s + n * self._ar_tok_s if self.tp > 1 else self._overhead_s
        # Every term grows with seq (a float product or sum with a positive constant is monotone):
        # where memory at the first step is no less than compute at the last, memory is the
        # maximum at every step, and compute is not computed (the usual decode: memory bound).
        last = float(first + n * (num_steps - 1))
        kv_write = n * self._kv_write_s
        attn_m = seq * self._kv_read_s
        attn_m += kv_write
        if self.per_component:
            dense = fixed + (dense_c if dense_c > dense_m else dense_m)
            if first * self._kv_read_s + kv_write >= last * self._pair_flop_s:
                attn_m += dense
                return attn_m
            out = np.maximum(seq * self._pair_flop_s, attn_m, out=attn_m)
            out += dense
            return out
        if (first * self._kv_read_s + kv_write) + dense_m >= last * self._pair_flop_s + dense_c:
            attn_m += dense_m
            attn_m += fixed
            return attn_m
        attn_c = seq * self._pair_flop_s
        attn_c += dense_c
        attn_m += dense_m
        out = np.maximum(attn_c, attn_m, out=attn_c)
        out += fixed
        return out

    def cpu_time(self, stage: str, num_reqs: int, num_tokens: int) -> float:
        return self.hw.cpu.time(stage, num_reqs, num_tokens)

    # ------------------------------------------------------------- inspection
    def breakdown(self, plan: ForwardPlan) -> dict[str, float]:
        """Seconds of each term of forward_time, for reports and debugging (not the hot path)."""
        n, b = plan.num_tokens, len(plan.req_pool_indices)
        return {
            "overhead_s": self._overhead_s if n > 0 else 0.0,
            "dense_compute_s": n * self._tok_flop_s + b * self._req_flop_s,
            "dense_memory_s": (self._weight_mem_s + n * self._tok_mem_s + b * self._req_mem_s) if n > 0 else 0.0,
            "attn_compute_s": plan.attention_pairs * self._pair_flop_s,
            "attn_memory_s": plan.sum_seq_len * self._kv_read_s + n * self._kv_write_s,
            "all_reduce_s": (self._ar_fixed_s + n * self._ar_tok_s) if n > 0 else 0.0,
            "total_s": self.forward_time(plan),
        }

    def __repr__(self) -> str:
        return f"RooflineCostModel({self.name!r}, dtype_bytes={self.dtype_bytes}, {self.precision.describe()})"
