"""Sampling parameters of one request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 0.0  # 0 means greedy
    top_k: int = -1  # -1: no limit
    top_p: float = 1.0
    seed: int | None = None
    # Traces fix output lengths, so replays ignore EOS by default.
    ignore_eos: bool = True
