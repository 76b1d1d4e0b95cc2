"""Attention over the paged KV cache: the backend interface and the torch backend.

A backend is prepared once per forward (prepare) and then called by every
layer (forward): it writes the new tokens' K/V at their slots, then attends each
query token to its request's tokens up to and including itself. Extend on a
cached prefix and chunked prefill are the same case: the prefix is already in
the cache, the chunk's queries sit at positions prefix_len...seq_len-1.

The torch backend gathers each request's K/V by slot and runs
scaled_dot_product_attention; it works on the CPU and on CUDA. Decode batches
run as one padded SDPA call; extend batches one request at a time, with a causal
mask aligned to the end of the request's keys (torch's causal_lower_right), which
CUDA's fused kernels take without building the [queries, keys] mask: an 8B model's
8,192-token prompt once asked for 6.6 GiB for it on an H200 and ran out of memory.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from engine.forward_batch import ForwardBatch
from engine.kv_cache import KVCache
from scheduler.core.forward_plan import ForwardMode

# The SDPA kernels an eager forward lets torch choose from on CUDA. cuDNN's is left out there: it
# builds an execution plan for every new (batch, query length, key length), tens to hundreds of
# ms each (on an H100 a fresh eager run's extends took 774 ms, its decodes 63 ms a step, against
# 56 and 34 ms without cuDNN), and eager shapes are new all the time. Captured decode graphs keep
# torch's own choice (cuDNN on Hopper): their shapes are bucketed, so each plan is built once at
# capture, and it is faster there (decode at batch 8: 10.8 ms a step against 15.4 ms without).
# Flash takes the causal prefills, the memory-efficient kernel the masked decodes and float32.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa_backends(device: torch.device) -> contextlib.AbstractContextManager:
    """The context an eager forward runs in: SDPA_BACKENDS on CUDA; on a CPU torch's own choice."""
    return sdpa_kernel(SDPA_BACKENDS) if device.type == "cuda" else contextlib.nullcontext()


class AttentionBackend(Protocol):
    name: str

    def prepare(self, batch: ForwardBatch) -> None: ...

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, H, D], k and v [T, KVH, D] of the new tokens -> attention output [T, H, D]."""
        ...


class TorchAttention:
    name = "torch"

    def __init__(self, cache: KVCache, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.cache = cache
        self.scale = head_dim**-0.5
        self.gqa = num_heads != num_kv_heads
        self.batch: ForwardBatch | None = None

    def prepare(self, batch: ForwardBatch) -> None:
        self.batch = batch
        plan = batch.plan
        if plan.mode is ForwardMode.DECODE:
            self.prepare_decode(batch.req_pool_indices, batch.seq_lens, plan.max_seq_len)
        else:
            table = self.cache.req_to_token
            self.spans = []
            start = 0
            for row, ext, seq in zip(plan.req_pool_indices, plan.extend_lens, plan.seq_lens):
                # Query j (position seq - ext + j) sees keys 0..seq - ext + j: causal, aligned to the last key.
                self.spans.append((start, start + ext, table[row, :seq], causal_lower_right(ext, seq)))
                start += ext

    def prepare_decode(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, max_len: int) -> None:
        """Pad every request's slots to max_len; padding reads the scratch slot and is masked.
        Tensors only, no host values: a CUDA graph captures this (engine/cuda_graph.py)."""
        table = self.cache.req_to_token
        cols = torch.arange(max_len, device=table.device)
        rows = table[req_pool_indices, :max_len]
        valid = cols[None, :] < seq_lens[:, None]
        self.kv_index = torch.where(valid, rows, self.cache.pad_slot)
        self.mask = valid[:, None, None, :]  # [B, 1, 1, S]

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        batch = self.batch
        assert batch is not None
        self.cache.write(layer, batch.out_cache_loc, k, v)
        k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]
        if batch.mode is ForwardMode.DECODE:
            keys = k_cache[self.kv_index].transpose(1, 2)  # [B, KVH, S, D]
            values = v_cache[self.kv_index].transpose(1, 2)
            out = F.scaled_dot_product_attention(
                q.unsqueeze(2), keys, values, attn_mask=self.mask, scale=self.scale, enable_gqa=self.gqa
            )  # [B, H, 1, D]
            return out.squeeze(2)
        out = torch.empty_like(q)
        group = q.shape[1] // k_cache.shape[1]
        for s, e, kv_index, causal in self.spans:
            # Query heads share KV heads: repeated here, since the fused kernels' lower-right
            # causal path takes equal head counts. [1, H, S, D]
            keys = k_cache[kv_index].transpose(0, 1).repeat_interleave(group, 0).unsqueeze(0)
            values = v_cache[kv_index].transpose(0, 1).repeat_interleave(group, 0).unsqueeze(0)
            o = F.scaled_dot_product_attention(q[s:e].transpose(0, 1).unsqueeze(0), keys, values, attn_mask=causal, scale=self.scale)
            out[s:e] = o[0].transpose(0, 1)  # [E, H, D]
        return out
