"""The dimensions one GPU of a TP group computes a model's forward with, and that forward's kernels
priced from AIConfigurator's database (simulator/profiles/kernel_db.py): the layer GEMMs, norms and
all-reduces, a mixture of experts' router and fused-MoE kernel, and GQA, MLA (vLLM's from its module
tables: mla_module.py) or DeepSeek's sparse attention (sparse_attention.py), and Qwen3.5's
Gated DeltaNet layers (linear_attention.py). simulator/profiles/kernel_profile.py tabulates them on grids into a profile."""

from __future__ import annotations

from dataclasses import dataclass, replace

from scheduler.model_config import ModelConfig
from simulator.costs.expert_load import spread_row_tokens
from simulator.costs.precision import BF16, FP8
from simulator.profiles.kernel_db import KernelDatabase, KernelDataMissing
from simulator.profiles.linear_attention import LinearAttention
from simulator.profiles.mla_module import MlaModule
from simulator.profiles.sliding_window import SlidingWindow
from simulator.profiles.sparse_attention import SparseAttention

# The token load the experts are priced under: by default balanced (each token's experts drawn
# uniformly at random, as the roofline's expert_load.py has it), priced from the database's balanced
# rows, whose routing spreads the tokens over as many experts as it can (experts_kernel); with
# --expert-imbalance ALPHA its power_law_ALPHA rows (it measures 1.01 and 1.2: the power-law skew of
# AIConfigurator's SDK, whose fused-MoE kernel then waits for its most loaded experts).
BALANCED = "balanced"
# The all-reduce of a layer's q and k norm variances (qk_norm_over_heads): two fp32 a token, the bytes
# of four bf16 elements, the database's all-reduce rows being of bf16 messages.
QK_NORM_VARIANCES = 4


def expert_load_name(imbalance: float | None) -> str:
    """The database's name of the experts' token load for --expert-imbalance (None: balanced)."""
    return BALANCED if imbalance is None else f"power_law_{imbalance:g}"


