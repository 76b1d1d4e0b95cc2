"""How each family's config.json names what the dense Llama family has not: the experts of a
mixture of experts (Qwen3-MoE, Mixtral, DeepSeek-V2/V3, gpt-oss, MiniMax-M2, GLM-5), DeepSeek's
multi-head latent attention and sparse attention's indexer (GLM-5), the weight format a
pre-quantized checkpoint is stored in, and where a multimodal model's config nests its language model
(Kimi-K2.5's text_config). Each returns ModelConfig fields; a shape the simulator cannot
price is a ModelConfigError naming the key."""

from __future__ import annotations

from typing import Any


class ModelConfigError(ValueError):
    """A config that cannot be found, parsed, or is of an unsupported architecture."""


def _positive(cfg: dict, key: str, name: str | None, arch: str, value: Any = None) -> int:
    """cfg[key] (or value) as a positive int; ModelConfigError naming the key otherwise."""
    v = cfg.get(key) if value is None else value
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < 1:
        raise ModelConfigError(f"config of {name!r} ({arch}): {key} must be a positive integer, got {v!r}")
    return int(v)


# Multimodal models whose config.json nests the language model under text_config (Kimi-K2.5's is a
# DeepseekV3ForCausalLM config): serving text, only the language model runs, so it is the model. The
# value: the language model's architecture where its text_config names none (Qwen3.5's; SGLang's
# Qwen3_5MoeForCausalLM is the text model its Qwen3_5MoeForConditionalGeneration wraps), else None.
TEXT_CONFIG_WRAPPERS = {"KimiK25ForConditionalGeneration": None, "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeForCausalLM"}


def language_model_config(cfg: dict, name: str | None) -> dict:
    """The language model's config: a wrapper's text_config, any other config itself."""
    archs = cfg.get("architectures") or []
    if not archs or archs[0] not in TEXT_CONFIG_WRAPPERS:
        return cfg
    text = cfg.get("text_config")
    implied = TEXT_CONFIG_WRAPPERS[archs[0]]
    if isinstance(text, dict) and implied and not text.get("architectures"):
        # The wrapper's own keys the text model reads (tie_word_embeddings sits at the top level).
        return {"tie_word_embeddings": cfg.get("tie_word_embeddings", False), **text, "architectures": [implied]}
    if not isinstance(text, dict) or not text.get("architectures"):
        raise ModelConfigError(f"config of {name!r} ({archs[0]}) has no text_config with the language model's architectures")
    return text


