"""The Llama-family decoder (Llama 2/3, Qwen2/2.5/3, Mistral, and the mixtures of experts
Qwen3-MoE and Mixtral) over the paged KV cache.

Parameter names are the Hugging Face checkpoint names, so weights load by name.
Differences between the family members are config flags: Qwen2's q/k/v biases
(attention_bias), Qwen3's per-head q/k RMSNorm (qk_norm), tied embeddings, the
RoPE scaling; a mixture of experts has a sparse MoE block (engine/moe.py) in place of
the MLP in each layer not listed in dense_layers. Tokens of all requests are packed
into one [T, hidden] tensor; attention (engine/attention.py) knows which request each
token belongs to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionBackend
from engine.forward_batch import ForwardBatch
from engine.moe import SparseMoeBlock, is_moe_layer, moe_family
from engine.rope import RotaryEmbedding
from scheduler.core.forward_plan import ForwardMode
from scheduler.model_config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In float32, then back, as transformers' LlamaRMSNorm does.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding, attn: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(positions, q, k)
        out = attn.forward(self.layer_id, q, k, v)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_id)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # The feed-forward under its checkpoint name: Mixtral's experts are block_sparse_moe.
        self.ffn_name = "mlp"
        if is_moe_layer(cfg, layer_id):
            family = moe_family(cfg)
            self.ffn_name = family.block
            self.add_module(family.block, SparseMoeBlock(cfg, family))
        else:
            self.mlp = MLP(cfg)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding, attn: AttentionBackend, graph_safe: bool = False
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, rope, attn)
        ffn, h = self._modules[self.ffn_name], self.post_attention_layernorm(x)
        return x + (ffn(h, graph_safe) if isinstance(ffn, SparseMoeBlock) else ffn(h))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, device: torch.device) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope = RotaryEmbedding(cfg, device)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Logits [B, vocab] (float32) of each request's last new token."""
        return self.logits(self.last_hidden(batch, attn))

    def last_hidden(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """The final-norm hidden state [B, hidden] of each request's last new token: what a
        decode CUDA graph captures (engine/cuda_graph.py), leaving the vocab-wide logits out."""
        x = self.model.embed_tokens(batch.input_ids)
        for layer in self.model.layers:
            x = layer(x, batch.positions, self.rope, attn, batch.graph_safe)
        if batch.mode is not ForwardMode.DECODE:  # a decode's tokens are all last tokens
            x = x[batch.last_token_index]
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
