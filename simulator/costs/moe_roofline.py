"""The roofline of a mixture of experts and of multi-head latent attention (MLA), per GPU of its busiest rank.

``RooflineCostModel`` (roofline.py) prices a dense Llama-family forward; a model with experts or
MLA (Qwen3-MoE, Mixtral, DeepSeek-V2/V3, gpt-oss) gets this one instead (``roofline_cost_model``
picks), with expert parallelism (--ep), attention data parallelism (--dp) and the experts' load
(--expert-imbalance). A dense model keeps the dense roofline, to the last bit.

Layout over G = tp x dp GPUs (ModelConfig.check_parallel): each of dp attention ranks serves its own
requests, with attention, the dense MLPs, the shared experts, the router and the LM head split over
its tp GPUs; the routed experts are spread over all G GPUs, E / ep whole experts an EP rank, each
split over G / ep GPUs. With --dp the one scheduler stands for the dp ranks together (its KV pool
is theirs summed: kv_capacity.py), its requests spread round-robin over them (SGLang's DP
controller's default): the busiest rank holds ceil(b / dp) of a forward's b requests and that share
s of its tokens, KV and attention pairs, and every rank waits for it (DP attention runs the ranks in
lockstep, as the MoE layers need all of them).

A forward of n tokens, b requests, S = sum_seq_len, P = sum_prefix_len, A = attention_pairs, on the
busiest rank (n_r = s n, b_r, S_r = s S, P_r = s P, A_r = s A):

    forward_time = kernel_launch_s + L * per_layer_overhead_s
                 + max(dense_flops / F, dense_bytes / B)       # attention projections, dense MLPs, shared experts, router, LM head
                 + max(attn_flops / F,  attn_bytes / B)        # attention over the KV cache
                 + max(expert_flops / F, expert_bytes / B)     # routed experts: the busiest EP rank's
                 + communication                                # outside the maxima

    dense_flops  = 2 * P_dense * n_r + 2 * hidden * E * L_moe * n_r + 2 * hidden * vocab / tp * b_r
    dense_bytes  = (P_dense + router + norms) * w + hidden * vocab / tp * w + activations * n_r + 4 * vocab * b_r
    expert_flops = L_moe * a * 2 * P_expert                   # a: expert-token assignments on the busiest EP rank
    expert_bytes = L_moe * u * P_expert * w + L_moe * a * expert activations   # u: the experts it touches

P_expert is one expert's gate/up/down on one GPU (3 hidden moe_intermediate / (G / ep)); a and u come
from the N = n tokens of all DP ranks (expert_load.py): balanced, a = N k / ep and
u = E / ep (1 - (1 - k / E)^N), the expected experts a batch touches, so a decode step reads only
the experts its tokens picked (at batch 1 the k active ones) while a large batch reads them all;
or AIConfigurator's power-law skew (--expert-imbalance ALPHA): the slowest rank's load (the most
expert time by these terms), averaged over seeded draws. Weights in a checkpoint's or --quantization's format (precision.py) at its bytes and tensor-
core peak: every matmul weight (fp8, fp8_block, nvfp4), or the routed experts only (gpt-oss's mxfp4);
the router, norms, embedding and LM head stay 16-bit.

Attention. GQA as the dense roofline: 4 L (H / tp) d FLOPs a pair, the KV heads of a GPU read per
context token. gpt-oss's sliding-window layers attend to at most W = sliding_window keys, priced as
min(A, n W) pairs and min(S, b W) tokens read (exact once every context reaches W, an upper bound
before); the KV pool still holds every token of every layer (no hybrid sliding-window pool). MLA
(DeepSeek) caches one latent per token and layer, kv_lora_rank + qk_rope_head_dim elements, which
every GPU of the attention TP group holds whole, and read so (S_r latents). Its FLOPs are the
cheaper of the engines' two ways, as SGLang picks per forward:
    absorbed (decode; SGLang's MLA path): 2 (H / tp) (2 kv_lora_rank + qk_rope_head_dim) L a pair
        (QK over the latent and RoPE key, PV over the latent);
    decompressed (prefill; SGLang's MHA path): 2 (H / tp) (qk_nope + qk_rope + v_head) L a pair, plus
        kv_b_proj on every cached prefix token, 2 kv_lora_rank (H / tp) (qk_nope + v_head) L each.
The projections' FLOPs (q, kv_a, kv_b and o for the new tokens, the absorbed W_UK / W_UV
included: the same multiply-adds as kv_b) are in the dense term.

Communication, priced from bytes over the interconnect of the hardware spec (no database figure):
    tp > 1: a ring all-reduce over tp after attention and after each dense MLP of every layer and
        after the embedding, of the rank's n_r tokens: latency + 2 (tp - 1) / tp n_r hidden w / link;
    dp = 1: each MoE layer's combine is the same all-reduce over tp (every GPU already holds every
        token after attention; expert parallelism without DP attention sends nothing more, as
        SGLang's default EP MoE);
    dp > 1: each MoE layer dispatches its tokens to the ranks of their experts and combines the
        results back (DeepEP-style all-to-all): per direction latency + n_r r hidden w / link, where r
        is the expected number of other EP ranks a token's k experts are on (expert_load.py); with
        ep = 1 (the MoE split by TP over all G GPUs) every GPU gathers the other ranks' tokens,
        n (dp - 1) / dp of them, and scatters the results back.

Left out, as the dense roofline leaves them: the MTP layers of DeepSeek-V3/R1 (speculative decoding
is not modelled), attention sinks' FLOPs (one logit per head), grouped-GEMM padding, and the
overlap of communication with compute (DeepEP's two-batch overlap).
"""

