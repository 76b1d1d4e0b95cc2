"""Model architecture parsed from a Hugging Face ``config.json``.

The scheduler needs the model only for sizes (context length, KV bytes per
token); the simulator needs it for FLOPs and bytes; the real engine (engine/llama.py)
builds the network from it and may read anything else from ``raw``.

Besides the dense Llama family it parses mixtures of experts (Qwen3-MoE, Mixtral, DeepSeek-V2/V3,
gpt-oss: how many experts, how many a token is routed to, their sizes, which layers stay dense) and
DeepSeek's multi-head latent attention (MLA: the KV cache holds one compressed latent per token and
layer, ``kv_lora_rank + qk_rope_head_dim`` elements, instead of K and V heads). The simulator prices
them (simulator/costs/roofline.py); the real engine runs the dense family, Qwen3-MoE and Mixtral
(engine/support.py says what it refuses). A multimodal model's config (Kimi-K2.5) is read for the
language model its text_config holds.

Configs of common models ship in ``scheduler/configs/`` as the published
``config.json`` files, so a dummy-weight run or a simulation needs no download.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scheduler.model_families import (  # noqa: F401 - ModelConfigError and checkpoint_weight_format re-exported
    ModelConfigError,
    checkpoint_fields,
    checkpoint_weight_format,
    dsa_fields,
    language_model_config,
    linear_attention_fields,
    mla_fields,
    moe_fields,
)
from scheduler.model_params import ModelParams

CONFIGS_DIR = Path(__file__).parent / "configs"

DENSE_ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
)
# Mixtures of experts (and DeepSeek's MLA): the simulator prices them; the real engine builds the ones
# engine/support.py allows (Qwen3-MoE, Mixtral).
MOE_ARCHITECTURES = (
    "Qwen3MoeForCausalLM",
    "MixtralForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "GptOssForCausalLM",
    "MiniMaxM2ForCausalLM",
    "GlmMoeDsaForCausalLM",
    "Qwen3_5MoeForCausalLM",
)
SUPPORTED_ARCHITECTURES = DENSE_ARCHITECTURES + MOE_ARCHITECTURES
_MLA_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM")
# DeepSeek Sparse Attention (DeepSeek-V3.2's, GLM-5's): MLA whose queries attend a few cached tokens an indexer picks.
_DSA_ARCHITECTURES = ("GlmMoeDsaForCausalLM",)
# Hybrid linear attention (Qwen3.5): Gated DeltaNet layers beside full gated-attention ones.
_LINEAR_ATTENTION_ARCHITECTURES = ("Qwen3_5MoeForCausalLM",)

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}
# DSA's indexer keys as SGLang caches them, whatever --kv-cache-dtype says (DSATokenToKVPool's
# index_k_with_scale_buffer, which its model runner adds to a token's cell size): fp8, 1 byte an
# element, and one fp32 scale (4 bytes) per block of 128 elements.
_INDEX_KEY_QUANT_BLOCK = 128
_INDEX_KEY_SCALE_BYTES = 4


@dataclass(frozen=True)
class ModelConfig(ModelParams):
    name: str
    architecture: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None = field(default=None, hash=False, compare=False)
    torch_dtype: str = "bfloat16"
    eos_token_id: tuple[int, ...] = ()
    bos_token_id: int | None = None
    # q/k/v projections carry a bias (always for Qwen2; the config's flag otherwise,
    # which in HF Llama/Mistral/Qwen3 also puts a bias on o_proj).
    attention_bias: bool = False
    # RMSNorm of q and k before RoPE: on each head (Qwen3), or over all heads (MiniMax-M2, below).
    qk_norm: bool = False
    # The q and k RMSNorm spans all of a layer's heads (MiniMax-M2's qk_norm_type "per_layer"), not each
    # head: under TP each GPU holds some heads, so the engines all-reduce the variances across TP
    # (vLLM's MiniMaxText01RMSNormTP.forward_qk), one small all-reduce a layer.
    qk_norm_over_heads: bool = False
    # Sliding-window attention if the config enables it, else None (no dense model we ship uses it).
    sliding_window: int | None = None
    # --- Mixture of experts (0 and empty for a dense model) ---
    # Routed experts of a MoE layer (HF: num_experts, num_local_experts, n_routed_experts) and how
    # many each token is routed to (num_experts_per_tok; gpt-oss also experts_per_token).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    # Intermediate size of one routed expert's gated MLP (moe_intermediate_size; Mixtral and gpt-oss
    # have none and use intermediate_size).
    moe_intermediate_size: int = 0
    # The shared experts of a MoE layer together, which every token passes (DeepSeek:
    # n_shared_experts x moe_intermediate_size); 0 without (Qwen3-MoE, Mixtral, gpt-oss).
    shared_expert_intermediate_size: int = 0
    # Layers with a dense MLP of intermediate_size instead of experts, by index (DeepSeek: the first
    # first_k_dense_replace and those off moe_layer_freq; Qwen3-MoE: mlp_only_layers and those off
    # decoder_sparse_step); () when every layer is MoE (Mixtral, gpt-oss).
    dense_layers: tuple[int, ...] = ()
    router_bias: bool = False  # a bias beside the router's weight (gpt-oss; DeepSeek-V3's e_score_correction_bias)
    expert_bias: bool = False  # biases on every expert's projections (gpt-oss)
    # --- Multi-head latent attention (DeepSeek-V2/V3; None and 0 otherwise) ---
    # K and V are compressed into one latent of kv_lora_rank per token and layer, cached with the
    # decoupled RoPE key of qk_rope_head_dim; q through a q_lora_rank latent (None: q_proj directly).
    # Heads have qk_nope_head_dim + qk_rope_head_dim for q and k (head_dim) and v_head_dim for v.
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # --- DeepSeek Sparse Attention (GLM-5; 0 otherwise): MLA over the cached tokens an indexer picks ---
    # Each query attends only the index_topk cached tokens (of its layer) that a lightweight indexer
    # scores highest; the indexer has index_n_heads heads of index_head_dim, whose keys (one of
    # index_head_dim a token and layer) are cached beside MLA's latent.
    index_topk: int = 0  # cached tokens each query's MLA attends to (GLM-5, DeepSeek-V3.2: 2048)
    index_n_heads: int = 0  # the indexer's query heads (GLM-5: 32)
    index_head_dim: int = 0  # the indexer's query and key size (GLM-5: 128)
    # --- gpt-oss ---
    # Layers of sliding-window attention (layer_types "sliding_attention", window `sliding_window`),
    # alternating with full ones; 0 where layer_types is not given.
    sliding_window_layers: int = 0
    attention_sinks: bool = False  # a learned sink logit per head in each layer's softmax
    # --- Hybrid linear attention (Qwen3.5; 0 otherwise) ---
    # linear_attention_layers of the layers are Gated DeltaNet: no per-token KV, a fixed-size state a
    # request instead (a causal conv window over q, k and v, and a recurrent state of linear_num_value_heads
    # heads of linear_key_head_dim x linear_value_head_dim); the others are full attention with a KV cache.
    linear_attention_layers: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    linear_state_dtype_bytes: int = 4  # the recurrent state's dtype (mamba_ssm_dtype: float32)
    # The full layers' sigmoid gate on the attention output, from a q_proj twice as wide (Qwen3.5).
    attn_output_gate: bool = False
    # The checkpoint's own weight format (its quantization_config), where the simulator prices it:
    # fp8 (per tensor), fp8_block (DeepSeek's 128x128 blocks), mxfp4 (gpt-oss); None for 16-bit weights.
    checkpoint_quantization: str | None = None
    # The checkpoint quantizes the routed experts only (gpt-oss leaves attention and the router in bf16).
    checkpoint_quantizes_experts_only: bool = False
    raw: dict = field(default_factory=dict, hash=False, compare=False, repr=False)
    # The local folder it was read from (weights, tokenizer), None for a bundled config.
    folder: str | None = field(default=None, hash=False, compare=False)

    # ----------------------------------------------------------------- parsing
    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], name: str | None = None) -> "ModelConfig":
        """Parse a config.json dict; raise ModelConfigError if unsupported or incomplete."""
        cfg = language_model_config(cfg, name)
        archs = cfg.get("architectures") or []
        if not archs:
            raise ModelConfigError(
                f"config of {name or 'model'!r} has no 'architectures' entry; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelConfigError(
                f"unsupported architecture {arch!r} (model {name or cfg.get('_name_or_path', '?')!r}); "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )

        def need(key: str) -> Any:
            if cfg.get(key) is None:
                raise ModelConfigError(f"config of {name!r} ({arch}) is missing {key!r}")
            return cfg[key]

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        layers = int(need("num_hidden_layers"))
        mla = mla_fields(cfg, arch, name, need) if arch in _MLA_ARCHITECTURES else {}
        dsa = dsa_fields(cfg, arch, name, need) if arch in _DSA_ARCHITECTURES else {}
        moe = moe_fields(cfg, arch, name, need, layers) if arch in MOE_ARCHITECTURES else {}
        linear = linear_attention_fields(cfg, arch, name, layers) if arch in _LINEAR_ATTENTION_ARCHITECTURES else {}
        # MLA's q and k heads are the no-RoPE part and the RoPE part together.
        head_dim = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"] if mla else cfg.get("head_dim")
        if head_dim is None:
            if hidden % heads:
                raise ModelConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
            head_dim = hidden // heads
        if heads % kv_heads:
            raise ModelConfigError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")

        eos = cfg.get("eos_token_id")
        eos_ids = tuple(int(e) for e in eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))

        # transformers 5 writes rope_parameters (rope_type, rope_theta, scaling keys) instead
        # of rope_theta and rope_scaling.
        rope_params = cfg.get("rope_parameters") or {}
        rope_theta = float(cfg.get("rope_theta") or rope_params.get("rope_theta") or 10000.0)
        rope_scaling = cfg.get("rope_scaling")
        if not rope_scaling and rope_params.get("rope_type", "default") != "default":
            rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        rope_scaling = dict(rope_scaling) if rope_scaling else None

        sliding = cfg.get("sliding_window")
        # Qwen2 configs carry a sliding_window value but switch it off with use_sliding_window.
        if cfg.get("use_sliding_window") is False:
            sliding = None

        return cls(
            name=name or str(cfg.get("_name_or_path") or arch),
            architecture=arch,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=int(head_dim),
            # Qwen3.5's config has none: every layer is MoE (its shared expert has its own size).
            intermediate_size=int(cfg.get("intermediate_size") or 0) if linear else int(need("intermediate_size")),
            vocab_size=int(need("vocab_size")),
            max_position_embeddings=int(need("max_position_embeddings")),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            # Newer transformers write "dtype" instead of "torch_dtype".
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
            eos_token_id=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
            attention_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            # MiniMax-M2's use_qk_norm normalizes all of a layer's q (and k) heads together, Qwen3's each head.
            qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3_5MoeForCausalLM")
            or (arch == "MiniMaxM2ForCausalLM" and bool(cfg.get("use_qk_norm"))),
            qk_norm_over_heads=arch == "MiniMaxM2ForCausalLM"
            and bool(cfg.get("use_qk_norm"))
            and cfg.get("qk_norm_type", "per_layer") == "per_layer",
            sliding_window=int(sliding) if sliding else None,
            **moe,
            **mla,
            **dsa,
            **linear,
            **checkpoint_fields(cfg),
            raw=dict(cfg),
        )

    # ------------------------------------------------------------------- sizes
    @property
    def context_len(self) -> int:
        return self.max_position_embeddings

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of the checkpoint's dtype."""
        return _DTYPE_BYTES.get(self.torch_dtype, 2)

    @property
    def is_moe(self) -> bool:
        """A mixture of experts: some layers route each token to num_experts_per_tok of num_experts."""
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek): the KV cache holds a latent, not K and V heads."""
        return self.kv_lora_rank is not None

    @property
    def is_dsa(self) -> bool:
        """DeepSeek Sparse Attention (GLM-5): MLA whose queries attend the index_topk cached tokens an indexer picks."""
        return self.index_topk > 0

    @property
    def index_key_bytes(self) -> int:
        """Bytes of one token's indexer key in one layer (0 without DSA): fp8 with a scale per 128 elements."""
        blocks = -(-self.index_head_dim // _INDEX_KEY_QUANT_BLOCK)
        return self.index_head_dim + blocks * _INDEX_KEY_SCALE_BYTES if self.is_dsa else 0

    @property
    def is_hybrid_linear(self) -> bool:
        """Some layers are linear attention (Qwen3.5's Gated DeltaNet): a state a request, no per-token KV."""
        return self.linear_attention_layers > 0

    @property
    def full_attention_layers(self) -> int:
        """The layers that cache K and V per token (all but the linear-attention ones)."""
        return self.num_hidden_layers - self.linear_attention_layers

    @property
    def linear_conv_dim(self) -> int:
        """Channels of a linear-attention layer's causal conv: its q, k (key heads) and v (value heads)."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.linear_num_value_heads * self.linear_value_head_dim

    def state_bytes_per_request(self, tp: int = 1) -> int:
        """The fixed-size state one request holds on one of `tp` GPUs, whatever its length: in each linear-
        attention layer the conv window (linear_conv_kernel_dim - 1 past inputs of every conv channel, in the
        model's dtype) and the recurrent state (a key x value matrix a value head, in mamba_ssm_dtype), heads
        split over TP, as SGLang's Mamba2CacheParams sizes them (its mamba pool, beside the KV pool). 0 for a
        model without linear attention."""
        if not self.is_hybrid_linear:
            return 0
        conv = self.linear_conv_dim // tp * (self.linear_conv_kernel_dim - 1) * self.dtype_bytes
        recurrent = (
            self.linear_num_value_heads // tp * self.linear_key_head_dim * self.linear_value_head_dim * self.linear_state_dtype_bytes
        )
        return self.linear_attention_layers * (conv + recurrent)

    @property
    def num_moe_layers(self) -> int:
        return self.num_hidden_layers - len(self.dense_layers) if self.is_moe else 0

    @property
    def num_dense_mlp_layers(self) -> int:
        """Layers with a dense MLP of intermediate_size (every layer of a dense model)."""
        return self.num_hidden_layers - self.num_moe_layers

    @property
    def kv_elements_per_token_layer(self) -> int:
        """Elements one token caches in one layer on one GPU of TP 1: K and V heads, or MLA's latent and RoPE key."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_key_value_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int = 2, tp: int = 1) -> int:
        """K and V of one token across all layers (on one of `tp` GPUs). MLA caches one latent per
        layer instead, kv_lora_rank + qk_rope_head_dim elements (a single "head"), which every GPU
        of a TP group holds whole (as SGLang's and vLLM's MLA backends do): TP does not divide it.
        DSA adds its indexer's key, index_key_bytes a layer, whole on every GPU too."""
        if self.is_mla:
            return self.num_hidden_layers * ((self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes + self.index_key_bytes)
        # Linear-attention layers cache nothing per token (their state is state_bytes_per_request).
        return 2 * self.full_attention_layers * self.kv_heads_per_gpu(tp) * self.head_dim * dtype_bytes

    # ------------------------------------------------------ tensor parallelism
    # How the model splits over tp x dp GPUs, experts over ep: model_params.py.

    def check_tp(self, tp: int) -> None:
        """Raise ModelConfigError unless the model splits over `tp` GPUs."""
        heads, kv = self.num_attention_heads, self.num_key_value_heads
        if tp < 1:
            raise ModelConfigError(f"--tp must be >= 1, got {tp}")
        if heads % tp:
            raise ModelConfigError(f"--tp {tp} does not divide {self.name}'s {heads} attention heads")
        if not self.is_mla and kv % tp and tp % kv:
            raise ModelConfigError(
                f"--tp {tp}: {self.name}'s {kv} KV heads neither split evenly over {tp} GPUs "
                f"nor replicate evenly (TP must divide them or be a multiple of them)"
            )
        if self.num_dense_mlp_layers and self.intermediate_size % tp:
            raise ModelConfigError(f"--tp {tp} does not divide {self.name}'s intermediate size {self.intermediate_size}")
        if self.shared_expert_intermediate_size % tp:
            raise ModelConfigError(
                f"--tp {tp} does not divide {self.name}'s shared experts' intermediate size {self.shared_expert_intermediate_size}"
            )
        if self.is_hybrid_linear and (self.linear_num_key_heads % tp or self.linear_num_value_heads % tp):
            raise ModelConfigError(
                f"--tp {tp} does not divide {self.name}'s linear-attention heads "
                f"({self.linear_num_key_heads} key, {self.linear_num_value_heads} value)"
            )

    def check_parallel(self, tp: int = 1, ep: int = 1, dp: int = 1) -> None:
        """Raise ModelConfigError unless the model splits so: check_tp, and for a mixture of experts
        --ep dividing its experts and the tp x dp GPUs, the MoE's TP ((tp x dp) / ep) its expert size.
        --ep and --dp are for a mixture of experts only."""
        self.check_tp(tp)
        for flag, v in (("--ep", ep), ("--dp", dp)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ModelConfigError(f"{flag} must be a positive integer, got {v!r}")
        if not self.is_moe:
            if ep > 1 or dp > 1:
                asked = f"--ep {ep}" if ep > 1 else f"--dp {dp}"
                raise ModelConfigError(
                    f"{asked}: {self.name} is a dense model; expert parallelism and DP attention are for a mixture of experts "
                    "(a dense model's data parallelism is --replicas N)"
                )
            return
        gpus = tp * dp
        if self.num_experts % ep:
            raise ModelConfigError(f"--ep {ep} does not divide {self.name}'s {self.num_experts} experts")
        if gpus % ep:
            raise ModelConfigError(f"--ep {ep} does not divide the {gpus} GPUs (--tp {tp} x --dp {dp}) the experts are spread over")
        moe_tp = gpus // ep
        if self.moe_intermediate_size % moe_tp:
            raise ModelConfigError(
                f"--tp {tp} x --dp {dp} / --ep {ep} = {moe_tp} GPUs an expert does not divide {self.name}'s expert "
                f"intermediate size {self.moe_intermediate_size}"
            )

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        return max(1, self.num_key_value_heads // tp)


# --------------------------------------------------------------------- loading
def bundled_model_names() -> list[str]:
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.json"))


# Hugging Face ids name variants of one architecture (an instruct tune, a quantized checkpoint, a
# dated release such as Qwen's -2507): the bundled config is the base model's.
_VARIANT_SUFFIXES = re.compile(r"(-(instruct|chat|base|hf|thinking|\d{4}|fp8|fp8-dynamic|nvfp4|fp4|awq|gptq|int4|int8|w8a8))+$")


def bundled_model_of(model_path: str) -> str | None:
    """meta-llama/Llama-3.1-8B-Instruct, Qwen/Qwen3-30B-A3B-Instruct-2507 -> their bundled config's name, if one ships."""
    name = str(model_path).rstrip("/").rsplit("/", 1)[-1].lower()
    bundled = bundled_model_names()
    return next((key for key in (name, _VARIANT_SUFFIXES.sub("", name)) if key in bundled), None)


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path} is not valid JSON: {e}") from e


def load_model_config(name_or_path: str | Path) -> ModelConfig:
    """A bundled name (case-insensitive), a folder with config.json, or a config.json path."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise ModelConfigError(f"model folder {str(path)!r} has no config.json")
        return replace(ModelConfig.from_hf_config(_read_json(cfg_path), name=path.resolve().name), folder=str(path.resolve()))
    if path.is_file():
        # A config.json names its model by its folder; any other file by its stem.
        name = path.resolve().parent.name if path.name == "config.json" else path.stem
        folder = str(path.resolve().parent) if path.name == "config.json" else None
        return replace(ModelConfig.from_hf_config(_read_json(path), name=name), folder=folder)

    key = str(name_or_path).lower()
    if key in bundled_model_names():
        return ModelConfig.from_hf_config(_read_json(CONFIGS_DIR / f"{key}.json"), name=key)
    raise ModelConfigError(
        f"unknown model {str(name_or_path)!r}: not a bundled config, a folder, or a file; bundled: {', '.join(bundled_model_names())}"
    )
