"""Where a model's weights sit: how many parameters it has, on one GPU of its parallel layout, and
what one token's forward uses. ModelConfig (model_config.py) takes these methods; they read its fields.

As SGLang and vLLM split a Llama-family model over `tp` GPUs: attention heads, the MLP's intermediate
columns and the vocabulary are divided; KV heads are divided, or replicated when there are more GPUs
than KV heads; norms are replicated. TP 1 is the whole model.

A mixture of experts over `tp` x `dp` GPUs (--dp: attention data parallelism, each of dp ranks with
its own requests and attention over tp GPUs): attention, the dense MLPs, the shared experts, the
router and the LM head as a dense model's over tp GPUs (each DP rank holds its own copy, as vLLM's
-dp; MLA's down-projections are replicated, as SGLang and vLLM build them); the routed experts over
all tp x dp GPUs: num_experts / ep whole experts a rank (expert parallelism), each split over
(tp x dp) / ep GPUs (the MoE's TP).
"""

from __future__ import annotations


class ModelParams:
    """Parameter counts of a ModelConfig (its base class: every attribute read here is a field or
    property of ModelConfig)."""

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Total parameters: embedding + layers + final norm + lm_head (unless tied)."""
        return self.params_per_gpu(1)

    def weight_bytes(
        self, dtype_bytes: int = 2, tp: int = 1, linear_bytes: float | None = None, *, ep: int = 1, dp: int = 1, experts_only: bool = False
    ) -> int:
        """Weights (on one GPU of `tp` x `dp` with experts over `ep`; see params_per_gpu). linear_bytes: bytes
        per weight of the decoder layers' matmul weights when they are quantized (fp8: 1), the rest
        (embedding, LM head, norms, biases, a MoE router) at dtype_bytes; None: every weight at
        dtype_bytes. experts_only: only the routed experts are quantized (gpt-oss's mxfp4 checkpoint)."""
        total = self.params_per_gpu(tp, ep, dp) * dtype_bytes
        if linear_bytes is not None:
            quantized = self.routed_expert_params(tp, ep, dp) if experts_only else self.decoder_matmul_params(tp, ep, dp)
            total -= quantized * (dtype_bytes - linear_bytes)
        return total

    def layer_matmul_params(self, tp: int = 1) -> int:
        """Matmul weights of one layer of a dense model (attention and a dense MLP) on one of `tp` GPUs."""
        return self.attention_matmul_params(tp) + 3 * self.hidden_size * self.intermediate_size // tp

    def layer_params(self, tp: int = 1) -> int:
        """Parameters of one dense decoder layer on one of `tp` GPUs: attention, SwiGLU MLP, two RMSNorms."""
        return self.layer_matmul_params(tp) + 2 * self.hidden_size + self.attention_other_params(tp)

    def attention_matmul_params(self, tp: int = 1) -> int:
        """Matmul weights of one layer's attention on one of `tp` GPUs. MLA: q through its q_lora_rank
        latent (q_a replicated, q_b split by heads) or q_proj directly, kv_a (hidden -> latent and
        RoPE key, replicated), kv_b (latent -> each head's k_nope and v), o_proj. DSA's indexer besides,
        replicated as SGLang builds it: its queries from q's latent (wq_b), its key (wk) and its heads'
        weights (weights_proj) from the hidden state."""
        h = self.hidden_size
        if self.is_mla:
            heads = self.num_attention_heads // tp
            q_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = h * self.q_lora_rank + self.q_lora_rank * heads * q_head if self.q_lora_rank else h * heads * q_head
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            indexer = 0
            if self.is_dsa:
                wq_b = (self.q_lora_rank or h) * self.index_n_heads * self.index_head_dim
                indexer = wq_b + h * self.index_head_dim + h * self.index_n_heads  # + wk + weights_proj
            return q + kv_a + kv_b + heads * self.v_head_dim * h + indexer
        q, kv = self.q_size // tp, self.kv_heads_per_gpu(tp) * self.head_dim
        gate = q if self.attn_output_gate else 0  # q_proj also emits the output gate
        full = h * (q + gate) + 2 * h * kv + q * h
        if not self.is_hybrid_linear:
            return full
        # Gated DeltaNet (as SGLang's Qwen3.5): in_proj_qkvz (q, k, v and the output gate z), in_proj_ba (a
        # decay and a beta a value head), the conv's weights, out_proj; heads split over TP. Callers take
        # one layer times the layers: the mean layer of the two kinds (rounded down, a few parameters).
        nv, v_dim = self.linear_num_value_heads // tp, self.linear_value_head_dim
        linear = h * (self.linear_conv_dim // tp + nv * v_dim) + h * 2 * nv + self.linear_conv_dim // tp * self.linear_conv_kernel_dim
        linear += nv * v_dim * h
        return (self.full_attention_layers * full + self.linear_attention_layers * linear) // self.num_hidden_layers

    def attention_other_params(self, tp: int = 1) -> int:
        """One layer's attention parameters besides its matmul weights: q/k/v (and o) biases, Qwen3's
        q/k norms, MLA's latent norms (and DSA's indexer key LayerNorm, weight and bias), gpt-oss's sinks."""
        n = 0
        if self.is_mla:
            n += self.kv_lora_rank + (self.q_lora_rank or 0) + 2 * self.index_head_dim
        else:
            q, kv = self.q_size // tp, self.kv_heads_per_gpu(tp) * self.head_dim
            if self.attention_bias:
                n += q + 2 * kv
                if self.architecture != "Qwen2ForCausalLM":
                    n += self.hidden_size  # o_proj bias
            if self.qk_norm:
                n += 2 * self.head_dim
        if self.attention_sinks:
            n += self.num_attention_heads // tp
        return n

    def moe_tp(self, tp: int = 1, ep: int = 1, dp: int = 1) -> int:
        """GPUs one routed expert is split over: (tp x dp) / ep."""
        return tp * dp // ep

    def expert_matmul_params(self, moe_tp: int = 1) -> int:
        """One routed expert's gated MLP (gate, up, down) on one of the moe_tp GPUs it is split over."""
        return 3 * self.hidden_size * self.moe_intermediate_size // moe_tp

    @property
    def router_params(self) -> int:
        """One MoE layer's router (kept in 16 bits by both engines' quantized MoE models), and its bias."""
        return self.hidden_size * self.num_experts + (self.num_experts if self.router_bias else 0)

    def expert_bias_params(self, moe_tp: int = 1) -> int:
        """One expert's biases (gpt-oss: gate/up split with the expert, down whole), else 0."""
        return 2 * self.moe_intermediate_size // moe_tp + self.hidden_size if self.expert_bias else 0

    def routed_expert_params(self, tp: int = 1, ep: int = 1, dp: int = 1) -> int:
        """The routed experts' matmul weights of all layers on one GPU: num_experts / ep experts a layer."""
        if not self.is_moe:
            return 0
        return self.num_moe_layers * (self.num_experts // ep) * self.expert_matmul_params(self.moe_tp(tp, ep, dp))

    def decoder_matmul_params(self, tp: int = 1, ep: int = 1, dp: int = 1) -> int:
        """The decoder layers' matmul weights on one GPU (what --quantization stores in its format):
        attention, dense MLPs, shared and routed experts; not a MoE's router."""
        if not self.is_moe and not self.is_mla:
            return self.num_hidden_layers * self.layer_matmul_params(tp)
        h = self.hidden_size
        n = self.num_hidden_layers * self.attention_matmul_params(tp) + self.num_dense_mlp_layers * 3 * h * self.intermediate_size // tp
        n += self.num_moe_layers * 3 * h * self.shared_expert_intermediate_size // tp
        return n + self.routed_expert_params(tp, ep, dp)

    def decoder_params(self, tp: int = 1, ep: int = 1, dp: int = 1) -> int:
        """All the decoder layers' parameters on one GPU: matmul weights, norms, biases, routers."""
        if not self.is_moe and not self.is_mla:
            return self.num_hidden_layers * self.layer_params(tp)
        n = self.decoder_matmul_params(tp, ep, dp) + self.num_hidden_layers * (2 * self.hidden_size + self.attention_other_params(tp))
        if self.is_moe:
            per_gpu = self.num_experts // ep
            n += self.num_moe_layers * (self.router_params + per_gpu * self.expert_bias_params(self.moe_tp(tp, ep, dp)))
        return n

    def params_per_gpu(self, tp: int = 1, ep: int = 1, dp: int = 1) -> int:
        """Parameters on one GPU: vocabulary-parallel embedding and lm_head, the layers' shards, final norm."""
        vocab_shard = -(-self.embedding_params // tp)
        n = vocab_shard + self.decoder_params(tp, ep, dp) + self.hidden_size
        if not self.tie_word_embeddings:
            n += vocab_shard
        return n

    def active_params(self, include_embedding: bool = True) -> int:
        """Parameters one token's forward uses: attention, the dense MLPs, in each MoE layer the router,
        the shared experts and num_experts_per_tok routed ones, the LM head; the embedding table too
        unless include_embedding is False (its one row a token is a lookup, not a matmul: OpenAI's
        gpt-oss card counts active parameters so; Qwen, Mistral and DeepSeek count it). A dense
        model's is its num_params."""
        if not self.is_moe:
            return self.num_params - (0 if include_embedding or self.tie_word_embeddings else self.embedding_params)
        h = self.hidden_size
        layers = self.num_hidden_layers * (self.attention_matmul_params() + self.attention_other_params() + 2 * h)
        layers += self.num_dense_mlp_layers * 3 * h * self.intermediate_size
        k = self.num_experts_per_tok
        per_moe = (
            self.router_params
            + 3 * h * self.shared_expert_intermediate_size
            + k * (self.expert_matmul_params() + self.expert_bias_params())
        )
        n = layers + self.num_moe_layers * per_moe + h + self.embedding_params  # the LM head (or the tied table)
        if include_embedding and not self.tie_word_embeddings:
            n += self.embedding_params
        return n
