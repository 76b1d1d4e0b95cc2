"""DeepSeek Sparse Attention (DSA: GLM-5, as DeepSeek-V3.2) priced from AIConfigurator's database.

DSA is MLA whose every query attends only index_topk of its layer's cached tokens: those a lightweight
indexer scores highest (index_n_heads heads of index_head_dim over keys of its own, cached in fp8 beside
MLA's latent). Its attention block is priced the first of two ways the database answers:

module    the database's DSA module tables (dsa_context_module, dsa_generation_module), as AIConfigurator's
          SDK prices GLM-5 and DeepSeek-V3.2 (its DEEPSEEKV32 model: ContextDSAModule, GenerationDSAModule):
          the whole block measured at once for the model's architecture, heads a GPU, KV-cache dtype and
          GEMM format: the latents' and q's projections, the indexer (its projections, fp8 logits over
          every cached key, top-k), the sparse MLA over the picked tokens, the latent BMMs and o_proj.
          The layer's projections are then not priced again (GpuShapes.layer_kernels).
composed  where it has none (no DSA rows for the system and backend, or per-tensor fp8 weights, of which
          it measured no DSA module): the projections as MLA's (layer_kernels), MLA attention over
          min(context, index_topk) tokens from its MLA tables (measured at DeepSeek-V3's head sizes), and
          the indexer as what it is over the whole context: its projections as GEMMs, its logits as the
          database's MQA attention of index_n_heads heads over one key head of index_head_dim (which also
          reads a V the indexer has not: an upper bound), and its top-k as an element-wise pass over the
          logits. The profile says which (precision.sparse_attention) and why.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from scheduler.model_config import ModelConfig
from simulator.costs.precision import BF16, FP8, FP8_BLOCK, NVFP4
from simulator.profiles.kernel_db import KernelDatabase, KernelDatabaseError, KernelDataMissing

# The DSA module rows' GEMM format for the weights' format: the database measured bf16 and 128x128-block
# fp8 projections. NVIDIA's NVFP4 checkpoint of GLM-5 keeps attention in bf16 (its hf_quant_config
# excludes every layer's self_attn), so nvfp4 weights take the bf16 rows, as AIConfigurator's
# attention_projection_exclusions do. Per-tensor fp8 (and float16) has no rows: composed.
MODULE_GEMM = {BF16: BF16, FP8_BLOCK: FP8_BLOCK, NVFP4: BF16}
# The shape each pricing is first asked at, to find whether the database answers it at all.
_PROBE_BATCH, _PROBE_CONTEXT = 1, 4096


class Shapes(Protocol):
    """What the sparse attention reads of the GPU's shapes (simulator/profiles/gpu_shapes.py, which holds it)."""

    hidden: int
    heads: int
    q_lora: int
    kv_lora: int
    qk_nope: int
    v_head: int
    gemm_quant: str
    prefill_kv: str
    prefill_fmha: str
    decode_kv: str

    @property
    def mla_bmm_quant(self) -> str: ...

    def linear(self, db: KernelDatabase, m: int, n: int, k: int) -> float: ...