from __future__ import annotations

import numpy as np

from scheduler.core.forward_plan import ForwardPlan
from scheduler.model_config import ModelConfig
from simulator.costs.expert_load import ExpertLoad, remote_ranks_per_token
from simulator.costs.precision import Precision
from simulator.costs.roofline import RooflineCostModel, linear_peak_flops
from simulator.hardware.specs import HardwareConfigError, HardwareSpec


def roofline_cost_model(
    model: ModelConfig,
    hw: HardwareSpec,
    tp: int = 1,
    precision: Precision | None = None,
    ep: int = 1,
    dp: int = 1,
    expert_imbalance: float | None = None,
    dtype_bytes: int = 2,
    per_component: bool = True,
):
    """The roofline of `model`: the dense one for a dense model, MoeRooflineCostModel for experts or MLA."""
    if model.is_moe or model.is_mla:
        return MoeRooflineCostModel(model, hw, dtype_bytes, per_component, tp, precision, ep, dp, expert_imbalance)
    model.check_parallel(tp, ep, dp)  # --ep / --dp on a dense model: refused, naming them
    if expert_imbalance is not None:
        raise ValueError(f"--expert-imbalance {expert_imbalance:g}: {model.name} is a dense model (no experts to load)")
    return RooflineCostModel(model, hw, dtype_bytes, per_component, tp, precision)


def nonexpert_activation_bytes(model: ModelConfig, dtype_bytes: int = 2, tp: int = 1) -> int:
    """Activation bytes one token moves through everything but the routed experts, on one of `tp` GPUs:
    each projection's input read and output written, norms and residuals (4 hidden a layer), the
    router's logits, the embedding row."""
    m, h = model, model.hidden_size
    heads = m.num_attention_heads // tp
    if m.is_mla:
        q_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = (h + m.q_lora_rank) + (m.q_lora_rank + heads * q_head) if m.q_lora_rank else h + heads * q_head
        attn = q + (h + m.kv_lora_rank + m.qk_rope_head_dim) + (m.kv_lora_rank + heads * (m.qk_nope_head_dim + m.v_head_dim))
        attn += heads * m.v_head_dim + h
    else:
        qs, kv = m.q_size // tp, m.kv_heads_per_gpu(tp) * m.head_dim
        attn = (h + qs + 2 * kv) + (qs + h)
    per_layer = attn + 4 * h
    i = m.intermediate_size // tp
    total = m.num_hidden_layers * per_layer + m.num_dense_mlp_layers * ((h + 2 * i) + (i + h))
    if m.is_moe:
        s = m.shared_expert_intermediate_size // tp
        total += m.num_moe_layers * ((h + m.num_experts) + (((h + 2 * s) + (s + h)) if s else 0))
    return (total + h) * dtype_bytes


