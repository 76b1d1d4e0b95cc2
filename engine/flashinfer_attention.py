"""The flashinfer attention backend (CUDA, the `gpu` extra), as SGLang uses it.

The KV pool is a paged cache with page_size 1 in flashinfer's NHD layout: a
layer's [slots, KVH, D] tensor viewed as [slots, 1, KVH, D]. Each request's
pages are its slots, read from the device request table; last_page_len is 1.
Extend (prefill, cached prefix, chunked prefill) uses
BatchPrefillWithPagedKVCacheWrapper with a causal mask, which flashinfer aligns
to the end of each request's KV (append attention); decode uses
BatchDecodeWithPagedKVCacheWrapper. Arguments after page_size are passed by
keyword: their order changed between flashinfer versions.

Written against flashinfer-python 0.5.3's signatures. It has not yet run on a
GPU in this project (the sessions that wrote it had none): the torch backend is
the verified one.
"""

from __future__ import annotations

import torch

from engine.forward_batch import ForwardBatch
from engine.kv_cache import KVCache
from scheduler.core.forward_plan import ForwardMode

WORKSPACE_BYTES = 256 << 20


class FlashInferAttention:
    name = "flashinfer"

    def __init__(self, cache: KVCache, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        import flashinfer  # the gpu extra; imported only when this backend is chosen

        self.cache = cache
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.dtype = dtype
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=cache.device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        # Tensor cores pay off for decode when several query heads share a KV head (GQA).
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=num_heads // num_kv_heads >= 4)
        self.batch: ForwardBatch | None = None

    def prepare(self, batch: ForwardBatch) -> None:
        self.batch = batch
        plan = batch.plan
        device = self.cache.device
        seq_lens = batch.seq_lens
        kv_indptr = torch.zeros(plan.batch_size + 1, dtype=torch.int32, device=device)
        kv_indptr[1:] = torch.cumsum(seq_lens, 0)
        # Slots of every request, concatenated: row r's first seq_len entries of the table.
        max_len = plan.max_seq_len
        rows = self.cache.req_to_token[batch.req_pool_indices, :max_len]
        valid = torch.arange(max_len, device=device)[None, :] < seq_lens[:, None]
        kv_indices = rows[valid].to(torch.int32)
        last_page_len = torch.ones(plan.batch_size, dtype=torch.int32, device=device)
        common = dict(q_data_type=self.dtype, kv_data_type=self.dtype, sm_scale=self.head_dim**-0.5)
        if plan.mode is ForwardMode.DECODE:
            self.decode.plan(
                kv_indptr,
                kv_indices,
                last_page_len,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                1,
                pos_encoding_mode="NONE",
                **common,
            )
        else:
            qo_indptr = torch.zeros(plan.batch_size + 1, dtype=torch.int32, device=device)
            qo_indptr[1:] = torch.cumsum(torch.as_tensor(plan.extend_lens, device=device), 0)
            self.prefill.plan(
                qo_indptr,
                kv_indptr,
                kv_indices,
                last_page_len,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                1,
                causal=True,
                **common,
            )

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        batch = self.batch
        assert batch is not None
        self.cache.write(layer, batch.out_cache_loc, k, v)
        paged = (self.cache.k[layer].unsqueeze(1), self.cache.v[layer].unsqueeze(1))  # [slots, 1, KVH, D]
        wrapper = self.decode if batch.mode is ForwardMode.DECODE else self.prefill
        return wrapper.run(q.contiguous(), paged)
