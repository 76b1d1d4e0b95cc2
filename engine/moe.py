"""The sparse mixture-of-experts block of Qwen3-MoE and Mixtral, as transformers computes it.

A router (`gate`, a linear layer without bias) scores every expert; the softmax over the experts
is taken in float32, the top num_experts_per_tok kept and, where the family renormalizes them
(Mixtral always, Qwen3-MoE when its config's norm_topk_prob says so), divided by their sum. Each
chosen expert, a SiLU-gated MLP of moe_intermediate_size, runs on the tokens routed to it; its
output, scaled by the token's routing weight, is added to the token's row, expert by expert.

Parameters carry the checkpoint's names, one Linear per expert (Qwen3-MoE's
`mlp.experts.{i}.gate_proj`, Mixtral's `block_sparse_moe.experts.{i}.w1`), so engine/weights.py
loads by name: transformers 5 fuses a layer's experts into 3-D tensors in memory, but its
save_pretrained writes them one by one, as published checkpoints hold them.

The same sum is computed two ways:
- grouped (eager forwards): tokens sorted by expert; only the experts that got tokens run, each
  on its own tokens. Counting them is one device-to-host copy per layer (on CUDA a wait for
  the device, so an eager MoE forward does not overlap the host's next scheduling step).
- dense (graph_safe: a decode forward a CUDA graph captures, engine/cuda_graph.py): every expert
  runs on every token, weighted by a [tokens, experts] matrix that is zero off the routed ones. No
  shape depends on the routing, so a graph can capture it; it costs num_experts / top-k times the
  expert FLOPs, which decode batches of at most a few hundred tokens afford.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from scheduler.model_config import ModelConfig


@dataclass(frozen=True)
class MoeFamily:
    """How a family names its MoE block and experts, and whether it renormalizes the top-k."""

    block: str  # the decoder layer's attribute (and checkpoint name) holding the block
    gate_proj: str  # an expert's projections: gate (SiLU'd), up, down
    up_proj: str
    down_proj: str
    norm_topk_prob: bool


def moe_family(cfg: ModelConfig) -> MoeFamily:
    if cfg.architecture == "MixtralForCausalLM":
        return MoeFamily("block_sparse_moe", "w1", "w3", "w2", norm_topk_prob=True)
    if cfg.architecture == "Qwen3MoeForCausalLM":
        # transformers' Qwen3MoeConfig defaults it to False; the published Qwen3 MoE configs set True.
        return MoeFamily("mlp", "gate_proj", "up_proj", "down_proj", norm_topk_prob=bool(cfg.raw.get("norm_topk_prob", False)))
    raise ValueError(f"{cfg.name} ({cfg.architecture}): no MoE block for this architecture")


def is_moe_layer(cfg: ModelConfig, layer_id: int) -> bool:
    """Experts in this layer; the layers in dense_layers (Qwen3-MoE's mlp_only_layers and those off
    decoder_sparse_step) have a dense MLP of intermediate_size."""
    return cfg.is_moe and layer_id not in cfg.dense_layers


class Expert(nn.Module):
    """down(silu(gate(x)) * up(x)), its three projections under the family's names."""

    def __init__(self, hidden: int, intermediate: int, family: MoeFamily) -> None:
        super().__init__()
        self.names = (family.gate_proj, family.up_proj, family.down_proj)
        for name, (n_in, n_out) in zip(self.names, ((hidden, intermediate), (hidden, intermediate), (intermediate, hidden))):
            self.add_module(name, nn.Linear(n_in, n_out, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = (self._modules[n] for n in self.names)
        return down(F.silu(gate(x)) * up(x))


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, family: MoeFamily) -> None:
        super().__init__()
        self.num_experts, self.top_k = cfg.num_experts, cfg.num_experts_per_tok
        self.norm_topk_prob = family.norm_topk_prob
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(cfg.hidden_size, cfg.moe_intermediate_size, family) for _ in range(cfg.num_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's top-k routing weights [T, k] (x's dtype) and experts [T, k]."""
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def forward(self, x: torch.Tensor, graph_safe: bool = False) -> torch.Tensor:
        weights, experts = self.route(x)
        return self._dense(x, weights, experts) if graph_safe else self._grouped(x, weights, experts)

    def _grouped(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)  # the (token, slot) pairs, grouped by expert
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        tokens = order // self.top_k
        slot_weights = weights.flatten()[order, None]
        out = torch.zeros_like(x)
        start = 0
        for e, n in enumerate(counts):
            if n:
                rows = tokens[start : start + n]
                out.index_add_(0, rows, self.experts[e](x[rows]) * slot_weights[start : start + n])
                start += n
        return out

    def _dense(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        dense = torch.zeros(x.shape[0], self.num_experts, dtype=x.dtype, device=x.device).scatter_(1, experts, weights)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            out += expert(x) * dense[:, e, None]
        return out
