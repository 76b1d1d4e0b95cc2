"""How a forward's tokens load the routed experts of a mixture of experts, on its busiest EP rank.

Each of a forward's N tokens is routed to k of the E experts; with expert parallelism over `ep`
ranks each rank holds E / ep of them, and the MoE layer ends when the busiest rank is done (the
others wait at the combine), so the roofline prices that rank: the expert-token assignments it
computes (FLOPs) and the experts it touches, whose weights it reads (bytes).

- **Balanced** (the default): every expert equally likely, a token's k experts distinct. The
  busiest rank computes N k / ep assignments, and touches each of its E / ep experts with
  probability 1 - (1 - k / E)^N, so E / ep x (1 - (1 - k / E)^N) of them in expectation.
- **Power law** (--expert-imbalance ALPHA): the skewed load AIConfigurator measures its MoE
  kernels under (aiconfigurator's collector/helper.py, ``_generate_power_law_distribution``, the
  ``power_law_<alpha>`` workload of its database; its SDK prices DeepSeek, Qwen3-MoE and gpt-oss with
  alpha 1.01). Each expert's share of the N k assignments is drawn from a power law with exponent
  alpha bounded to [1, 0.8 N] (to [0.01, 2] while N k <= E), by inverse-CDF sampling; the shares are
  rounded to whole tokens summing to N k (largest remainders; AIConfigurator rounds and corrects the
  sum on its largest or smallest experts), an expert takes a token at most once (no expert gets more
  than N: AIConfigurator's wide-EP collector draws again, as here, up to MAX_REDRAWS times, then the
  excess is clipped), the experts are laid out over the ranks in draw order, and the slowest rank
  is the busiest: AIConfigurator swaps the rank with the most assignments to rank 0 and times rank
  0; here, given the roofline's seconds an assignment computes and an expert's weights take to
  read (`rank_time`), the rank whose experts take longest (a rank with fewer tokens but more
  distinct experts is the slower one in a memory-bound decode), else the one with the most
  assignments. The roofline takes that rank's load averaged over DRAWS draws from a fixed seed,
  so a replay is deterministic; each forward size N is drawn once and kept.
"""

from __future__ import annotations

import math

import numpy as np

DRAWS = 64  # draws a forward size is averaged over (the mean's spread is a few percent at E = 128)
SEED = 0  # the draws' seed: the same load for the same N in every replay
MAX_REDRAWS = 20  # draws with an expert over N tokens are drawn again this often, then clipped
# AIConfigurator's power-law bounds: [1, 0.8 N] once there are more assignments than experts, else [0.01, 2].
UPPER_FRACTION = 0.8
SPARSE_BOUNDS = (0.01, 2.0)


def sample_power_law(rng: np.random.Generator, shape: tuple[int, ...], alpha: float, xmin: float, xmax: float) -> np.ndarray:
    """Draws of a power law p(x) ~ x^-alpha on [xmin, xmax] by its inverse CDF (AIConfigurator's
    sample_power_law; alpha 1, where its formula divides by zero, as the log-uniform limit)."""
    u = rng.random(shape)
    if alpha == 1.0:
        return xmin * (xmax / xmin) ** u
    a = 1.0 - alpha
    return ((xmax**a - xmin**a) * u + xmin**a) ** (1.0 / a)


def apportion(shares: np.ndarray, total: int) -> np.ndarray:
    """Each row's shares as whole counts summing to `total` (largest remainders)."""
    exact = shares / shares.sum(axis=1, keepdims=True) * total
    counts = np.floor(exact).astype(np.int64)
    short = total - counts.sum(axis=1)
    order = np.argsort(-(exact - counts), axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(shares.shape[1])[None, :].repeat(shares.shape[0], 0), axis=1)
    return counts + (ranks < short[:, None])


