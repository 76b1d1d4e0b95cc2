"""SGLang's defaults that depend on the device's memory (SGLang 0.5.23,
srt/arg_groups/memory_hook.py: handle_gpu_memory_settings), for each GPU of a tensor-parallel
group (pp = 1, a dense model without MLA, CUDA graphs on as SGLang's default on CUDA):

- chunked_prefill_size by memory tier: < 20 GiB 2048; < 60 GiB 4096; < 160 GiB 8192;
  else 16384 (4096 when the memory is unknown);
- mem_fraction_static = (memory - reserved) / memory, rounded to 3 places, where reserved
  (MiB) = 512 + 1.5 x max(chunk, 2048) (or max_prefill_tokens without chunking)
  + tp x 128 (parallel slack) + 2 x the decode CUDA-graph batch size (tier: 8, 48, 32, 256,
  256, 512; 160, 160, 512, 512 for the middle tiers at tp >= 4; at most max_running_requests)
  + 8 per captured prefill graph size; at least 10 GiB on devices above 60 GiB.
"""

from __future__ import annotations

MIB = 1 << 20


def _tier(memory_mib: float, tp: int = 1) -> tuple[int, int]:
    """(chunked_prefill_size, decode CUDA-graph max batch size) of a device memory."""
    wide = tp >= 4
    if memory_mib < 20 * 1024:
        return 2048, 8  # T4, 4080
    if memory_mib < 35 * 1024:
        return 4096, 160 if wide else 48  # A10, 4090, 5090
    if memory_mib < 60 * 1024:
        return 4096, 160 if wide else 32  # A100 40GB, L40
    if memory_mib < 160 * 1024:
        return 8192, 512 if wide else 256  # H100, A100 80GB, H20, H200
    return 16384, 512  # B200, MI300


def default_chunked_prefill_size(memory_bytes: int | None) -> int:
    return 4096 if memory_bytes is None else _tier(memory_bytes / MIB)[0]


def default_cuda_graph_max_bs(memory_bytes: int, tp: int = 1) -> int:
    """The largest decode batch SGLang captures a CUDA graph for on a device of this memory."""
    return _tier(memory_bytes / MIB, tp)[1]


def prefill_graph_sizes(max_tokens: int) -> list[int]:
    """SGLang's prefill CUDA-graph capture sizes up to max_tokens (generate_prefill_cuda_graph_batch_sizes)."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_tokens + 1, 512))
    )
    return [s for s in sizes if s <= max_tokens]


def default_mem_fraction_static(
    memory_bytes: int | None,
    chunked_prefill_size: int,
    max_prefill_tokens: int,
    max_running_requests: int | None = None,
    tp: int = 1,
) -> float:
    """SGLang's mem_fraction_static for a device of memory_bytes (0.95 when unknown)."""
    if memory_bytes is None:
        return 0.95
    mem = memory_bytes / MIB
    decode_graph_bs = _tier(mem, tp)[1]
    if max_running_requests is not None:
        decode_graph_bs = min(decode_graph_bs, max_running_requests)
    chunking = chunked_prefill_size > 0
    activation_tokens = max(chunked_prefill_size if chunking else max_prefill_tokens, 2048)
    reserved = 512 + activation_tokens * 1.5 + tp * 1024 / 8
    reserved += decode_graph_bs * 2 + len(prefill_graph_sizes(chunked_prefill_size if chunking else 0)) * 8
    if mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mem - reserved) / mem, 3)


# SGLang's KV cache for DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5) under --kv-cache-dtype auto:
# fp8 on Blackwell and later (compute capability 10.x: sm_version >= 100), else bf16
# (srt/server_args.py, _set_default_nsa_kv_cache_dtype, SGLang 0.5.9).
DSA_FP8_KV_FROM_SM = 100


def default_kv_cache_dtype(sparse_attention: bool, sm_version: int) -> str:
    """--kv-cache-dtype auto as SGLang resolves it: fp8 for a DSA model on Blackwell, else auto (the model's dtype)."""
    return "fp8" if sparse_attention and sm_version >= DSA_FP8_KV_FROM_SM else "auto"
