"""What AIConfigurator's database measured for one system, backend and version: its tables' rows.

kernel_db.py asks the database's engine for one kernel's time at one shape; the engine has no
listing of the shapes it measured, which a kernel profile needs (where to lay its grid, what to
hold out) and the profile records (which kernel a table's rows are of, which dtypes it has).
This module reads the version's parquet tables in the installed package for that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class KernelTables:
    data_dir: Path  # the system's tables in the installed package (systems/<its data_dir>)
    backend: str
    version: str
    db: Any = field(repr=False)  # the package's loaded perf database (lane order, backward-filled GEMMs)

    def attention_lane_order(self, context: bool) -> list[str]:
        """The database's order of attention kernels (kernel_source lanes) for this backend, version and GPU."""
        from aiconfigurator_core.sdk.operations.attention import resolved_lane_order_for_op

        return resolved_lane_order_for_op(self.db, "_context_attention_data" if context else "_generation_attention_data", None)

    def measured_mla(self, context: bool, heads: int, kv_cache: str = "bfloat16", fmha: str | None = None) -> list[tuple[int, int]]:
        """(batch, sequence length) of the database's measured MLA rows for `heads` heads a GPU, that KV-cache
        dtype (and attention dtype, for prefill), as measured_attention."""
        import pandas as pd

        name = "context_mla_perf.parquet" if context else "generation_mla_perf.parquet"
        rows = set()
        for path in self._table_files("mla", name):
            t = pd.read_parquet(path)
            keep = (t.num_heads == heads) & (t.kv_cache_dtype == kv_cache)
            if fmha is not None and context:
                keep &= t.mla_dtype == fmha
            t = t[keep]
            seq = t.isl if context else t.isl + t.step
            rows |= {(int(b), int(s)) for b, s in zip(t.batch_size, seq)}
        return sorted(rows)

    def _dsa_rows(self, context: bool, architecture: str, kv_cache: str, gemm: str):
        """This version's DSA module rows of `architecture` with every layer's own indexer (not GLM-5.2's
        skip_indexer rows), that KV-cache dtype and GEMM format; None without the table."""
        import pandas as pd

        phase = "context" if context else "generation"
        files = self._table_files("sparse_attention", f"dsa_{phase}_module_perf.parquet")
        if not files:
            return None
        t = pd.read_parquet(files[0])
        keep = (t.op_name == f"dsa_{phase}_module") & (t.architecture == architecture)
        return t[keep & (t.kv_cache_dtype == kv_cache) & (t.gemm_type == gemm)]

    def dsa_kernels(self, context: bool, architecture: str, kv_cache: str, gemm: str) -> list[str]:
        """The kernels (kernel_source) of the DSA module rows that price this shape: SGLang's dense MHA for short
        prefills beside its sparse FlashMLA or TRT-LLM kernels; [] where this version has no table of its own."""
        t = self._dsa_rows(context, architecture, kv_cache, gemm)
        return [] if t is None else sorted(str(k) for k in t.kernel_source.unique())

    def measured_dsa(self, context: bool, architecture: str, heads: int, kv_cache: str, gemm: str) -> list[tuple[int, int]]:
        """(batch, sequence length) of the measured DSA module rows for `heads` heads a GPU, as measured_attention:
        prefill without a cached prefix (step 0), decode over isl + step tokens."""
        t = self._dsa_rows(context, architecture, kv_cache, gemm)
        if t is None:
            return []
        t = t[t.num_heads == heads]
        if context:
            t = t[t.step == 0]
        seq = t.isl if context else t.isl + t.step
        return sorted({(int(b), int(s)) for b, s in zip(t.batch_size, seq)})

    def _mla_module_rows(self, context: bool, kv_cache: str, fmha: str, gemm: str):
        """This version's MLA module rows (vLLM's) with that KV-cache dtype, attention dtype (mla_dtype) and
        GEMM format; None without the table."""
        import pandas as pd

        name = "mla_context_module_perf.parquet" if context else "mla_generation_module_perf.parquet"
        files = self._table_files("mla", name)
        if not files:
            return None
        t = pd.read_parquet(files[0])
        return t[(t.kv_cache_dtype == kv_cache) & (t.mla_dtype == fmha) & (t.gemm_type == gemm)]

    def mla_module_kernels(self, context: bool, kv_cache: str, fmha: str, gemm: str) -> list[str]:
        """The kernels (kernel_source) of the MLA module rows that price this shape (vLLM's prefill: FlashInfer's
        MLA for 1-token prefills, FlashAttention beyond); [] where this version has no table of its own."""
        t = self._mla_module_rows(context, kv_cache, fmha, gemm)
        return [] if t is None else sorted(str(k) for k in t.kernel_source.unique())

    def measured_mla_module(self, context: bool, heads: int, kv_cache: str, fmha: str, gemm: str) -> list[tuple[int, int]]:
        """(batch, sequence length) of the measured MLA module rows for `heads` heads a GPU, as measured_attention:
        prefill of isl new tokens (the rows have no prefix), decode over `step` tokens (the engine answers a
        decode over s tokens with the rows of step s: their isl is the 1 new token)."""
        t = self._mla_module_rows(context, kv_cache, fmha, gemm)
        if t is None:
            return []
        t = t[t.num_heads == heads]
        seq = t.isl if context else t.step
        return sorted({(int(b), int(s)) for b, s in zip(t.batch_size, seq)})

    def measured_gemm_tokens(self, quant: str = "bfloat16") -> list[int]:
        """The token counts (m) at which the database measured GEMMs of that quant mode."""
        import pandas as pd

        files = self._table_files("gemm", "gemm_perf.parquet")
        if files:  # the version's own table, read directly (seconds faster than the engine's view)
            t = pd.read_parquet(files[0], columns=["m", "gemm_dtype"])
            ms = sorted(int(m) for m in t.m[t.gemm_dtype == quant].unique())
            if ms:
                return ms
        # A version whose GEMMs come from another (the database's backward fill): its loaded view.
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        ops.GEMM.load_data(self.db)
        return sorted(int(m) for m in self.db._gemm_data.get(common.GEMMQuantMode[quant], {}))

    def gemm_kernel(self, quant: str) -> str | None:
        """The kernel the database measured GEMMs of that quant mode with (its kernel_source: SGLang's
        sgl_kernel fp8_scaled_mm, vLLM's CutlassFP8ScaledMMLinearKernel, ...); None where this version's
        own table has no such rows (the database fills them from another version, or has none)."""
        import pandas as pd

        files = self._table_files("gemm", "gemm_perf.parquet")
        if not files:
            return None
        t = pd.read_parquet(files[0], columns=["gemm_dtype", "kernel_source"])
        kernels = sorted(str(k) for k in t.kernel_source[t.gemm_dtype == quant].unique())  # (unique: not row by row)
        return ", ".join(kernels) if kernels else None

    def gemm_quant_modes(self) -> list[str]:
        """The GEMM quant modes the database answers for (measured, or modelled from a measured one)."""
        return sorted(self.db.supported_quant_mode.get("gemm", []) or [])

    def attention_kv_dtypes(self, context: bool) -> list[str]:
        """The KV-cache dtypes of this version's measured attention rows (bfloat16, fp8)."""
        import pandas as pd

        name = "context_attention_perf.parquet" if context else "generation_attention_perf.parquet"
        return sorted(
            {
                str(v)
                for path in self._table_files("attention", name)
                for v in pd.read_parquet(path, columns=["kv_cache_dtype"]).kv_cache_dtype.unique()
            }
        )

    def attention_kernel(self, context: bool, kv_cache: str, window: int = 0) -> tuple[str | None, list[str]]:
        """(kernel, its attention dtypes) of the measured rows with this KV-cache dtype that the database's
        lane order reaches first: the kernel (kernel_source) the backend runs, and the attention dtypes
        its rows are labelled with (prefill with an fp8 KV cache: fp8 for FA3 under SGLang, which casts
        q to fp8 as well; bfloat16 for vLLM's rows, and for FlashInfer's). window: the rows measured with
        that sliding window (0: none). (None, []) without such rows."""
        import pandas as pd
        import pyarrow.parquet as pq

        name = "context_attention_perf.parquet" if context else "generation_attention_perf.parquet"
        by_lane: dict[str, set[str]] = {}
        for path in self._table_files("attention", name):
            columns = ["kernel_source", "attn_dtype", "kv_cache_dtype"]
            t = pd.read_parquet(path, columns=columns + [c for c in ("window_size",) if c in pq.read_schema(path).names])
            keep = t.kv_cache_dtype == kv_cache
            if "window_size" in t:
                keep &= t.window_size == window
            elif window:  # a table without sliding-window rows
                continue
            pairs = t.loc[keep, ["kernel_source", "attn_dtype"]].drop_duplicates()  # (not row by row: 10^5 rows)
            for lane, dtype in zip(pairs.kernel_source, pairs.attn_dtype):
                by_lane.setdefault(str(lane), set()).add(str(dtype))
        # The named lanes of the database's order first; "default" (no named lane) lets its engine take
        # any lane with data, in name order.
        order = [lane for lane in self.attention_lane_order(context) if lane != "default"] + sorted(by_lane)
        lane = next((lane for lane in order if lane in by_lane), None)
        return (lane, sorted(by_lane[lane])) if lane else (None, [])

    def measured_attention(
        self, context: bool, heads: int, kv_heads: int, head_dim: int, kv_cache: str = "bfloat16", fmha: str | None = None
    ) -> list[tuple[int, int]]:
        """(batch, sequence length) of the database's measured attention rows for these heads, that KV-cache
        dtype (and attention dtype, for prefill), no sliding window: prefill (new tokens, no prefix) or
        decode (context length)."""
        import pandas as pd

        name = "context_attention_perf.parquet" if context else "generation_attention_perf.parquet"
        files = self._table_files("attention", name)
        rows = set()
        for path in files:
            t = pd.read_parquet(path)
            keep = (t.num_heads == heads) & (t.num_key_value_heads == kv_heads) & (t.head_dim == head_dim) & (t.kv_cache_dtype == kv_cache)
            if fmha is not None and context:
                keep &= t.attn_dtype == fmha
            if "window_size" in t:  # older tables have no sliding-window rows at all
                keep &= t.window_size == 0
            t = t[keep]
            # Decode rows are isl 1 plus `step` generated tokens: the new token attends over isl + step.
            seq = t.isl if context else t.isl + t.step
            rows |= {(int(b), int(s)) for b, s in zip(t.batch_size, seq)}
        return sorted(rows)

    def moe_kernel(self, quant: str, hidden: int, inter: int) -> str | None:
        """The kernel (kernel_source) the database measured the fused-MoE kernel of that MoEQuantMode with, at
        this hidden and expert width; None where this version's own table has no such rows."""
        import pandas as pd

        files = self._table_files("moe", "moe_perf.parquet")
        if not files:
            return None
        t = pd.read_parquet(files[0], columns=["kernel_source", "moe_dtype", "hidden_size", "inter_size"])
        keep = (t.moe_dtype == quant) & (t.hidden_size == hidden) & (t.inter_size == inter)
        kernels = sorted(str(k) for k in t.kernel_source[keep].unique())
        return ", ".join(kernels) if kernels else None

    def _table_files(self, family: str, name: str) -> list[Path]:
        """The parquet file of one table for this version (read directly: the query API has no listing of shapes)."""
        path = self.data_dir / family / self.backend / self.version / name
        return [path] if path.is_file() else []
