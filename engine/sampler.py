"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds.

The draw is an exponential race, argmax(p / q) with q ~ Exp(1), which picks
token i with probability p_i (as SGLang and vLLM do). Its noise q is per row,
so a seeded request fills its row from its own generator, seeded from
(seed, step): the same logits at the same step give the same token whatever
else is in the batch. Unseeded rows share one generator per call, seeded from
the batch's global seed, so whole runs replay exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.forward_batch import to_device
from scheduler.core.sampling import SamplingParams


@dataclass(frozen=True)
class SamplingBatch:
    temperatures: tuple[float, ...]  # 0: greedy
    top_ks: tuple[int, ...]  # <= 0: no limit
    top_ps: tuple[float, ...]  # 1.0: no limit
    seeds: tuple[int | None, ...]
    steps: tuple[int, ...]  # output tokens so far, per request
    seed: int = 0  # global seed of the unseeded rows
    salt: int = 0  # e.g. the forward counter, so unseeded noise differs per call
    all_greedy: bool = True
    any_top_k: bool = False
    any_top_p: bool = False

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        steps: Sequence[int],
        seed: int = 0,
        salt: int = 0,
    ) -> SamplingBatch:
        if len(params) != len(steps):
            raise ValueError(f"{len(params)} sampling params but {len(steps)} steps")
        for p in params:
            if p.temperature < 0:
                raise ValueError(f"temperature must be >= 0, got {p.temperature}")
            if not 0.0 < p.top_p <= 1.0:
                raise ValueError(f"top_p must be in (0, 1], got {p.top_p}")
        # top_k == 1 is greedy at any temperature: take the exact argmax.
        greedy = [p.temperature == 0 or p.top_k == 1 for p in params]
        return cls(
            temperatures=tuple(0.0 if g else p.temperature for p, g in zip(params, greedy)),
            top_ks=tuple(p.top_k for p in params),
            top_ps=tuple(p.top_p for p in params),
            seeds=tuple(p.seed for p in params),
            steps=tuple(steps),
            seed=seed,
            salt=salt,
            all_greedy=all(greedy),
            any_top_k=any(p.top_k > 1 for p, g in zip(params, greedy) if not g),
            any_top_p=any(p.top_p < 1.0 for p, g in zip(params, greedy) if not g),
        )

    def __len__(self) -> int:
        return len(self.temperatures)


def mix_seed(*parts: int) -> int:
    """A well-spread 63-bit generator seed from a few ints (nearby inputs such as
    consecutive steps must not give correlated streams)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """[B, V] logits -> [B] int64 token ids on the same device."""
    if logits.dim() != 2 or logits.shape[0] != len(batch):
        raise ValueError(f"logits {tuple(logits.shape)} do not fit a batch of {len(batch)}")
    if batch.all_greedy:
        return logits.argmax(dim=-1)

    device = logits.device
    temps = to_device(batch.temperatures, torch.float32, device)
    greedy = temps == 0
    # Greedy rows ride along with temperature 1; their argmax replaces the draw.
    logits = logits.float() / torch.where(greedy, 1.0, temps).unsqueeze(1)
    if batch.any_top_k or batch.any_top_p:
        logits = _filter_top_k_top_p(logits, batch)
    probs = torch.softmax(logits, dim=-1)
    tokens = (probs / _exponential_noise(probs, batch)).argmax(dim=-1)
    return torch.where(greedy, logits.argmax(dim=-1), tokens)


def _filter_top_k_top_p(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Mask to -inf the tokens outside each row's top-k, then outside its nucleus
    (the smallest set of most likely tokens with probability >= top_p, computed
    on the top-k renormalized distribution, as SGLang does)."""
    vocab = logits.shape[1]
    device = logits.device
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device).unsqueeze(0)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if batch.any_top_k:
        ks = to_device([k if k > 0 else vocab for k in batch.top_ks], torch.int64, device)
        drop |= ranks >= ks.unsqueeze(1)
    if batch.any_top_p:
        top_ps = to_device(batch.top_ps, torch.float32, device)
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= mass_before >= top_ps.unsqueeze(1)
    drop[:, 0] = False  # the most likely token always stays
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _exponential_noise(probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """q ~ Exp(1) per token; seeded rows from their own (seed, step) stream."""
    device = probs.device
    noise = torch.empty_like(probs)
    gen = torch.Generator(device=device)
    seeded = [i for i, s in enumerate(batch.seeds) if s is not None]
    unseeded = [i for i, s in enumerate(batch.seeds) if s is None]
    for i in seeded:
        gen.manual_seed(mix_seed(batch.seeds[i], batch.steps[i]))
        noise[i].exponential_(generator=gen)
    if unseeded:
        gen.manual_seed(mix_seed(batch.seed, batch.salt, *(batch.steps[i] for i in unseeded)))
        if not seeded:
            noise.exponential_(generator=gen)
        else:
            rows = torch.empty((len(unseeded), probs.shape[1]), device=device)
            noise[to_device(unseeded, torch.int64, device)] = rows.exponential_(generator=gen)
    # exponential_ may return 0 on some backends: 0/0 would be NaN, which
    # argmax would pick even for a filtered token.
    return noise.clamp_min_(torch.finfo(noise.dtype).tiny)
