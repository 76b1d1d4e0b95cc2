"""SGLang's pool of recurrent states for a hybrid linear-attention model (Qwen3.5), beside its KV pool.

A Gated DeltaNet layer holds a fixed-size state a request (ModelConfig.state_bytes_per_request) instead
of per-token K and V. SGLang 0.5.9 (model_runner_kv_cache_mixin.handle_max_mamba_cache, with neither
--max-mamba-cache-size nor --disable-radix-cache beside --max-running-requests) splits the memory left
after the weights between the two pools in the ratio mamba_full_memory_ratio (states : KV), and then
admits at most max_mamba_cache_size // MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO running requests (// 1
with the radix cache disabled). Its other branch (--disable-radix-cache with --max-running-requests:
exactly that many states, the rest to KV) is not modelled: the ratio split is used throughout.
"""

from __future__ import annotations

from dataclasses import replace

from scheduler.model_config import ModelConfig
from scheduler.sglang.config import SchedulerConfig

# server_args.mamba_full_memory_ratio's default: state memory / KV memory.
STATE_TO_KV_MEMORY = 0.9
# MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO (model_runner_kv_cache_mixin.py): state slots a running
# request with the radix cache on (the default mamba_scheduler_strategy "no_buffer"; the radix cache
# keeps states of cached prefixes too).
STATE_SLOTS_PER_REQUEST_WITH_RADIX = 3


def kv_share(model: ModelConfig) -> float:
    """The share of the memory after weights SGLang gives the KV pool (all of it without linear attention)."""
    return 1.0 / (1.0 + STATE_TO_KV_MEMORY) if model.is_hybrid_linear else 1.0


def cap_running_requests(config: SchedulerConfig, model: ModelConfig, kv_bytes_per_token: int, tp: int, dp: int = 1) -> SchedulerConfig:
    """config with max_running_requests at most what the state pool admits: the states that fit in
    STATE_TO_KV_MEMORY times the KV pool's memory (one DP rank's), per STATE_SLOTS_PER_REQUEST_WITH_RADIX
    (1 without the radix cache). Unchanged for a model without linear attention."""
    if not model.is_hybrid_linear:
        return config
    state_memory = config.kv_tokens // dp * kv_bytes_per_token * STATE_TO_KV_MEMORY
    slots = int(state_memory // model.state_bytes_per_request(tp))
    per_request = 1 if config.disable_radix_cache else STATE_SLOTS_PER_REQUEST_WITH_RADIX
    cap = max(1, slots // per_request) * dp
    return replace(config, max_running_requests=min(config.max_running_requests or cap, cap))