def moe_fields(cfg: dict, arch: str, name: str | None, need, layers: int) -> dict:
    """The expert fields of a MoE config, with the names each family gives them; ModelConfigError for
    a shape the simulator cannot price (no experts, more experts a token than there are, ...)."""
    key = next((k for k in ("num_experts", "num_local_experts", "n_routed_experts") if cfg.get(k) is not None), None)
    if key is None:
        raise ModelConfigError(f"config of {name!r} ({arch}) names no experts (num_experts, num_local_experts or n_routed_experts)")
    experts = _positive(cfg, key, name, arch)
    top_key = next((k for k in ("num_experts_per_tok", "experts_per_token") if cfg.get(k) is not None), "num_experts_per_tok")
    top_k = _positive(cfg, top_key, name, arch)
    if top_k > experts:
        raise ModelConfigError(f"config of {name!r} ({arch}): {top_key} {top_k} is more than its {experts} experts")
    if arch in ("MixtralForCausalLM", "GptOssForCausalLM", "MiniMaxM2ForCausalLM"):  # every layer MoE; intermediate_size is an expert's
        moe_inter, shared, dense = int(need("intermediate_size")), 0, ()
    elif arch == "Qwen3_5MoeForCausalLM":  # every layer MoE (mlp_only_layers empty), with one shared expert
        moe_inter = _positive(cfg, "moe_intermediate_size", name, arch)
        shared = _positive(cfg, "shared_expert_intermediate_size", name, arch)
        if cfg.get("mlp_only_layers"):
            raise ModelConfigError(f"config of {name!r} ({arch}): dense mlp_only_layers are not priced for Qwen3.5")
        dense = ()
    elif arch == "Qwen3MoeForCausalLM":
        moe_inter, shared = _positive(cfg, "moe_intermediate_size", name, arch), 0
        step = _positive(cfg, "decoder_sparse_step", name, arch, cfg.get("decoder_sparse_step") or 1)
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) and 0 <= i < layers for i in only):
            raise ModelConfigError(f"config of {name!r} ({arch}): mlp_only_layers must list layer indices below {layers}, got {only!r}")
        # As transformers' Qwen3MoeDecoderLayer: experts unless listed in mlp_only_layers or off the step.
        dense = tuple(i for i in range(layers) if i in only or (i + 1) % step)
        if cfg.get("shared_expert_intermediate_size"):
            raise ModelConfigError(f"config of {name!r} ({arch}): shared experts are not part of Qwen3-MoE; cannot price this shape")
    else:  # DeepSeek-V2/V3: dense first_k_dense_replace layers, then experts every moe_layer_freq layers
        moe_inter = _positive(cfg, "moe_intermediate_size", name, arch)
        first = int(cfg.get("first_k_dense_replace") or 0)
        freq = _positive(cfg, "moe_layer_freq", name, arch, cfg.get("moe_layer_freq") or 1)
        dense = tuple(i for i in range(layers) if i < first or i % freq)
        shared = int(cfg.get("n_shared_experts") or 0) * moe_inter
    if len(dense) == layers:
        raise ModelConfigError(
            f"config of {name!r} ({arch}): no layer has experts (every one is dense); cannot price it as a mixture of experts"
        )
    if dense:
        need("intermediate_size")
    return {
        "num_experts": experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": moe_inter,
        "shared_expert_intermediate_size": shared,
        "dense_layers": dense,
        "router_bias": arch == "GptOssForCausalLM"
        or (arch in ("DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM") and cfg.get("topk_method") == "noaux_tc")
        or (arch == "MiniMaxM2ForCausalLM" and bool(cfg.get("use_routing_bias"))),
        "expert_bias": arch == "GptOssForCausalLM",
        **(_gpt_oss_fields(cfg, name, layers) if arch == "GptOssForCausalLM" else {}),
    }


def _gpt_oss_fields(cfg: dict, name: str | None, layers: int) -> dict:
    """gpt-oss: sliding-window layers (layer_types) and attention sinks."""
    types = cfg.get("layer_types")
    if types is None:  # as transformers' GptOssConfig: sliding and full alternate, sliding first
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or not set(types) <= {"sliding_attention", "full_attention"}:
        raise ModelConfigError(
            f"config of {name!r} (GptOssForCausalLM): layer_types must give sliding_attention or full_attention for each of its {layers} layers"
        )
    sliding = types.count("sliding_attention")
    if sliding and not cfg.get("sliding_window"):
        raise ModelConfigError(f"config of {name!r} (GptOssForCausalLM): sliding_attention layers without a sliding_window")
    return {"sliding_window_layers": sliding, "attention_sinks": True}