@dataclass(frozen=True)
class SparseAttention:
    """One GPU's DSA shapes (the indexer is replicated on every GPU of a TP group, as SGLang builds it)
    and which of the database's tables price them."""

    architecture: str  # the DSA module rows are the architecture's (GlmMoeDsaForCausalLM)
    topk: int  # cached tokens each query's MLA attends to
    index_heads: int
    index_head_dim: int
    # The DSA module rows' GEMM format that prices the block; None: composed from MLA and the indexer.
    module_gemm: str | None = None
    # Composed: the (KV, attention) dtypes of the database's MQA tables that price the indexer's logits
    # (fp8 keys, as SGLang caches them, where it measured fp8-KV attention), and why no module priced it.
    indexer_kv: str = FP8
    indexer_fmha: str = FP8
    why_composed: str | None = None

    @classmethod
    def of(cls, model: ModelConfig) -> "SparseAttention | None":
        if not model.is_dsa:
            return None
        return cls(model.architecture, model.index_topk, model.index_n_heads, model.index_head_dim)

    @property
    def prices_projections(self) -> bool:
        """The DSA module's rows hold the attention's projections (layer_kernels leaves them out)."""
        return self.module_gemm is not None

    # ------------------------------------------------------------ choosing
    def priced(self, db: KernelDatabase, g: Shapes) -> "SparseAttention":
        """The DSA module where the database has its rows for these heads and GEMM format (at a bf16 KV
        cache; an fp8 one falls back as any attention does, kernel_profile.py), else composed."""
        gemm = MODULE_GEMM.get(g.gemm_quant)
        if gemm is None:
            why = f"the database measured DSA modules with bf16 and fp8_block projections, not {g.gemm_quant}"
        else:
            try:
                db.generation_dsa(_PROBE_BATCH, _PROBE_CONTEXT, g.heads, self.architecture, BF16, gemm)
                db.context_dsa(_PROBE_BATCH, _PROBE_CONTEXT, 0, g.heads, self.architecture, BF16, BF16, gemm)
                return replace(self, module_gemm=gemm, why_composed=None)
            except KernelDataMissing as e:
                why = str(e)
        return self._composed(db, g, why)

    def _composed(self, db: KernelDatabase, g: Shapes, why: str) -> "SparseAttention":
        try:
            db.generation_mla(_PROBE_BATCH, _PROBE_CONTEXT, g.heads, BF16)
        except KernelDataMissing as e:
            raise KernelDatabaseError(
                f"{self.architecture}'s sparse attention: no DSA module rows ({why}) and no MLA tables to compose it from ({e})"
            ) from None
        for kv, fmha in ((FP8, FP8), (FP8, BF16), (BF16, BF16)):
            try:
                db.context_attention(_PROBE_BATCH, _PROBE_CONTEXT, 0, self.index_heads, 1, self.index_head_dim, False, kv, fmha)
                db.generation_attention(_PROBE_BATCH, _PROBE_CONTEXT, self.index_heads, 1, self.index_head_dim, False, kv)
                return replace(self, module_gemm=None, indexer_kv=kv, indexer_fmha=fmha, why_composed=why)
            except KernelDataMissing as e:
                error = e
        raise KernelDatabaseError(
            f"{self.architecture}'s sparse attention: no DSA module rows ({why}) and no MQA attention of "
            f"{self.index_heads} heads x {self.index_head_dim} to price its indexer with ({error})"
        )

    # ------------------------------------------------------------ pricing
    def prefill(self, db: KernelDatabase, g: Shapes, batch: int, new_tokens: int, prefix: int) -> float:
        """One layer's attention block of `batch` requests of `new_tokens` each over `prefix` cached tokens."""
        if self.module_gemm is not None:
            return db.context_dsa(batch, new_tokens, prefix, g.heads, self.architecture, g.prefill_kv, g.prefill_fmha, self.module_gemm)
        n = batch * new_tokens
        kv_b = g.linear(db, n, g.heads * (g.qk_nope + g.v_head), g.kv_lora)
        logits = db.context_attention(
            batch, new_tokens, prefix, self.index_heads, 1, self.index_head_dim, False, self.indexer_kv, self.indexer_fmha
        )
        mean_context = prefix + (new_tokens + 1) / 2  # the keys a new token's indexer scores, on average
        return kv_b + self._sparse_context_mla(db, g, batch, new_tokens, prefix) + self._indexer(db, g, n, mean_context) + logits

    def decode(self, db: KernelDatabase, g: Shapes, batch: int, context: int) -> float:
        """One layer's attention block of `batch` decodes over `context` cached tokens each."""
        if self.module_gemm is not None:
            return db.generation_dsa(batch, context, g.heads, self.architecture, g.decode_kv, self.module_gemm)
        q = g.mla_bmm_quant
        bmm = db.mla_bmm(batch, g.heads, q, True) + db.mla_bmm(batch, g.heads, q, False)
        mla = db.generation_mla(batch, min(context, self.topk), g.heads, g.decode_kv)
        logits = db.generation_attention(batch, context, self.index_heads, 1, self.index_head_dim, False, self.indexer_kv)
        return bmm + mla + self._indexer(db, g, batch, context) + logits

    def _sparse_context_mla(self, db: KernelDatabase, g: Shapes, batch: int, new_tokens: int, prefix: int) -> float:
        """MLA prefill where each query attends at most topk keys: the queries whose causal context fits
        in topk attend all of it (the database's MLA prefill over that prefix); each later one attends
        topk keys, priced as a share of topk new tokens over topk / 2 cached ones (topk^2 query-key
        pairs per topk queries: the same work)."""
        k = self.topk
        dense = max(0, min(new_tokens, k - prefix))
        t = db.context_mla(batch, dense, prefix, g.heads, g.prefill_kv, g.prefill_fmha) if dense else 0.0
        capped = new_tokens - dense
        if capped:
            t += capped / k * db.context_mla(batch, k, k // 2, g.heads, g.prefill_kv, g.prefill_fmha)
        return t

    def _indexer(self, db: KernelDatabase, g: Shapes, n: int, context: float) -> float:
        """The indexer's projections over n tokens and its top-k of each token's `context` logits. Its
        queries come from q's latent (wq_b) and its key from the hidden state (wk), in the weights'
        format; its heads' weights (weights_proj) stay bf16 (GLM-5-FP8's modules_to_not_convert). Top-k
        reads each token's fp32 logits and writes topk int32 indices: elementwise counts 2-byte elements."""
        latent = g.q_lora or g.hidden
        projections = (
            g.linear(db, n, self.index_heads * self.index_head_dim, latent)
            + g.linear(db, n, self.index_head_dim, g.hidden)
            + db.gemm(n, self.index_heads, g.hidden)
        )
        return projections + db.elementwise(n, int(2 * context), 2 * self.topk)

    # ------------------------------------------------------------ the profile's record
    def kernels(self, db: KernelDatabase, g: Shapes) -> tuple[str, str]:
        """(prefill, decode): the tables, and the kernels of their rows, that priced the attention block."""
        if self.module_gemm is None:
            return (
                f"context_mla over min(context, {self.topk}) + kv_b_proj + indexer (context_attention, GEMMs)",
                f"generation_mla over min(context, {self.topk}) + latent BMMs + indexer (generation_attention, GEMMs)",
            )
        out = []
        for context, kv in ((True, g.prefill_kv), (False, g.decode_kv)):
            name = "dsa_context_module" if context else "dsa_generation_module"
            lanes = db.tables.dsa_kernels(context, self.architecture, kv, self.module_gemm)
            out.append(f"{name} ({', '.join(lanes)})" if lanes else f"{name} (rows the database fills from another version)")
        return out[0], out[1]

    def record(self) -> dict:
        """What priced the sparse attention, for the profile's precision record."""
        shapes = {"index_topk": self.topk, "index_n_heads": self.index_heads, "index_head_dim": self.index_head_dim}
        if self.module_gemm is not None:
            return shapes | {
                "priced_as": f"the database's DSA module rows of {self.architecture} with {self.module_gemm} projections: "
                "the whole attention block (projections, indexer, sparse MLA)",
            }
        return shapes | {
            "priced_as": f"composed: MLA over min(context, {self.topk}) tokens from the MLA tables (DeepSeek-V3's head sizes), "
            f"the indexer's logits as MQA attention over the whole context ({self.indexer_kv} KV), its projections as GEMMs",
            "why": self.why_composed,
        }