class MoeRooflineCostModel(RooflineCostModel):
    """The roofline of a mixture of experts and/or MLA over tp x dp GPUs, experts over ep (module docstring)."""

    __slots__ = (
        "ep", "dp", "expert_imbalance", "load", "_mla", "_swa_window", "_swa_pair_s", "_swa_read_s",
        "_abs_pair_s", "_mha_pair_s", "_decompress_s", "_e_flop_s", "_e_mem_s", "_e_act_s",
        "_ar_count", "_a2a_fixed_s", "_a2a_tok_s", "_a2a_total_s",
    )  # fmt: skip

    def __init__(
        self,
        model: ModelConfig,
        hw: HardwareSpec,
        dtype_bytes: int = 2,
        per_component: bool = True,
        tp: int = 1,
        precision: Precision | None = None,
        ep: int = 1,
        dp: int = 1,
        expert_imbalance: float | None = None,
    ) -> None:
        m = model
        m.check_parallel(tp, ep, dp)
        if expert_imbalance is not None and not m.is_moe:
            raise ValueError(f"--expert-imbalance {expert_imbalance:g}: {m.name} has no experts to load")
        p = self.precision = precision or Precision()
        self.model, self.hw, self.dtype_bytes, self.per_component = m, hw, dtype_bytes, per_component
        self.tp, self.ep, self.dp, self.expert_imbalance = tp, ep, dp, expert_imbalance
        gpus = tp * dp
        if gpus > 1 and hw.interconnect_bandwidth <= 0:
            raise HardwareConfigError(f"hardware {hw.name!r} has no interconnect (interconnect_bandwidth 0): one GPU only (--tp 1 --dp 1)")
        self.name = (
            f"roofline:{m.name}@{hw.name}"
            + (f",tp{tp}" if tp > 1 else "")
            + (f",dp{dp}" if dp > 1 else "")
            + (f",ep{ep}" if ep > 1 else "")
            + (f",{p.weights}{'-expert' if p.experts_only else ''}-weights" if p.quantized_weights else "")
            + (",fp8-kv" if p.fp8_kv else "")
            + (f",imbalance{expert_imbalance:g}" if expert_imbalance is not None else "")
        )
        w = dtype_bytes
        flops = hw.peak_flops * hw.compute_efficiency
        bw = hw.mem_bandwidth * hw.bandwidth_efficiency
        quant_flops = linear_peak_flops(hw, p) * hw.compute_efficiency
        quant_bytes = p.linear_weight_bytes if p.quantized_weights else w
        # The routed experts in the weights' format; the other matmuls too unless it covers experts only.
        ne_flops, ne_bytes = (flops, w) if p.experts_only else (quant_flops, quant_bytes)
        layers, h, moe_layers = m.num_hidden_layers, m.hidden_size, m.num_moe_layers
        moe_tp = m.moe_tp(tp, ep, dp)

        # --- dense term: everything but the routed experts, on one GPU of the attention TP group
        routed = m.routed_expert_params(tp, ep, dp)
        ne_matmul = m.decoder_matmul_params(tp, ep, dp) - routed
        router = moe_layers * h * m.num_experts
        expert_biases = moe_layers * (m.num_experts // ep) * m.expert_bias_params(moe_tp) if m.is_moe else 0
        other = m.decoder_params(tp, ep, dp) - ne_matmul - routed - expert_biases  # norms, biases, routers
        logit = -(-h * m.vocab_size // tp)
        self._overhead_s = hw.kernel_launch_s + layers * hw.per_layer_overhead_s
        self._tok_flop_s = 2.0 * ne_matmul / ne_flops + 2.0 * router / flops
        self._req_flop_s = 2.0 * logit / flops
        self._weight_mem_s = (ne_matmul * ne_bytes + other * w + logit * w) / bw
        self._tok_mem_s = nonexpert_activation_bytes(m, w, tp) / bw
        self._req_mem_s = 4.0 * m.vocab_size / bw  # fp32 logits

        # --- attention
        kv_bytes = p.kv_bytes if p.fp8_kv else w
        kv_tok = m.kv_bytes_per_token(kv_bytes, tp)
        heads = m.num_attention_heads // tp
        self._mla = m.is_mla
        swa_layers = m.sliding_window_layers if m.sliding_window else 0
        full_layers = layers - swa_layers
        self._swa_window = m.sliding_window if swa_layers else 0
        per_layer_pair = 4.0 * heads * m.head_dim / flops
        per_layer_kv = kv_tok / layers / bw
        self._pair_flop_s = full_layers * per_layer_pair
        self._kv_read_s = full_layers * per_layer_kv
        self._swa_pair_s = swa_layers * per_layer_pair
        self._swa_read_s = swa_layers * per_layer_kv
        self._kv_write_s = kv_tok / bw
        if m.is_mla:  # the latents of every layer are read as any KV (kv_tok), and priced by the cheaper path
            self._abs_pair_s = 2.0 * heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim) * layers / flops
            self._mha_pair_s = 2.0 * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) * layers / flops
            self._decompress_s = 2.0 * m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim) * layers / ne_flops
        else:
            self._abs_pair_s = self._mha_pair_s = self._decompress_s = 0.0

        # --- routed experts, per assignment and per touched expert on the busiest EP rank
        if m.is_moe:
            expert = m.expert_matmul_params(moe_tp)
            i_e = m.moe_intermediate_size // moe_tp
            self._e_flop_s = moe_layers * 2.0 * expert / quant_flops
            self._e_mem_s = moe_layers * (expert * quant_bytes + m.expert_bias_params(moe_tp) * w) / bw
            self._e_act_s = moe_layers * ((h + 2 * i_e) + (i_e + h)) * w / bw
            rank_time = (self._e_flop_s, self._e_mem_s, self._e_act_s)
            self.load = ExpertLoad(m.num_experts, m.num_experts_per_tok, ep, expert_imbalance, rank_time)
        else:
            self.load = None
            self._e_flop_s = self._e_mem_s = self._e_act_s = 0.0

        # --- communication
        link, lat = hw.interconnect_bandwidth, hw.interconnect_latency_s
        ring = 2 * (tp - 1) / tp * h * w / link if tp > 1 else 0.0
        # All-reduces over tp of the rank's tokens: after attention, after each dense MLP, after the
        # embedding; and after each MoE layer too while dp = 1 (the combine).
        self._ar_count = (layers + m.num_dense_mlp_layers + 1 + (moe_layers if dp == 1 else 0)) if tp > 1 else 0
        self._ar_fixed_s = self._ar_count * lat
        self._ar_tok_s = self._ar_count * ring
        # DP attention: each MoE layer's dispatch and combine (two directions).
        self._a2a_fixed_s = self._a2a_tok_s = self._a2a_total_s = 0.0
        if dp > 1 and moe_layers:
            self._a2a_fixed_s = 2 * moe_layers * lat
            if ep > 1:
                remote = remote_ranks_per_token(m.num_experts, m.num_experts_per_tok, ep)
                self._a2a_tok_s = 2 * moe_layers * remote * h * w / link
            else:
                self._a2a_total_s = 2 * moe_layers * (dp - 1) / dp * h * w / link

    # ------------------------------------------------------------------ hot path
    def _share(self, b: int) -> float:
        """The busiest DP rank's share of a forward's b requests (and of its tokens, KV and pairs)."""
        dp = self.dp
        return 1.0 if dp == 1 or b == 0 else (-(-b // dp)) / b

    def _fixed(self, n: int, n_r: float) -> tuple[float, float]:
        """(launch and overheads, communication) of a forward of n tokens, n_r on the busiest rank."""
        comm = self._ar_fixed_s + n_r * self._ar_tok_s
        if self.dp > 1:
            comm += self._a2a_fixed_s + n_r * self._a2a_tok_s + n * self._a2a_total_s
        return self._overhead_s, comm

    def _parts(self, n: int, b: int) -> tuple[float, float, float, float, float]:
        """What a forward's step-invariant terms are for n tokens, b requests: (share, dense compute,
        dense memory, expert compute, expert memory)."""
        s = self._share(b)
        n_r, b_r = n * s, -(-b // self.dp)
        dense_c = n_r * self._tok_flop_s + b_r * self._req_flop_s
        dense_m = self._weight_mem_s + n_r * self._tok_mem_s + b_r * self._req_mem_s
        if self.load is None:
            return s, dense_c, dense_m, 0.0, 0.0
        a, u = self.load.busiest_rank(n)
        return s, dense_c, dense_m, a * self._e_flop_s, u * self._e_mem_s + a * self._e_act_s

    def _base(self, n: int, b: int) -> tuple[float, float, float, float]:
        """(share, the step-invariant time per component, the summed dense + expert compute and memory)
        as forward_time adds them: launch + communication + dense + experts (per component) or the
        non-attention FLOPs and bytes (one max)."""
        s, dense_c, dense_m, exp_c, exp_m = self._parts(n, b)
        overhead, comm = self._fixed(n, n * s)
        if self.per_component:
            return s, overhead + comm + (dense_c if dense_c > dense_m else dense_m) + (exp_c if exp_c > exp_m else exp_m), 0.0, 0.0
        return s, overhead + comm, dense_c + exp_c, dense_m + exp_m

    def forward_time(self, plan: ForwardPlan) -> float:
        n = plan.num_tokens
        if n <= 0:
            if plan.req_pool_indices:
                raise ValueError(
                    "ForwardPlan has requests but num_tokens == 0: fill its cost summaries (ForwardPlan.summarize) before costing it"
                )
            return 0.0
        b = len(plan.req_pool_indices)
        s, base, c0, m0 = self._base(n, b)
        attn_c, attn_m = self._attention(plan.attention_pairs * s, plan.sum_seq_len * s, plan.sum_prefix_len * s, n * s, -(-b // self.dp))
        if self.per_component:
            return base + (attn_c if attn_c > attn_m else attn_m)
        c, mem = c0 + attn_c, m0 + attn_m
        return base + (c if c > mem else mem)

    def _attention(self, pairs: float, seq: float, prefix: float, n_r: float, b_r: int) -> tuple[float, float]:
        """(compute, memory) seconds of attention on the busiest rank."""
        write = n_r * self._kv_write_s
        if self._mla:
            absorbed, decompressed = pairs * self._abs_pair_s, pairs * self._mha_pair_s + prefix * self._decompress_s
            return (absorbed if absorbed < decompressed else decompressed), seq * self._kv_read_s + write
        c, m = pairs * self._pair_flop_s, seq * self._kv_read_s + write
        if self._swa_window:
            window_pairs, window_keys = n_r * self._swa_window, b_r * self._swa_window
            c += (pairs if pairs < window_pairs else window_pairs) * self._swa_pair_s
            m += (seq if seq < window_keys else window_keys) * self._swa_read_s
        return c, m

    def decode_forward_times(self, batch_size: int, sum_prefix_len: int, max_seq_len: int, num_steps: int) -> np.ndarray:
        """forward_time of num_steps consecutive decode steps of the same batch_size requests (step j:
        sum_prefix_len + j x batch_size prefix tokens, attention_pairs = sum_seq_len), elementwise the
        same float operations as forward_time on each step's plan."""
        n = b = batch_size
        s, base, c0, m0 = self._base(n, b)
        first = sum_prefix_len + n
        raw = np.arange(first, first + n * num_steps, n, dtype=np.float64)
        pairs, seq, prefix = raw * s, raw * s, (raw - n) * s
        n_r, b_r = n * s, -(-b // self.dp)
        write = n_r * self._kv_write_s
        attn_m = seq * self._kv_read_s
        attn_m += write
        if self._mla:
            decompressed = pairs * self._mha_pair_s
            decompressed += prefix * self._decompress_s
            attn_c = np.minimum(pairs * self._abs_pair_s, decompressed)
        else:
            attn_c = pairs * self._pair_flop_s
            if self._swa_window:
                attn_c += np.minimum(pairs, n_r * self._swa_window) * self._swa_pair_s
                attn_m += np.minimum(seq, b_r * self._swa_window) * self._swa_read_s
        if self.per_component:
            out = np.maximum(attn_c, attn_m)
            return base + out
        attn_c += c0
        attn_m += m0
        return base + np.maximum(attn_c, attn_m)

    # ------------------------------------------------------------- inspection
    def breakdown(self, plan: ForwardPlan) -> dict[str, float]:
        """Seconds of each term of forward_time (not the hot path)."""
        n, b = plan.num_tokens, len(plan.req_pool_indices)
        if n <= 0:
            return {"total_s": 0.0}
        s, dense_c, dense_m, exp_c, exp_m = self._parts(n, b)
        overhead, comm = self._fixed(n, n * s)
        attn_c, attn_m = self._attention(plan.attention_pairs * s, plan.sum_seq_len * s, plan.sum_prefix_len * s, n * s, -(-b // self.dp))
        a, u = self.load.busiest_rank(n) if self.load is not None else (0.0, 0.0)
        return {
            "overhead_s": overhead,
            "dense_compute_s": dense_c,
            "dense_memory_s": dense_m,
            "attn_compute_s": attn_c,
            "attn_memory_s": attn_m,
            "expert_compute_s": exp_c,
            "expert_memory_s": exp_m,
            "communication_s": comm,
            "busiest_rank_share": s,
            "expert_assignments": a,
            "experts_touched": u,
            "total_s": self.forward_time(plan),
        }

    def __repr__(self) -> str:
        return f"MoeRooflineCostModel({self.name!r}, tp={self.tp}, dp={self.dp}, ep={self.ep}, {self.precision.describe()})"


def decode_floor_s(
    model: ModelConfig, hw: HardwareSpec, precision: Precision | None = None, tp: int = 1, ep: int = 1, dp: int = 1
) -> float:
    """The weights one decode step of one token reads at full HBM bandwidth, on one GPU: everything but
    the routed experts, the LM head, and the token's k experts as balanced routing spreads them (k / ep
    of them a GPU, each split over its (tp x dp) / ep GPUs). A lower bound of a batch-1 decode step
    (no KV, no overheads, no communication)."""
    p = precision or Precision()
    w = 2
    q = p.linear_weight_bytes if p.quantized_weights else w
    ne_q = w if p.experts_only else q
    moe_tp = model.moe_tp(tp, ep, dp)
    routed = model.routed_expert_params(tp, ep, dp)
    ne_matmul = model.decoder_matmul_params(tp, ep, dp) - routed
    # Norms, biases and routers, with only the picked experts' biases.
    other = model.decoder_params(tp, ep, dp) - model.decoder_matmul_params(tp, ep, dp)
    k, moe_layers = model.num_experts_per_tok, model.num_moe_layers
    other -= moe_layers * (model.num_experts // ep - k / ep) * model.expert_bias_params(moe_tp) if model.is_moe else 0
    active = moe_layers * k / ep * model.expert_matmul_params(moe_tp) if model.is_moe else 0
    logit = -(-model.hidden_size * model.vocab_size // tp)
    return (ne_matmul * ne_q + other * w + logit * w + active * q) / hw.mem_bandwidth
