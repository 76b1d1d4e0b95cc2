"""vLLM's multi-head latent attention (MLA: DeepSeek-V3, Kimi-K2.5) priced from AIConfigurator's MLA module tables.

SGLang's and TRT-LLM's databases time MLA kernel by kernel (context_mla, generation_mla, the latent BMMs),
and GpuShapes composes MLA from them with its projections as GEMMs. vLLM's has no such tables: it measured
MLA only as whole modules (mla_context_module, mla_generation_module), each row one layer's attention block
at once (the latents' down-projection, q_b_proj and kv_b_proj, the attention kernel, o_proj, their norms and
RoPE), for 1-128 heads a GPU at DeepSeek-V3's dimensions. AIConfigurator's SDK prices DeepSeek and Kimi-K2.5
on vLLM the same way (its DEEPSEEK model: an MLAModule of heads / TP heads a GPU, native_num_heads the
model's, keyed by the attention projections' one GEMM format). Where the database has no per-kernel MLA
tables but has these, a layer's attention block is the module's row, and GpuShapes.layer_kernels leaves
the projections out.

A cached prefix (a chunk of a long prompt, a prefix-cache hit): the module's prefill rows have none. The
engine's own answer with one scales the module at prefix + new tokens by the causal share of its query-key
pairs, ((p + s)^2 - p^2) / (p + s)^2, projections included (so up to twice the projections a chunk runs).
This prices what vLLM runs for it instead (MLACommonImpl._compute_prefill_context): the module over the new
tokens, plus the prefix's cached latents gathered from the paged cache and decompressed by kv_b_proj, the
new tokens' attention over the prefix (non-causal), and the merge of the two partial outputs by their LSEs.
That attention is the database's MHA context_attention of the backend, as much as it adds over the new
tokens' own: its rows are of head_dim 128 for queries, keys and values, and MLA's keys are
qk_nope + qk_rope wide, so it is scaled by the attention's FLOPs a query-key pair; and no less than reading
the decompressed keys and values once (a few new tokens over a long prefix are memory-bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from simulator.costs.precision import BF16, FP8_BLOCK, NVFP4
from simulator.profiles.kernel_db import KernelDatabase, KernelDatabaseError, KernelDataMissing

# The rows' model: deepseek-ai/DeepSeek-V3 (the tables' `model` column), whose config.json has these
# dimensions; a model with others is not priced from them.
MODULE_DIMENSIONS = {"hidden": 7168, "q_lora": 1536, "kv_lora": 512, "qk_nope": 128, "qk_rope": 64, "v_head": 128}
# The module rows' GEMM format for the weights' format: the database measured bf16, 128x128-block fp8 and
# nvfp4 projections. NVIDIA's NVFP4 checkpoints of DeepSeek-R1 and Kimi-K2.5 keep attention in bf16 (their
# quantization config ignores every layer's self_attn), so nvfp4 weights take the bf16 rows, as
# AIConfigurator's attention_projection_exclusions do. Per-tensor fp8 (and float16) has no rows.
MODULE_GEMM = {BF16: BF16, FP8_BLOCK: FP8_BLOCK, NVFP4: BF16}
# The attention dtype of the decode rows (the database labels every one bfloat16).
DECODE_FMHA = BF16
# The shape each pricing is first asked at, to find whether the database answers it at all.
_PROBE_BATCH, _PROBE_CONTEXT = 1, 4096


class Shapes(Protocol):
    """What the MLA module reads of the GPU's shapes (simulator/profiles/gpu_shapes.py, which holds it)."""

    hidden: int
    heads: int
    tp: int
    q_lora: int
    kv_lora: int
    qk_nope: int
    qk_rope: int
    v_head: int
    gemm_quant: str
    prefill_kv: str
    prefill_fmha: str
    decode_kv: str

    def linear(self, db: KernelDatabase, m: int, n: int, k: int, quant: str | None = None) -> float: ...


