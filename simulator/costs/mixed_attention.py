"""What decode rows cost when they share a forward with a prefill chunk, from measured mixed batches.

A kernel profile (simulator/costs/kernel_cost.py) prices a MIXED forward's attention as its parts: the
prefill chunk from the prefill table, the decoding requests from the decode table, each measured
alone. An engine need not run them so. vLLM's FlashAttention backend sends any forward that carries
a prefill chunk through its varlen prefill kernel, decode rows included, and those rows then do not
get the split-KV parallelism of a decode-only forward: on the RTX PRO 6000 under vLLM 0.19, 64
decodes of 4,096 tokens took 1.9x as long beside a prefill chunk as alone (LLMServingSim's kernel
timings, `../shared/ground_truth/ops-rtxpro6000-llama-3.1-8b/attention.csv`). AIConfigurator's
database measures no mixed batch, so this comes from a GPU's own mixed-batch timings where there are
some, and applies to profiles of that GPU and engine only: the factor is the kernel's, not a
constant of serving (on Hopper's FA3 the same factor made H100, H200 and B200 points worse).

MixedDecodeFactor maps (decoding requests, their context) to the multiple of the decode table's
time that those rows cost in a mixed forward: the median over the measured prefill shapes of
(mixed - prefill alone) / (decodes alone). Below 1, the rows hide inside the prefill kernel's time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.costs.llmservingsim_attention import AttentionTimingsError, read_timings


@dataclass(frozen=True)
class MixedDecodeFactor:
    n_decode: tuple[int, ...]  # grid of decoding requests
    kv_decode: tuple[int, ...]  # grid of their context (tokens)
    factor: tuple[tuple[float, ...], ...]  # [n_decode][kv_decode]
    source: str  # what measured it

    def __post_init__(self) -> None:
        # The grids in log space, made once: a replay asks at every mixed forward.
        object.__setattr__(self, "_log_n", np.log(self.n_decode))
        object.__setattr__(self, "_log_kv", np.log(self.kv_decode))
        object.__setattr__(self, "_table", np.asarray(self.factor))

    def __call__(self, n_decode: float, kv_decode: float) -> float:
        """Bilinear in log(requests) and log(context), held at the grid's edges."""
        b = np.log(max(kv_decode, 1.0))
        row = [np.interp(b, self._log_kv, r) for r in self._table]
        return float(np.interp(np.log(max(n_decode, 1.0)), self._log_n, row))

    def to_dict(self) -> dict:
        return {
            "n_decode": list(self.n_decode),
            "kv_decode": list(self.kv_decode),
            "factor": [list(r) for r in self.factor],
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "MixedDecodeFactor":
        return cls(
            tuple(int(v) for v in d["n_decode"]),
            tuple(int(v) for v in d["kv_decode"]),
            tuple(tuple(float(v) for v in r) for r in d["factor"]),
            str(d.get("source", "")),
        )


def from_llmservingsim(path: str | Path) -> MixedDecodeFactor:
    """The factor from LLMServingSim's attention.csv (one layer's attention, µs, of a prefill chunk of
    `prefill_chunk` tokens over `kv_prefill` cached ones beside `n_decode` requests of `kv_decode`)."""
    times = read_timings(path)
    ratios: dict[tuple[int, int], list[float]] = defaultdict(list)
    for (pc, kp, nd, kd), t in times.items():
        alone_p, alone_d = times.get((pc, kp, 0, 0)), times.get((0, 0, nd, kd))
        if pc and nd and alone_p is not None and alone_d:
            ratios[(nd, kd)].append((t - alone_p) / alone_d)
    nds, kds = sorted({k[0] for k in ratios}), sorted({k[1] for k in ratios})
    if len(nds) < 2 or len(kds) < 2 or any((n, k) not in ratios for n in nds for k in kds):
        raise AttentionTimingsError(
            f"{path}: needs mixed rows with the same prefill shapes measured alone, and decode "
            f"batches measured alone, on a full grid of n_decode x kv_decode (found {len(ratios)} cells)"
        )
    table = tuple(tuple(max(0.0, float(np.median(ratios[(n, k)]))) for k in kds) for n in nds)
    return MixedDecodeFactor(tuple(nds), tuple(kds), table, str(path))
