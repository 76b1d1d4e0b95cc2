"""The queries of DeepSeek's latent attention in AIConfigurator's database: multi-head latent attention
(MLA) kernels, vLLM's MLA modules (the whole attention block, projections included), DeepSeek Sparse
Attention's modules (GLM-5, DeepSeek-V3.2) and MLA's latent BMMs. A mixin of KernelDatabase
(kernel_db.py), whose `_evaluate` runs each query; apart from it because these ops, their quant modes and
their shapes are a family of their own, priced by mla_module.py and sparse_attention.py."""

from __future__ import annotations


class LatentAttentionQueries:
    """KernelDatabase's MLA, MLA-module, DSA and latent-BMM queries (times in seconds)."""

    def _evaluate(self, key: tuple, make_op, *, is_context: bool, batch_size: int, s: int, prefix: int = 0, x: int | None = None) -> float:
        raise NotImplementedError  # KernelDatabase's

    def context_mla(
        self, batch: int, new_tokens: int, prefix: int, heads: int, kv_cache: str = "bfloat16", fmha: str = "bfloat16"
    ) -> float:
        """Prefill attention of DeepSeek's multi-head latent attention (MLA) over `heads` heads a GPU, as the
        database measured the backend's kernel (its DeepSeek-V3 dimensions: a 512-wide latent, 64 RoPE dims,
        128 + 64 query/key and 128 value dims a head), RoPE and the latent KV write included."""
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        return self._evaluate(
            ("ctx_mla", heads, kv_cache, fmha),
            lambda: ops.ContextMLA("context_attention", 1, heads, common.KVCacheQuantMode[kv_cache], common.FMHAQuantMode[fmha]),
            is_context=True,
            batch_size=batch,
            s=new_tokens,
            prefix=prefix,
        )

    def generation_mla(self, batch: int, context: int, heads: int, kv_cache: str = "bfloat16") -> float:
        """Decode MLA attention of `batch` requests over `context` tokens each (the latent-space MQA kernel)."""
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        return self._evaluate(
            ("gen_mla", heads, kv_cache),
            lambda: ops.GenerationMLA("generation_attention", 1, heads, common.KVCacheQuantMode[kv_cache]),
            is_context=False,
            batch_size=batch,
            s=context,
        )

    def context_mla_module(self, batch: int, new_tokens: int, heads: int, native_heads: int, kv_cache: str, fmha: str, gemm: str) -> float:
        """Prefill of MLA's whole attention block (the database's mla_context_module rows, vLLM's: measured at
        DeepSeek-V3's dimensions): the latents' down-projection, q_b_proj and kv_b_proj in `gemm` (its
        GEMMQuantMode name), the attention kernel and o_proj, over `heads` heads a GPU of a model of
        `native_heads`, `batch` requests of `new_tokens` each. No cached prefix: the rows have none, and the
        engine's answer with one scales the whole block by the causal share of its query-key pairs
        (mla_module.py prices a prefix itself)."""
        return self._evaluate(
            ("ctx_mla_module", heads, native_heads, kv_cache, fmha, gemm),
            lambda: self._mla_module_op(True, heads, native_heads, kv_cache, fmha, gemm),
            is_context=True,
            batch_size=batch,
            s=new_tokens,
        )

    def generation_mla_module(self, batch: int, context: int, heads: int, native_heads: int, kv_cache: str, fmha: str, gemm: str) -> float:
        """Decode of MLA's whole attention block (mla_generation_module rows; as context_mla_module) for `batch`
        requests over `context` cached tokens each (the rows of `step` context)."""
        return self._evaluate(
            ("gen_mla_module", heads, native_heads, kv_cache, fmha, gemm),
            lambda: self._mla_module_op(False, heads, native_heads, kv_cache, fmha, gemm),
            is_context=False,
            batch_size=batch,
            s=context,
        )

    def _mla_module_op(self, context: bool, heads: int, native_heads: int, kv_cache: str, fmha: str, gemm: str):
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        name = "context_mla_module" if context else "generation_mla_module"
        kv, attention, projections = common.KVCacheQuantMode[kv_cache], common.FMHAQuantMode[fmha], common.GEMMQuantMode[gemm]
        return ops.MLAModule(name, 1, context, heads, kv, attention, projections, native_num_heads=native_heads)

    def context_dsa(
        self, batch: int, new_tokens: int, prefix: int, heads: int, architecture: str, kv_cache: str, fmha: str, gemm: str
    ) -> float:
        """Prefill of DeepSeek Sparse Attention's whole attention block (the database's dsa_context_module rows
        of `architecture`: GlmMoeDsaForCausalLM, DeepseekV32ForCausalLM): the latents' and q's projections in
        `gemm` (its GEMMQuantMode name), the indexer (projections, logits over every cached key, top-k), the
        sparse MLA over the picked tokens and o_proj, over `heads` heads a GPU; every layer with its own indexer."""
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        return self._evaluate(
            ("ctx_dsa", heads, architecture, kv_cache, fmha, gemm),
            lambda: ops.ContextDSAModule(
                "context_attention",
                1,
                heads,
                common.KVCacheQuantMode[kv_cache],
                common.FMHAQuantMode[fmha],
                common.GEMMQuantMode[gemm],
                architecture=architecture,
            ),
            is_context=True,
            batch_size=batch,
            s=new_tokens,
            prefix=prefix,
        )

    def generation_dsa(self, batch: int, context: int, heads: int, architecture: str, kv_cache: str, gemm: str) -> float:
        """Decode of DeepSeek Sparse Attention's whole attention block (dsa_generation_module rows; as
        context_dsa) for `batch` requests over `context` cached tokens each."""
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        return self._evaluate(
            ("gen_dsa", heads, architecture, kv_cache, gemm),
            lambda: ops.GenerationDSAModule(
                "generation_attention", 1, heads, common.KVCacheQuantMode[kv_cache], common.GEMMQuantMode[gemm], architecture=architecture
            ),
            is_context=False,
            batch_size=batch,
            s=context,
        )

    def mla_bmm(self, tokens: int, heads: int, quant: str, pre: bool) -> float:
        """A decode's batched GEMM into (pre: each head's query to the latent) or out of (the latent
        attention's output to each head's values) MLA's latent space, over `tokens` tokens."""
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        name = "generation_bmm_pre" if pre else "generation_bmm_post"
        return self._evaluate(
            (name, heads, quant),
            lambda: ops.MLABmm(name, 1, heads, common.GEMMQuantMode[quant], if_pre=pre),
            is_context=False,
            batch_size=tokens,
            s=1,
        )