def linear_attention_fields(cfg: dict, arch: str, name: str | None, layers: int) -> dict:
    """Qwen3.5's hybrid layers: Gated DeltaNet linear attention (a fixed-size recurrent state a request)
    in most layers, full gated attention in the others (layer_types, else every full_attention_interval-th
    layer, as transformers' Qwen3_5MoeTextConfig fills it)."""
    types = cfg.get("layer_types")
    if types is None:
        interval = _positive(cfg, "full_attention_interval", name, arch)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or not set(types) <= {"linear_attention", "full_attention"}:
        raise ModelConfigError(
            f"config of {name!r} ({arch}): layer_types must give linear_attention or full_attention for each of its {layers} layers"
        )
    if "full_attention" not in types:
        raise ModelConfigError(f"config of {name!r} ({arch}): no full_attention layer; cannot price a KV cache of none")
    ssm_dtype = cfg.get("mamba_ssm_dtype", "float32")
    return {
        "linear_attention_layers": types.count("linear_attention"),
        "linear_num_key_heads": _positive(cfg, "linear_num_key_heads", name, arch),
        "linear_num_value_heads": _positive(cfg, "linear_num_value_heads", name, arch),
        "linear_key_head_dim": _positive(cfg, "linear_key_head_dim", name, arch),
        "linear_value_head_dim": _positive(cfg, "linear_value_head_dim", name, arch),
        "linear_conv_kernel_dim": _positive(cfg, "linear_conv_kernel_dim", name, arch),
        # SGLang's mamba2_state_dtype: the recurrent state in mamba_ssm_dtype (float32 unless the config
        # says bfloat16/float16; an unknown value keeps float32, as SGLang does).
        "linear_state_dtype_bytes": 2 if ssm_dtype in ("bfloat16", "float16") else 4,
        "attn_output_gate": bool(cfg.get("attn_output_gate", True)),
    }


def mla_fields(cfg: dict, arch: str, name: str | None, need) -> dict:
    """DeepSeek's multi-head latent attention: the latent and head sizes."""
    q_lora = cfg.get("q_lora_rank")
    return {
        "kv_lora_rank": _positive(cfg, "kv_lora_rank", name, arch, need("kv_lora_rank")),
        "q_lora_rank": None if q_lora is None else _positive(cfg, "q_lora_rank", name, arch),
        "qk_nope_head_dim": _positive(cfg, "qk_nope_head_dim", name, arch, need("qk_nope_head_dim")),
        "qk_rope_head_dim": _positive(cfg, "qk_rope_head_dim", name, arch, need("qk_rope_head_dim")),
        "v_head_dim": _positive(cfg, "v_head_dim", name, arch, need("v_head_dim")),
    }


def dsa_fields(cfg: dict, arch: str, name: str | None, need) -> dict:
    """DeepSeek Sparse Attention (GLM-5, as DeepSeek-V3.2): the lightweight indexer's heads and head size,
    and how many cached tokens each query's MLA attends to. GLM-5.2's indexer shared across layers
    (index_topk_freq > 1) is not modelled: every layer is priced with its own."""
    return {
        "index_topk": _positive(cfg, "index_topk", name, arch, need("index_topk")),
        "index_n_heads": _positive(cfg, "index_n_heads", name, arch, need("index_n_heads")),
        "index_head_dim": _positive(cfg, "index_head_dim", name, arch, need("index_head_dim")),
    }


def checkpoint_fields(cfg: dict) -> dict:
    """The weight format of the checkpoint's quantization_config, where the simulator prices it: fp8 with
    weight_block_size is DeepSeek's block-scaled fp8 (fp8_block), without it per tensor (fp8); mxfp4 is
    gpt-oss's (its modules_to_not_convert keep attention in bf16: the experts only). Anything else: None."""
    q = cfg.get("quantization_config")
    if not isinstance(q, dict):
        return {}
    method = q.get("quant_method")
    if method == "fp8":
        fmt = "fp8_block" if q.get("weight_block_size") else "fp8"
    elif method == "mxfp4":
        fmt = "mxfp4"
    else:
        return {}
    keep = q.get("modules_to_not_convert") or []
    experts_only = any("self_attn" in str(m) for m in keep)
    return {"checkpoint_quantization": fmt, "checkpoint_quantizes_experts_only": experts_only}


def checkpoint_weight_format(cfg: dict) -> str | None:
    """The weight format a config.json's quantization_config stores its checkpoint in (fp8, fp8_block,
    mxfp4), where the simulator prices it; None for 16-bit weights or another method."""
    return checkpoint_fields(cfg).get("checkpoint_quantization")