@dataclass(frozen=True)
class GpuShapes:
    """The dimensions one of `tp` GPUs computes with (as SGLang and vLLM shard a Llama-family model)."""

    layers: int
    hidden: int
    head_dim: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tp: int
    qk_norm: bool
    # q and k normalized over all heads (ModelConfig.qk_norm_over_heads): one all-reduce of the
    # variances a layer across TP.
    qk_norm_over_heads: bool = False
    # The database's tables that price each kernel (GEMMQuantMode, KVCacheQuantMode, FMHAQuantMode names).
    gemm_quant: str = BF16  # the four layer GEMMs (the LM head is always bf16)
    prefill_kv: str = BF16
    prefill_fmha: str = BF16
    decode_kv: str = BF16
    # A mixture of experts (0 experts: a dense model). The routed experts go over the TP GPUs: each
    # split over all of them without expert parallelism (moe_tp = tp), as vLLM and SGLang run them
    # without --ep; with --ep N, num_experts / N whole experts a rank, each split over tp / N GPUs.
    # The tokens are on every TP GPU after attention's all-reduce, so each rank routes them to its own
    # experts and the outputs are summed by the same all-reduce as TP's: no all-to-all.
    experts: int = 0
    topk: int = 0
    expert_intermediate: int = 0  # one routed expert's width, whole (the MoE kernel takes moe_tp)
    shared_intermediate: int = 0  # the shared experts' width on one GPU
    moe_share: float = 0.0  # the layers that route (the others have a dense MLP of `intermediate`)
    moe_ep: int = 1
    # Attention data parallelism (--dp): dp ranks, each with its own requests and attention over its
    # tp GPUs; the routed experts go over all tp x dp GPUs (moe_tp = tp x dp / moe_ep) and take every
    # rank's tokens, exchanged before and after them (the database's MoEDispatch: vLLM's all-gather
    # and reduce-scatter over the expert-parallel group, SGLang's DP gather and scatter), which
    # replaces the MoE layer's TP all-reduce.
    dp: int = 1
    # Where the database has no rows of the experts' split (moe_tp: MiniMax-M2.5 over 8 GPUs), the time
    # at moe_tp follows the database's own trend over its two largest splits: t(m) = t(m/2)^2 / t(m/4).
    moe_split_extrapolated: bool = False
    expert_load: str = BALANCED
    # The experts' format where the checkpoint quantizes them only (gpt-oss's MXFP4: the database's
    # MoEQuantMode of its kernel, expert_format.py); None: the layer GEMMs' (gemm_quant).
    expert_quant: str | None = None
    # DeepSeek's multi-head latent attention (0 kv_lora: GQA, above). q and the KV go through latents
    # of q_lora and kv_lora (plus qk_rope RoPE dims shared by the heads); each of `heads` heads has
    # qk_nope + qk_rope query/key dims and v_head value dims. As SGLang runs it (and AIConfigurator's
    # DEEPSEEK model composes it): a prefill decompresses the latent KV (kv_b_proj) and runs MHA over
    # it; a decode moves each query into the latent (bmm pre), attends there (MQA over the latent)
    # and moves the output back to the heads' values (bmm post).
    kv_lora: int = 0
    q_lora: int = 0
    qk_nope: int = 0
    qk_rope: int = 0
    v_head: int = 0
    # DeepSeek Sparse Attention (GLM-5): MLA over the tokens an indexer picks, priced by its own module
    # (sparse_attention.py) in place of the MLA attention above; None for any other attention.
    sparse: SparseAttention | None = None
    # vLLM's MLA: the database's MLA module rows price the whole attention block, projections included
    # (mla_module.py), where it has no per-kernel MLA tables; None: the MLA kernels above.
    mla_module: MlaModule | None = None
    # Sliding-window layers (gpt-oss): their share of the layers attends the last `window` tokens, priced
    # from the database's windowed attention rows (sliding_window.py); None: every layer attends all.
    sliding: SlidingWindow | None = None
    # Hybrid linear attention (Qwen3.5): its share of the layers are Gated DeltaNet, priced by their own
    # module (linear_attention.py); the others are the GQA above. None: every layer is attention.
    linear_attention: LinearAttention | None = None
    # The full attention's output gate (Qwen3.5): q_proj emits a gate as wide as q beside it.
    output_gate: bool = False

    @classmethod
    def of(cls, model: ModelConfig, tp: int, ep: int = 1, dp: int = 1) -> "GpuShapes":
        moe = (
            dict(
                experts=model.num_experts,
                topk=model.num_experts_per_tok,
                expert_intermediate=model.moe_intermediate_size,
                shared_intermediate=model.shared_expert_intermediate_size // tp,
                moe_share=model.num_moe_layers / model.num_hidden_layers,
                moe_ep=ep,
                dp=dp,
            )
            if model.is_moe
            else {}
        )
        if model.is_mla:
            moe |= dict(
                kv_lora=model.kv_lora_rank,
                q_lora=model.q_lora_rank or 0,
                qk_nope=model.qk_nope_head_dim,
                qk_rope=model.qk_rope_head_dim,
                v_head=model.v_head_dim,
                sparse=SparseAttention.of(model),
            )
        return cls(
            model.num_hidden_layers,
            model.hidden_size,
            model.head_dim,
            model.num_attention_heads // tp,
            model.kv_heads_per_gpu(tp),
            model.intermediate_size // tp,
            -(-model.vocab_size // tp),
            tp,
            model.qk_norm,
            qk_norm_over_heads=model.qk_norm_over_heads,
            sliding=SlidingWindow.of(model),
            linear_attention=LinearAttention.of(model, tp),
            output_gate=model.attn_output_gate,
            **moe,
        )

    @property
    def moe_tp(self) -> int:
        """The GPUs one routed expert is split over."""
        return self.tp * self.dp // self.moe_ep

    def layer_kernels(self, db: KernelDatabase, n: int) -> dict[str, float]:
        """Seconds of each non-attention kernel of one (average) layer over n tokens (of one attention
        DP rank; the routed experts, which take every rank's tokens, are all_ranks_kernels' with dp > 1)."""
        h, d = self.hidden, self.head_dim
        if self.sparse is not None and self.sparse.prices_projections:
            kernels = {}  # the DSA module's rows hold the attention's projections (sparse_attention.py)
        elif self.mla_module is not None:
            kernels = {}  # so do the MLA module's (mla_module.py)
        elif self.kv_lora:
            qk = self.heads * (self.qk_nope + self.qk_rope)
            kernels = {
                # The latents' down-projection, fused (q's latent, the KV latent and the RoPE key), replicated
                # on every GPU; then q's up-projection, split over the heads.
                "qkv_a_proj": self.linear(db, n, self.q_lora + self.kv_lora + self.qk_rope, h),
                "q_b_proj": self.linear(db, n, qk, self.q_lora) if self.q_lora else 0.0,
                "o_proj": self.linear(db, n, h, self.heads * self.v_head),
            }
            if not self.q_lora:  # (DeepSeek-V2-Lite: q projected directly)
                kernels["qkv_a_proj"] = self.linear(db, n, qk + self.kv_lora + self.qk_rope, h)
        else:
            q_out = 2 * self.heads if self.output_gate else self.heads
            full = 1.0 - self.linear_attention.share if self.linear_attention else 1.0  # the layers of full attention
            kernels = {
                "qkv_proj": full * self.linear(db, n, (q_out + 2 * self.kv_heads) * d, h),
                "o_proj": full * self.linear(db, n, h, self.heads * d),
            }
            if self.linear_attention:
                kernels |= self.linear_attention.projections(db, self.linear, n)
        # The all-reduces over TP after attention and after the MLP; with dp > 1 a MoE layer's exchange
        # (moe_dispatch, below) takes the second one's place.
        after_mlp = 1.0 - self.moe_share if self.experts and self.dp > 1 else 1.0
        kernels |= {
            "norms": 2 * db.elementwise(n, 2 * h, 2 * h),
            "all_reduce": (1.0 + after_mlp) * db.all_reduce(n, h, self.tp),
        }
        if self.qk_norm_over_heads and self.tp > 1:
            kernels["qk_norm_all_reduce"] = db.all_reduce(n, QK_NORM_VARIANCES, self.tp)
        dense = 1.0 - self.moe_share  # the layers with a dense MLP
        if dense > 0:
            kernels["gate_up_proj"] = dense * self.linear(db, n, 2 * self.intermediate, h)
            kernels["down_proj"] = dense * self.linear(db, n, h, self.intermediate)
            kernels["act_fn"] = dense * db.elementwise(n, 2 * self.intermediate, self.intermediate)
        if self.experts:
            share = self.moe_share
            # The router's gate stays in bf16 (neither engine quantizes it); the routed experts are the
            # backend's fused-MoE kernel (gate-up GEMM, activation, down GEMM, token permutation).
            kernels["router"] = share * db.gemm(n, self.experts, h)
            if self.dp == 1:
                kernels["experts"] = share * self.experts_kernel(db, n)
            else:
                kernels["moe_dispatch"] = share * sum(
                    db.moe_dispatch(n, h, self.topk, self.experts, self.moe_tp, self.moe_ep, self.dp, pre, self.moe_quant)
                    for pre in (True, False)
                )
            if self.shared_intermediate:
                i = self.shared_intermediate
                kernels["shared_experts"] = share * (self.linear(db, n, 2 * i, h) + self.linear(db, n, h, i) + db.elementwise(n, 2 * i, i))
        return kernels

    def all_ranks_kernels(self, db: KernelDatabase, n: int) -> dict[str, float]:
        """With dp > 1: seconds of one (average) layer's kernels that take the n tokens of every DP
        rank together (the routed experts); empty otherwise."""
        if not self.experts or self.dp == 1:
            return {}
        return {"experts": self.moe_share * self.experts_kernel(db, n)}

    def linear(self, db: KernelDatabase, m: int, n: int, k: int, quant: str | None = None) -> float:
        """A layer GEMM in the weights' format (or `quant`), m tokens x k in -> n out.

        At one token a GEMM reads its weights and little else, and quantized weights are fewer bytes,
        so a quantized row slower than bf16's there measured a per-call floor of the backend's host
        path, not the GPU: vLLM's block-fp8 rows take about 60 us at every size up to 4096 x 4096 on
        an H200 (bf16 12-16 us; reading the weights 3.5 us). Served forwards replay CUDA graphs (and
        larger eager GEMMs hide the host behind the GPU), so such a shape is priced at no more than
        the bf16 GEMM of the same shape, which reads twice the bytes at half the tensor rate."""
        quant = quant or self.gemm_quant
        t = db.gemm(m, n, k, quant)
        if quant != BF16 and db.gemm(1, n, k, quant) > db.gemm(1, n, k, BF16):
            t = min(t, db.gemm(m, n, k, BF16))
        return t

    def experts_kernel(self, db: KernelDatabase, n: int, moe_tp: int | None = None) -> float:
        """The fused-MoE kernel over n tokens, the experts split over moe_tp GPUs (default: this layout's).

        Balanced load: the database's balanced rows spread n tokens over min(n k, E) experts, random
        routing touches fewer (expert_load.spread_row_tokens), and the weights of those it leaves are
        not read. So the row at n is taken less what the rows spend reading them: the row where the
        spread touches every expert (n = E / k, or n itself below it) less the row that touches as
        many as random routing does. Below E / k that is the latter row; far above it the two meet."""
        moe_tp = moe_tp or self.moe_tp
        if self.moe_split_extrapolated and moe_tp == self.moe_tp:
            half, quarter = self.experts_kernel(db, n, moe_tp // 2), self.experts_kernel(db, n, moe_tp // 4)
            return half * half / quarter

        def row(tokens: int) -> float:
            q = self.moe_quant
            return db.moe(tokens, self.hidden, self.expert_intermediate, self.topk, self.experts, moe_tp, self.moe_ep, q, self.expert_load)

        t = row(n)
        if self.expert_load == BALANCED and n > 1:
            spread = min(n, -(-self.experts // self.topk))
            random = max(1, round(spread_row_tokens(n, self.experts, self.topk)))
            if random < spread:
                # (a table that is not monotone takes nothing off, and never below the row of as many experts)
                t = max(row(random), t - max(0.0, row(spread) - row(random)))
        return t

    @property
    def moe_quant(self) -> str:
        """The database's MoE quant mode of the routed experts."""
        return self.expert_quant or self.gemm_quant

    def with_experts_priced(self, db: KernelDatabase) -> "GpuShapes":
        """These shapes, extrapolating the experts' split where the database has no rows of it but has
        rows of half and a quarter of it (KernelDataMissing where it has neither)."""
        if not self.experts:
            return self
        try:
            self.experts_kernel(db, 1)
            return self
        except KernelDataMissing:
            moe_tp = self.moe_tp
            if moe_tp < 4 or moe_tp % 4:
                raise
            extrapolated = replace(self, moe_split_extrapolated=True)
            extrapolated.experts_kernel(db, 1)  # raises if the database lacks the smaller splits too
            return extrapolated

    @property
    def mla_bmm_quant(self) -> str:
        """The latent BMMs' format: fp8 with fp8 weights (SGLang quantizes them per tensor), else bf16."""
        return FP8 if self.gemm_quant in (FP8, "fp8_block") else BF16

    def embedding(self, db: KernelDatabase, n: int) -> float:
        return db.embedding(n, self.vocab, self.hidden) + db.all_reduce(n, self.hidden, self.tp)

    def lm_head(self, db: KernelDatabase, requests: int) -> float:
        # bf16 with fp8 weights too: the engines quantize linear layers only, not the vocabulary-parallel LM head.
        return db.gemm(requests, self.vocab, self.hidden)

    def prefill_attention(self, db: KernelDatabase, batch: int, new_tokens: int, prefix: int) -> float:
        if self.sparse is not None:
            return self.sparse.prefill(db, self, batch, new_tokens, prefix)
        if self.mla_module is not None:
            return self.mla_module.prefill(db, self, batch, new_tokens, prefix)
        if self.kv_lora:
            kv_b = self.linear(db, batch * new_tokens, self.heads * (self.qk_nope + self.v_head), self.kv_lora)
            return kv_b + db.context_mla(batch, new_tokens, prefix, self.heads, self.prefill_kv, self.prefill_fmha)

        def attend(window: int) -> float:
            h, kv, d = self.heads, self.kv_heads, self.head_dim
            return db.context_attention(batch, new_tokens, prefix, h, kv, d, self.qk_norm, self.prefill_kv, self.prefill_fmha, window)

        if self.linear_attention:
            la = self.linear_attention
            return (1.0 - la.share) * attend(0) + la.prefill(db, batch, new_tokens)
        return self.sliding.layer_mean(attend) if self.sliding else attend(0)

    def decode_attention(self, db: KernelDatabase, batch: int, context: int) -> float:
        if self.sparse is not None:
            return self.sparse.decode(db, self, batch, context)
        if self.mla_module is not None:
            return self.mla_module.decode(db, self, batch, context)
        if self.kv_lora:
            bmm = db.mla_bmm(batch, self.heads, self.mla_bmm_quant, True) + db.mla_bmm(batch, self.heads, self.mla_bmm_quant, False)
            return bmm + db.generation_mla(batch, context, self.heads, self.decode_kv)

        def attend(window: int) -> float:
            return db.generation_attention(batch, context, self.heads, self.kv_heads, self.head_dim, self.qk_norm, self.decode_kv, window)

        if self.linear_attention:
            la = self.linear_attention
            return (1.0 - la.share) * attend(0) + la.decode(db, batch)
        return self.sliding.layer_mean(attend) if self.sliding else attend(0)