class ExpertLoad:
    """The busiest EP rank's load of a forward of N tokens: balanced, or AIConfigurator's power law."""

    __slots__ = ("num_experts", "top_k", "ep", "alpha", "rank_time", "_per_rank", "_cache")

    def __init__(
        self, num_experts: int, top_k: int, ep: int = 1, alpha: float | None = None, rank_time: tuple[float, float, float] | None = None
    ) -> None:
        """rank_time: (compute seconds an assignment, memory seconds a touched expert, memory seconds an
        assignment) of one rank's experts, by which the power law's slowest rank is found; None: the rank
        with the most assignments."""
        if num_experts % ep:
            raise ValueError(f"{ep} EP ranks do not divide {num_experts} experts")
        if alpha is not None and not (math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"expert imbalance alpha must be a positive number, got {alpha!r}")
        self.num_experts, self.top_k, self.ep, self.alpha, self.rank_time = num_experts, top_k, ep, alpha, rank_time
        self._per_rank = num_experts // ep
        self._cache: dict[int, tuple[float, float]] = {}

    def busiest_rank(self, tokens: int) -> tuple[float, float]:
        """(expert-token assignments the busiest EP rank computes, experts it touches) for `tokens` tokens."""
        if self.alpha is None:
            return tokens * self.top_k / self.ep, distinct_experts(tokens, self.num_experts, self.top_k) / self.ep
        load = self._cache.get(tokens)
        if load is None:
            load = self._cache[tokens] = self._power_law(tokens)
        return load

    def _power_law(self, tokens: int) -> tuple[float, float]:
        e, k = self.num_experts, self.top_k
        if tokens <= 0:
            return 0.0, 0.0
        total = tokens * k
        xmin, xmax = (1.0, UPPER_FRACTION * tokens) if total > e else SPARSE_BOUNDS
        if xmax <= xmin:
            xmin, xmax = SPARSE_BOUNDS
        rng = np.random.default_rng(SEED)
        counts = apportion(sample_power_law(rng, (DRAWS, e), self.alpha, xmin, xmax), total)
        for _ in range(MAX_REDRAWS):
            over = counts.max(axis=1) > tokens
            if not over.any():
                break
            counts[over] = apportion(sample_power_law(rng, (int(over.sum()), e), self.alpha, xmin, xmax), total)
        counts = np.minimum(counts, tokens)
        ranks = counts.reshape(DRAWS, self.ep, self._per_rank)
        assignments = ranks.sum(axis=2)  # (draw, rank)
        touched = (ranks > 0).sum(axis=2)
        if self.rank_time is None:
            busiest = assignments.argmax(axis=1)
        else:
            compute, per_expert, per_assignment = self.rank_time
            busiest = np.maximum(assignments * compute, touched * per_expert + assignments * per_assignment).argmax(axis=1)
        rows = np.arange(DRAWS)
        return float(assignments[rows, busiest].mean()), float(touched[rows, busiest].mean())


def distinct_experts(tokens: float, num_experts: int, top_k: int) -> float:
    """Expected experts `tokens` tokens touch when each picks its k distinct experts uniformly at
    random (the balanced load): E (1 - (1 - k / E)^N)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def spread_row_tokens(tokens: int, num_experts: int, top_k: int) -> float:
    """The token count whose row of AIConfigurator's `balanced` MoE table touches as many experts as
    `tokens` randomly routed tokens do. That table's routing (its collector's ``balanced_logits``)
    spreads the tokens perfectly: token i takes experts i + j ceil(E / k) (mod E), j < k, so N tokens
    touch min(N k, E) distinct experts, where random routing touches distinct_experts(N) of them
    (gpt-oss, E 128, k 4: 32 tokens touch all 128 there, 82 here). In a decode-sized forward the
    kernel's time is that of reading the touched experts' weights (the table grows by one expert's
    weights a token until N k = E, then stays flat to N = 4 E / k)."""
    return distinct_experts(tokens, num_experts, top_k) / top_k


def remote_ranks_per_token(num_experts: int, top_k: int, ep: int) -> float:
    """Expected number of other EP ranks one token's k distinct experts are on: each of the ep - 1
    others holds none of them with probability C(E - E/ep, k) / C(E, k)."""
    if ep <= 1:
        return 0.0
    per_rank = num_experts // ep
    none = math.comb(num_experts - per_rank, top_k) / math.comb(num_experts, top_k)
    return (ep - 1) * (1.0 - none)
