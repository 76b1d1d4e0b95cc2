"""AIConfigurator's database of measured kernels: one kernel's time at one shape (kernel_catalog.py
says which systems, backends and versions the installed package holds).

`aiconfigurator-core` (an optional extra: ``pip install -e '.[aiconfigurator]'``) ships kernel
timings measured on GPU systems (GEMMs by m/n/k, context and generation attention by batch,
sequence length and heads, all-reduce by message size and GPU count) for SGLang, vLLM and
TensorRT-LLM, with each system's specs in a YAML file. Its compiled engine answers a query for
one operator at one shape (interpolating between the measured shapes, and pricing the few ops it
has no table for, element-wise ones and the embedding, from memory bandwidth); this module wraps
that query API (``EngineHandle.evaluate_ops_json`` over its op classes) and nothing else.

Nothing here imports the package at module import: ``testbed replay`` must not start slower.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from simulator.profiles.interconnect_link import InterconnectLink
from simulator.profiles.kernel_catalog import (
    KernelDatabaseError,
    available,
    latest_version,
    package_version,
    require_package,
    system_names,
    system_spec,
    systems_dir,
)
from simulator.profiles.kernel_db_latent import LatentAttentionQueries
from simulator.profiles.kernel_tables import KernelTables


class KernelDataMissing(KernelDatabaseError):
    """The database has no timings for a kernel in that precision (its engine's own error, in one line):
    no fp8 GEMMs on a GPU without fp8 tensor cores, no fp8-KV attention where none was measured."""


def _choices(items) -> str:
    return ", ".join(sorted(items))


@dataclass
class KernelDatabase(LatentAttentionQueries):
    """The measured kernels of one system, backend and backend version, queried one shape at a time.

    Times are seconds. Token counts are per GPU: a caller with tensor parallelism passes the
    per-GPU shapes (heads / TP, columns / TP) and the TP degree to all_reduce. DeepSeek's latent
    attention (MLA, its modules, DSA, the latent BMMs) is queried as LatentAttentionQueries says."""

    system: str
    backend: str
    version: str
    _db: Any = field(repr=False)
    _handle: Any = field(repr=False)
    _ops: dict = field(default_factory=dict, repr=False)
    # The machine's own link between its GPUs, where its description gives one: all-reduces over it
    # rather than the database's rows of the system (interconnect_link.py).
    link: InterconnectLink | None = None

    @functools.cached_property
    def tables(self) -> KernelTables:
        """What the database measured for this system, backend and version (kernel_tables.py)."""
        return KernelTables(systems_dir() / system_spec(self.system)["data_dir"], self.backend, self.version, self._db)

    @classmethod
    def open(cls, system: str, backend: str, version: str | None = None) -> "KernelDatabase":
        """version None: the newest the database maintains for that system (its "current" slot)."""
        require_package()
        from aiconfigurator_core.sdk import perf_database
        from aiconfigurator_core.sdk.engine import EngineHandle

        have = available()
        if system not in have:
            with_specs_only = set(system_names()) - set(have)
            note = f" ({_choices(with_specs_only)} have specs but no kernel data: use them with --hardware)" if with_specs_only else ""
            raise KernelDatabaseError(f"system {system!r} has no kernel data; systems with kernels: {_choices(have)}{note}")
        if backend not in have[system]:
            raise KernelDatabaseError(f"system {system!r} has no {backend!r} kernels; it has: {_choices(have[system])}")
        versions = have[system][backend]
        if version is None:
            version = latest_version(system, backend)
        if version not in versions:
            raise KernelDatabaseError(f"{system}/{backend} has no version {version!r}; it has: {_choices(versions)}")
        db = perf_database.get_database(system, backend, version)
        if db is None:
            raise KernelDatabaseError(f"{system}/{backend}/{version}: the database did not load")
        return cls(system, backend, version, db, EngineHandle.for_database(db))

    # ------------------------------------------------------------------ queries
    def _evaluate(self, key: tuple, make_op, *, is_context: bool, batch_size: int, s: int, prefix: int = 0, x: int | None = None) -> float:
        """Milliseconds from the engine -> seconds. Each op's JSON is built once per shape."""
        from aiconfigurator_core.sdk import errors

        try:
            js = self._ops.get(key)
            if js is None:
                from aiconfigurator_core.sdk.engine import build_ops_json

                js = self._ops[key] = build_ops_json([make_op()])
            ((_, ms, _, _),) = self._handle.evaluate_ops_json(js, is_context=is_context, batch_size=batch_size, s=s, prefix=prefix, x=x)
        except (errors.PerfDataNotAvailableError, errors.MissingSystemFlopsError, errors.InterpolationDataNotAvailableError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise KernelDataMissing(f"{self.system}/{self.backend} {self.version}: {first[:300]}") from None
        return ms * 1e-3

    def gemm(self, m: int, n: int, k: int, quant: str = "bfloat16") -> float:
        """One GEMM: m tokens x k in -> n out. quant: the database's GEMM quant mode (common.GEMMQuantMode:
        bfloat16, or fp8 for per-tensor fp8 weights and activations, ...)."""
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        return self._evaluate(
            ("gemm", n, k, quant), lambda: ops.GEMM("gemm", 1, n, k, common.GEMMQuantMode[quant]), is_context=True, batch_size=1, s=m, x=m
        )

    def context_attention(
        self,
        batch: int,
        new_tokens: int,
        prefix: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        qk_norm: bool = False,
        kv_cache: str = "bfloat16",
        fmha: str = "bfloat16",
        window: int = 0,
    ) -> float:
        """Prefill attention of `batch` requests of `new_tokens` each over `prefix` cached tokens, with the
        RoPE, KV-cache write (and Qwen3's q/k norm) the engine adds to the measured kernel. kv_cache: the
        KV cache's dtype (bfloat16 or fp8); fmha: the attention kernel's (fp8: q cast to fp8 as well);
        window: each query attends its last `window` tokens only (sliding-window attention; 0: all of them),
        from the database's rows measured with that window (KernelDataMissing for a window it never measured)."""
        return self._evaluate(
            ("ctx", heads, kv_heads, head_dim, qk_norm, kv_cache, fmha, window),
            lambda: self._attention_op(True, heads, kv_heads, head_dim, qk_norm, kv_cache, fmha, window),
            is_context=True,
            batch_size=batch,
            s=new_tokens,
            prefix=prefix,
        )

    def generation_attention(
        self,
        batch: int,
        context: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        qk_norm: bool = False,
        kv_cache: str = "bfloat16",
        window: int = 0,
    ) -> float:
        """Decode attention of `batch` requests, each attending over `context` tokens (its new one included;
        window: over its last `window` of them, as context_attention)."""
        return self._evaluate(
            ("gen", heads, kv_heads, head_dim, qk_norm, kv_cache, window),
            lambda: self._attention_op(False, heads, kv_heads, head_dim, qk_norm, kv_cache, window=window),
            is_context=False,
            batch_size=batch,
            s=context,
        )

    def gated_delta_net(
        self,
        kernel: str,
        context: bool,
        batch: int,
        tokens: int,
        hidden: int,
        key_heads: int,
        key_dim: int,
        value_heads: int,
        value_dim: int,
        conv_kernel: int,
        state_dtype: str,
    ) -> float:
        """One Gated DeltaNet kernel of a linear-attention layer (the database's linear_attention gdn_perf rows)
        over `key_heads`/`value_heads` heads a GPU: a prefill's (context: causal_conv1d_fn, chunk_gated_delta_rule)
        over `batch` requests of `tokens` new tokens each, or a decode step's (causal_conv1d_update,
        fused_sigmoid_gating_delta_rule_update) of `batch` requests. state_dtype: the recurrent state's
        (mamba_ssm_dtype: float32 or bfloat16)."""
        import aiconfigurator_core.sdk.operations as ops

        phase = "context" if context else "generation"
        return self._evaluate(
            ("gdn", kernel, hidden, key_heads, key_dim, value_heads, value_dim, conv_kernel, state_dtype),
            lambda: ops.GDNKernel(
                kernel, 1, kernel, phase, hidden, key_heads, key_dim, value_heads, value_dim, conv_kernel, mamba_ssm_dtype=state_dtype
            ),
            is_context=context,
            batch_size=batch,
            s=tokens,
        )

    def _attention_op(
        self,
        context: bool,
        heads: int,
        kv_heads: int,
        head_dim: int,
        qk_norm: bool,
        kv_cache: str = "bfloat16",
        fmha: str = "bfloat16",
        window: int = 0,
    ):
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        kv = common.KVCacheQuantMode[kv_cache]
        if context:
            op = ops.ContextAttention(
                "context_attention",
                1,
                heads,
                kv_heads,
                kv,
                common.FMHAQuantMode[fmha],
                window_size=window,
                head_size=head_dim,
                use_qk_norm=qk_norm,
            )
        else:
            op = ops.GenerationAttention(
                "generation_attention", 1, heads, kv_heads, kv, window_size=window, head_size=head_dim, use_qk_norm=qk_norm
            )
        # Which measured kernel (flashinfer, fa3, ...) the backend uses: the database's own choice.
        op._lane_order = self.tables.attention_lane_order(context)
        return op

    def all_reduce(self, tokens: int, hidden: int, tp: int) -> float:
        """The backend's all-reduce of `tokens` x `hidden` bf16 activations over `tp` GPUs (0 for TP 1).

        A message smaller than the database's smallest measured one (128 elements on the H200's
        tables, 4.7 us at TP 8) costs that one: a small all-reduce is latency-bound (256 and 512
        elements take 4.8 us there), while the database's interpolation runs on to zero below its
        first row (16 elements: 0.6 us). MiniMax-M2's q/k-norm variances, 4 elements a token, are
        such messages in a decode."""
        if tp == 1:
            return 0.0
        if self.link is not None:
            return self.link.all_reduce(tokens * hidden, tp)
        import aiconfigurator_core.sdk.operations as ops

        tokens = max(tokens, -(-self._smallest_all_reduce(tp) // hidden))
        return self._evaluate(
            ("ar", hidden, tp), lambda: ops.CustomAllReduce("all_reduce", 1, hidden, tp), is_context=True, batch_size=1, s=tokens, x=tokens
        )

    def _smallest_all_reduce(self, tp: int) -> int:
        """The fewest elements the database measured a bf16 all-reduce of over `tp` GPUs (0 if none)."""
        key = ("ar_smallest", tp)
        if key not in self._ops:
            import aiconfigurator_core.sdk.operations as ops
            from aiconfigurator_core.sdk import common

            ops.CustomAllReduce.load_data(self._db)
            by_strategy = self._db._custom_allreduce_data.get(common.CommQuantMode.half, {}).get(tp, {})
            sizes = [int(size) for rows in by_strategy.values() for size in rows]
            self._ops[key] = min(sizes, default=0)
        return self._ops[key]

    def moe(
        self,
        tokens: int,
        hidden: int,
        inter: int,
        topk: int,
        experts: int,
        moe_tp: int,
        moe_ep: int,
        quant: str = "bfloat16",
        distribution: str = "balanced",
    ) -> float:
        """The routed experts of one MoE layer over `tokens` tokens (each to `topk` of `experts`, of
        `inter` wide each, split over moe_tp x moe_ep GPUs): the backend's fused-MoE kernel as the
        database measured it, under its token distribution (balanced, or power_law_<alpha>).
        quant: its MoEQuantMode name (bfloat16, fp8, fp8_block, nvfp4, w4a16_mxfp4, ...)."""
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        return self._evaluate(
            ("moe", hidden, inter, topk, experts, moe_tp, moe_ep, quant, distribution),
            lambda: ops.MoE("moe", 1, hidden, inter, topk, experts, moe_tp, moe_ep, common.MoEQuantMode[quant], distribution, 1),
            is_context=True,
            batch_size=1,
            s=tokens,
            x=tokens,
        )

    def moe_dispatch(
        self, tokens: int, hidden: int, topk: int, experts: int, moe_tp: int, moe_ep: int, attention_dp: int, pre: bool, quant: str
    ) -> float:
        """One MoE layer's token exchange between `attention_dp` attention ranks and the experts'
        moe_tp x moe_ep GPUs, for `tokens` tokens of one rank: before the experts (pre: the gather or
        dispatch) or after them (the reduce-scatter or combine), as the database's MoEDispatch op
        prices it for the backend (its NCCL and custom all-reduce tables); over the machine's own
        link where it has one, an all-gather or reduce-scatter of the ranks' tokens (interconnect_link.py)."""
        if self.link is not None:
            return self.link.all_gather(tokens * hidden, moe_tp * moe_ep)
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        return self._evaluate(
            ("moe_dispatch", hidden, topk, experts, moe_tp, moe_ep, attention_dp, pre, quant),
            lambda: ops.MoEDispatch(
                "moe_dispatch",
                1,
                hidden,
                topk,
                experts,
                moe_tp,
                moe_ep,
                attention_dp,
                pre,
                quant_mode=common.MoEQuantMode[quant],
                backend=self.backend,
            ),
            is_context=True,
            batch_size=1,
            s=tokens,
            x=tokens,
        )

    def elementwise(self, tokens: int, dim_in: int, dim_out: int) -> float:
        """A memory-bound element-wise kernel (residual add + RMSNorm, SiLU-and-mul) over `tokens` rows."""
        import aiconfigurator_core.sdk.operations as ops

        return self._evaluate(
            ("ew", dim_in, dim_out),
            lambda: ops.ElementWise("elementwise", 1, dim_in, dim_out, 0.8),
            is_context=True,
            batch_size=1,
            s=tokens,
            x=tokens,
        )

    def embedding(self, tokens: int, vocab: int, hidden: int) -> float:
        import aiconfigurator_core.sdk.operations as ops

        return self._evaluate(
            ("emb", vocab, hidden),
            lambda: ops.Embedding("embedding", 1, vocab, hidden, 0.3),
            is_context=True,
            batch_size=1,
            s=tokens,
            x=tokens,
        )

    def describe(self) -> dict[str, str]:
        return {
            "package": "aiconfigurator-core",
            "package_version": package_version(),
            "system": self.system,
            "backend": self.backend,
            "backend_version": self.version,
        }