@dataclass(frozen=True)
class MlaModule:
    """Which of the database's module rows price one GPU's MLA block."""

    gemm: str  # the rows' GEMM format (MODULE_GEMM)
    native_heads: int  # the model's heads, as AIConfigurator keys the rows (its native_num_heads)

    @classmethod
    def priced(cls, db: KernelDatabase, g: Shapes) -> "MlaModule | None":
        """None where the database has per-kernel MLA tables (GpuShapes composes MLA from them); the module
        where it has rows of it for these heads and GEMM format; KernelDatabaseError where neither prices it."""
        try:
            db.context_mla(_PROBE_BATCH, _PROBE_CONTEXT, 0, g.heads)
            db.generation_mla(_PROBE_BATCH, _PROBE_CONTEXT, g.heads)
            return None
        except KernelDataMissing as e:
            no_kernels = e
        module = cls(MODULE_GEMM.get(g.gemm_quant, BF16), g.heads * g.tp)
        try:
            module._probe(db, g, BF16)
        except KernelDataMissing:
            raise no_kernels from None  # no module rows either: the per-kernel tables' own error
        dims = {name: getattr(g, name) for name in MODULE_DIMENSIONS}
        if dims != MODULE_DIMENSIONS:
            raise KernelDatabaseError(
                f"MLA on {db.backend}: the database has only its MLA module rows, measured at DeepSeek-V3's dimensions "
                f"{MODULE_DIMENSIONS}; this model's are {dims}"
            )
        if g.gemm_quant not in MODULE_GEMM:
            raise KernelDatabaseError(
                f"MLA on {db.backend}: the database measured its MLA module with bf16, fp8_block and nvfp4 projections, not {g.gemm_quant}"
            )
        try:
            module._probe(db, g, module.gemm)
            module._prefix_attention(db, g, _PROBE_BATCH, _PROBE_CONTEXT, _PROBE_CONTEXT)
        except KernelDataMissing as e:
            raise KernelDatabaseError(f"MLA on {db.backend} from the database's MLA module rows: {e}") from None
        return module

    def _probe(self, db: KernelDatabase, g: Shapes, gemm: str) -> None:
        db.context_mla_module(_PROBE_BATCH, _PROBE_CONTEXT, g.heads, self.native_heads, BF16, BF16, gemm)
        db.generation_mla_module(_PROBE_BATCH, _PROBE_CONTEXT, g.heads, self.native_heads, BF16, DECODE_FMHA, gemm)

    # ------------------------------------------------------------ pricing
    def prefill(self, db: KernelDatabase, g: Shapes, batch: int, new_tokens: int, prefix: int) -> float:
        """One layer's attention block of `batch` requests of `new_tokens` each over `prefix` cached tokens."""
        if prefix and new_tokens == 1:
            # vLLM runs a 1-token query on the decode path (MLACommonMetadataBuilder.reorder_batch_threshold is 1
            # for FlashInfer's MLA, the decode kernel of these rows).
            return db.generation_mla_module(batch, prefix + 1, g.heads, self.native_heads, g.prefill_kv, DECODE_FMHA, self.gemm)
        t = db.context_mla_module(batch, new_tokens, g.heads, self.native_heads, g.prefill_kv, g.prefill_fmha, self.gemm)
        if not prefix:
            return t
        cached = batch * prefix
        latent = g.kv_lora + g.qk_rope
        # The prefix's latents gathered into vLLM's bf16 workspace (elementwise counts 2-byte elements: an
        # fp8 cache's read is priced at twice its bytes) and decompressed into each head's key and value.
        gather = db.elementwise(cached, latent, latent)
        kv_b = g.linear(db, cached, g.heads * (g.qk_nope + g.v_head), g.kv_lora, self.gemm)
        # merge_attn_states: reads the two partial outputs, writes one.
        merge = db.elementwise(batch * new_tokens, 2 * g.heads * g.v_head, g.heads * g.v_head)
        return t + gather + kv_b + self._prefix_attention(db, g, batch, new_tokens, prefix) + merge

    def decode(self, db: KernelDatabase, g: Shapes, batch: int, context: int) -> float:
        """One layer's attention block of `batch` decodes over `context` cached tokens each."""
        return db.generation_mla_module(batch, context, g.heads, self.native_heads, g.decode_kv, DECODE_FMHA, self.gemm)

    def _prefix_attention(self, db: KernelDatabase, g: Shapes, batch: int, new_tokens: int, prefix: int) -> float:
        """The new tokens' attention over the prefix: what the database's MHA prefill over that prefix adds to
        the same prefill without it, and no less than reading the prefix's keys and values once. The engine
        prices a prefix by the causal share of query-key pairs (compute), which leaves a few new tokens over a
        long prefix almost nothing: there the attention is memory-bound, priced by the database's element-wise
        model. The decompressed keys and values are bf16 whatever the cache's dtype (the gather dequantizes
        them). The rows have v_head-wide keys; MLA's are qk_nope + qk_rope wide."""
        heads, d = g.heads, g.v_head
        with_prefix = db.context_attention(batch, new_tokens, prefix, heads, heads, d, False, BF16, BF16)
        without = db.context_attention(batch, new_tokens, 0, heads, heads, d, False, BF16, BF16)
        flops_per_pair = (g.qk_nope + g.qk_rope + g.v_head) / (2 * d)
        read = db.elementwise(batch * prefix, heads * (g.qk_nope + g.qk_rope + g.v_head), 0)
        return max((with_prefix - without) * flops_per_pair, read)

    # ------------------------------------------------------------ the profile's record
    def kernels(self, db: KernelDatabase, g: Shapes) -> tuple[str, str]:
        """(prefill, decode): the tables, and the kernels of their rows, that priced the attention block."""
        out = []
        for context, kv, fmha in ((True, g.prefill_kv, g.prefill_fmha), (False, g.decode_kv, DECODE_FMHA)):
            name = "mla_context_module" if context else "mla_generation_module"
            lanes = db.tables.mla_module_kernels(context, kv, fmha, self.gemm)
            out.append(f"{name} ({', '.join(lanes)})" if lanes else f"{name} (rows the database fills from another version)")
        mha = db.tables.attention_kernel(True, BF16)[0] or "the database's default"
        return f"{out[0]}; over a cached prefix + kv_b_proj and context_attention ({mha})", out[1]

    def record(self) -> dict:
        """What priced the MLA block, for the profile's precision record."""
        return {
            "priced_as": f"the database's MLA module rows with {self.gemm} projections, measured at DeepSeek-V3's dimensions: "
            "the whole attention block (the latents' down-projection, q_b_proj, kv_b_proj, the attention kernel, o_proj)",
            "cached_prefix": "the module has no cached-prefix rows: over a prefix, the module over the new tokens plus what "
            "vLLM runs for the prefix (its latents gathered and decompressed by kv_b_proj, the new tokens' attention over "
            "them as the database's MHA context_attention scaled to MLA's wider keys, the partial outputs merged); "
            "AIConfigurator instead scales the module at prefix + new tokens by the causal share of its query-key pairs",
        }
