"""The device side of the KV cache: K and V tensors per layer, and the request table.

Slot i of every layer's tensors holds the K/V of the token that the scheduler's
TokenToKVPoolAllocator handed slot i to. One extra slot at the end is a scratch
slot for padded positions (CUDA graphs), never handed out.

req_to_token mirrors the scheduler's ReqToTokenPool: the scheduler journals its
row writes into each plan (ForwardPlan.row_writes) and decode appends are
derived from the plan, so the table is current before every forward.
"""

from __future__ import annotations

import torch

from engine.forward_batch import ids_tensor
from scheduler.core.forward_plan import ForwardPlan
from scheduler.model_config import ModelConfig


class KVCache:
    def __init__(
        self, cfg: ModelConfig, num_slots: int, num_req_rows: int, max_row_len: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.num_slots = num_slots
        self.pad_slot = num_slots
        shape = (num_slots + 1, cfg.num_key_value_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.req_to_token = torch.zeros((num_req_rows, max_row_len), dtype=torch.int64, device=device)
        self.device = device

    @staticmethod
    def bytes_per_slot(cfg: ModelConfig, dtype: torch.dtype) -> int:
        return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * torch.tensor([], dtype=dtype).element_size()

    def apply_row_writes(self, plan: ForwardPlan) -> None:
        for slot, start, locs in plan.row_writes or ():
            if len(locs):
                self.req_to_token[slot, start : start + len(locs)] = ids_tensor(locs, self.device)

    def write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer][loc] = k
        self.v[layer][loc] = v
