"""Decode attention priced from a GPU's own timings of the engine, where they lie beside a run.

AIConfigurator times an attention kernel alone, again and again on the same KV cache, so a KV cache
that fits in the GPU's L2 is read from the L2. In a served forward every layer's KV is read once a
step, between the other layers' weights and KV, so it comes from memory. The RTX PRO 6000 (128 MB of
L2, 1.79 TB/s of GDDR7) shows it: in the database's vLLM decode table, 32 requests of 1,024 tokens
(134 MB of KV a layer) read at 98% of the memory's bandwidth and 32 of 2,048 (268 MB) at 76%, where
a kernel that reads from memory reads a larger batch no slower. LLMServingSim's timings of the same
GPU under vLLM 0.19 (llmservingsim_attention.py; the KV comes from memory there) take 1.1-1.9x the
database's time (median 1.47x) at 32-134 MB of KV a layer, 1.0-1.18x at 268 MB and 1.0-1.09x from
0.5 GB on (`../shared/ground_truth/ops-rtxpro6000-llama-3.1-8b/attention.csv`); below 32 MB, where
fixed costs dominate, 0.87-1.35x (median 1.02x).

Such timings are of one model's attention at one TP (the heads and head size on a GPU), so they
replace the database's decode table only for a profile of that model and TP. Inside the measured
grid the profile's time is the measured one; outside it (more requests or context than measured,
or fewer) the database's time scaled by measured / database at the nearest measured shape, so the
table stays continuous where the two sources meet.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.costs.llmservingsim_attention import AttentionTimingsError, read_timings


@dataclass(frozen=True)
class MeasuredDecodeAttention:
    n_decode: tuple[int, ...]  # grid of decoding requests
    kv_decode: tuple[int, ...]  # grid of their context (tokens)
    seconds: tuple[tuple[float, ...], ...]  # one layer's decode attention, [n_decode][kv_decode]
    source: str  # what measured it

    def __call__(self, n: float, kv: float) -> float:
        """Seconds at n requests of kv tokens: linear in both (a memory-bound kernel's time is
        affine in the KV it reads), held at the grid's edges."""
        row = [np.interp(kv, self.kv_decode, r) for r in self.seconds]
        return float(np.interp(n, self.n_decode, row))

    def nearest(self, n: float, kv: float) -> tuple[float, float]:
        """The measured shape nearest (n, kv): each clamped into the grid."""
        return min(max(n, self.n_decode[0]), self.n_decode[-1]), min(max(kv, self.kv_decode[0]), self.kv_decode[-1])

    def overlay(self, batch: list[int], context: list[int], seconds: list[list[float]]) -> list[list[float]]:
        """A profile's (batch x context) decode table, one layer's seconds, with these timings in it:
        each cell the table's time x measured / table at the nearest measured shape (inside the grid:
        the measured time itself)."""
        table = np.asarray(seconds, dtype=float)

        def tabled(n: float, kv: float) -> float:
            row = [np.interp(kv, context, r) for r in table]
            return float(np.interp(n, batch, row))

        out = []
        for b, row in zip(batch, table):
            cells = []
            for c, t in zip(context, row):
                n, kv = self.nearest(b, c)
                base = tabled(n, kv)
                cells.append(float(t * self(n, kv) / base) if base > 0 else float(t))
            out.append(cells)
        return out

    def record(self) -> dict:
        """What the profile says of them."""
        return {
            "source": self.source,
            "n_decode": [self.n_decode[0], self.n_decode[-1]],
            "kv_decode": [self.kv_decode[0], self.kv_decode[-1]],
        }


def from_llmservingsim(path: str | Path) -> MeasuredDecodeAttention:
    """The decode-only batches of LLMServingSim's attention.csv (no prefill chunk beside them), on the
    context lengths measured at every batch size."""
    rows: dict[int, dict[int, float]] = defaultdict(dict)
    for (pc, kp, nd, kd), us in read_timings(path).items():
        if pc == 0 and kp == 0 and nd > 0 and kd > 0:
            rows[nd][kd] = us * 1e-6
    nds = sorted(rows)
    kds = sorted(set.intersection(*(set(rows[n]) for n in nds))) if nds else []
    if len(nds) < 2 or len(kds) < 2:
        raise AttentionTimingsError(
            f"{path}: needs decode batches measured alone (prefill_chunk 0) at two or more batch sizes, "
            f"each at the same two or more contexts (found {len(nds)} batch sizes, {len(kds)} common contexts)"
        )
    return MeasuredDecodeAttention(tuple(nds), tuple(kds), tuple(tuple(rows[n][k] for k in kds) for n in nds), str(path))
