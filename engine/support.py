"""Which models the real engine builds, and the one-line reason for one it does not.

Imports no torch: testbed/backends.py asks here before it loads the engine, so a refused
--mode real run fails at once.
"""

from __future__ import annotations

from scheduler.model_config import DENSE_ARCHITECTURES, ModelConfig

# Mixtures of experts routed by a softmax over the experts and a top-k, with SiLU-gated experts
# and no shared experts (engine/moe.py).
MOE_ARCHITECTURES = ("Qwen3MoeForCausalLM", "MixtralForCausalLM")
BUILT = "the dense Llama family (Llama, Qwen2/3, Mistral), Qwen3-MoE and Mixtral"


def engine_refusal(cfg: ModelConfig) -> str | None:
    """Why the engine cannot build cfg, as "<name> (<architecture>) <reason>", or None."""
    reason = None
    if cfg.is_mla:
        reason = "has multi-head latent attention"
    elif cfg.attention_sinks or cfg.sliding_window_layers:
        reason = "has attention sinks and sliding-window layers"
    elif cfg.is_moe and cfg.architecture not in MOE_ARCHITECTURES:
        reason = "is a mixture of experts with its own routing"
    elif cfg.shared_expert_intermediate_size or cfg.router_bias or cfg.expert_bias:
        reason = "is a mixture of experts with shared experts or biases"
    elif not cfg.is_moe and cfg.architecture not in DENSE_ARCHITECTURES:
        reason = "is not a Llama-family model"
    if reason is None:
        return None
    return f"{cfg.name} ({cfg.architecture}) {reason}"
