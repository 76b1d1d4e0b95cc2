"""ForwardBatch: a ForwardPlan turned into device tensors, shared by the model and attention."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

from scheduler.core.forward_plan import ForwardMode, ForwardPlan


def host_values_to(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on device. On CUDA through pinned memory, asynchronously: a copy from
    pageable memory waits for the stream's earlier work, so under overlap the launch of the
    next forward would wait for the one running (the launch then takes as long as the forward).
    The pinned staging block stays reserved until the copy is done (torch's host allocator)."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A list of numbers as a tensor on device (host_values_to)."""
    return host_values_to(torch.tensor(values, dtype=dtype), device)


def ids_tensor(values, device: torch.device) -> torch.Tensor:
    """An int64 array (or list) as a tensor on device, never aliasing the array's memory."""
    if not len(values):
        return torch.empty(0, dtype=torch.int64, device=device)
    if isinstance(values, list):
        return to_device(values, torch.int64, device)
    host = torch.frombuffer(values, dtype=torch.int64)
    return host.clone() if device.type == "cpu" else host_values_to(host, device)


@dataclass
class ForwardBatch:
    plan: ForwardPlan
    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64, placeholders resolved
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64
    req_pool_indices: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64
    last_token_index: torch.Tensor  # [B]: row of each request's last new token in the [T] outputs
    # No shape may depend on the data (a CUDA graph captures the forward): a MoE block then
    # computes every expert densely instead of only those its tokens were routed to.
    graph_safe: bool = False

    @property
    def batch_size(self) -> int:
        return self.plan.batch_size

    @classmethod
    def from_plan(cls, plan: ForwardPlan, input_ids: torch.Tensor, device: torch.device) -> "ForwardBatch":
        def t(values) -> torch.Tensor:
            return host_values_to(torch.as_tensor(values, dtype=torch.int64), device)

        if plan.mode is ForwardMode.DECODE:
            last = torch.arange(plan.batch_size, device=device)
        else:
            last = t([end - 1 for end in accumulate(plan.extend_lens)])
        return cls(
            plan=plan,
            mode=plan.mode,
            input_ids=input_ids,
            positions=t(plan.positions),
            out_cache_loc=ids_tensor(plan.out_cache_loc, device),
            req_pool_indices=t(plan.req_pool_indices),
            seq_lens=t(plan.seq_lens),
            last_token_index=last,
        )
