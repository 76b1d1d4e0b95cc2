"""A server's Prometheus `/metrics`, read for the steps table of a server run: running and waiting
requests and KV cache usage, under vLLM's and SGLang's gauge names.

vLLM 0.19: `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
(a fraction; older releases `vllm:gpu_cache_usage_perc`), the pool from `vllm:cache_config_info`'s
`num_gpu_blocks` x `block_size` labels. SGLang: `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
`sglang:token_usage` (a fraction), `sglang:max_total_num_tokens`. A gauge with several label sets
(one per model or engine) is summed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
KV_TOKENS = ("sglang:max_total_num_tokens",)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class ServerGauges:
    running: int | None
    waiting: int | None
    kv_usage: float | None  # 0..1
    kv_tokens: int | None  # the KV pool, where the server says


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of a text exposition: name -> [(labels, value), ...]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m[3])
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m[2] or ""))
        out.setdefault(m[1], []).append((labels, value))
    return out


def _first(samples: dict, names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in samples:
            return sum(v for _, v in samples[name])
    return None


def gauges(text: str) -> ServerGauges:
    samples = parse_metrics(text)
    running, waiting = _first(samples, RUNNING), _first(samples, WAITING)
    kv_tokens = _first(samples, KV_TOKENS)
    if kv_tokens is None and "vllm:cache_config_info" in samples:
        labels = samples["vllm:cache_config_info"][0][0]
        try:
            kv_tokens = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):
            kv_tokens = None
    return ServerGauges(
        None if running is None else int(running),
        None if waiting is None else int(waiting),
        _first(samples, KV_USAGE),
        None if kv_tokens is None else int(kv_tokens),
    )
