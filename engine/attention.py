"""Attention over the paged KV cache: the backend interface and the torch backend.

A backend is prepared once per forward (prepare) and then called by every
layer (forward): it writes the new tokens' K/V at their slots, then attends each
query token to its request's tokens up to and including itself. Extend on a
cached prefix and chunked prefill are the same case: the prefix is already in
the cache, the chunk's queries sit at positions prefix_len...seq_len-1.

The torch backend gathers each request's K/V by slot and runs
scaled_dot_product_attention; it works on the CPU and on CUDA. Decode batches
run as one padded SDPA call; extend batches one request at a time.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from engine.forward_batch import ForwardBatch
from engine.kv_cache import KVCache
from scheduler.core.forward_plan import ForwardMode


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
        table = self.cache.req_to_token
        device = table.device
        if plan.mode is ForwardMode.DECODE:
            # Pad every request's slots to the longest; padding reads the scratch slot and is masked.
            max_len = plan.max_seq_len
            cols = torch.arange(max_len, device=device)
            rows = table[batch.req_pool_indices, :max_len]
            valid = cols[None, :] < batch.seq_lens[:, None]
            self.kv_index = torch.where(valid, rows, self.cache.pad_slot)
            self.mask = valid[:, None, None, :]  # [B, 1, 1, S]
        else:
            self.spans = []
            start = 0
            for row, prefix, ext, seq in zip(plan.req_pool_indices, plan.prefix_lens, plan.extend_lens, plan.seq_lens):
                kv_index = table[row, :seq]
                # Query j (position prefix + j) sees keys 0..prefix + j.
                q_pos = torch.arange(prefix, seq, device=device)
                mask = torch.arange(seq, device=device)[None, :] <= q_pos[:, None]
                self.spans.append((start, start + ext, kv_index, mask))
                start += ext

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
        for s, e, kv_index, mask in self.spans:
            keys = k_cache[kv_index].transpose(0, 1)  # [KVH, S, D]
            values = v_cache[kv_index].transpose(0, 1)
            o = F.scaled_dot_product_attention(
                q[s:e].transpose(0, 1), keys, values, attn_mask=mask, scale=self.scale, enable_gqa=self.gqa
            )  # [H, E, D]
            out[s:e] = o.transpose(0, 1)
        return out
