"""Synthetic traces: Poisson or bursty arrivals, length distributions, shared prefixes.

Prefix sharing is written as block hashes (see testbed/traces/schema.py): requests that share a
system prompt share its block hashes, and each turn of a conversation repeats the block
hashes of the previous turn's prompt, so the radix cache sees the reuse it would see with
real text. Same config and seed, same trace.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from testbed.traces.schema import Trace, TraceRequest


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution parsed from a spec string; samples are ints >= 1."""

    kind: str  # "const", "uniform", "normal" or "lognormal"
    a: float  # const: the value; uniform: LO; normal: MEAN; lognormal: MEAN of the lengths
    b: float = 0.0  # uniform: HI (inclusive); normal: STD; lognormal: SIGMA of log(length)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "const":
            x = np.full(n, self.a)
        elif self.kind == "uniform":
            x = rng.integers(int(self.a), int(self.b), size=n, endpoint=True)
        elif self.kind == "normal":
            x = rng.normal(self.a, self.b, size=n)
        else:  # lognormal, parameterized so that the mean of the lengths is `a`
            mu = math.log(self.a) - self.b**2 / 2
            x = rng.lognormal(mu, self.b, size=n)
        return np.clip(np.rint(x), 1, MAX_LENGTH).astype(np.int64)  # a wide spread has tails past both ends

    def __str__(self) -> str:
        return f"{self.a:g}" if self.kind == "const" else f"{self.kind}:{self.a:g},{self.b:g}"


# A generated length: more than any model's context (a trace's lengths are int64; numpy draws them).
MAX_LENGTH = 2**24
_SPEC = re.compile(r"(?:(const|uniform|normal|lognormal):)?([^,:]+)(?:,([^,:]+))?")


def parse_length_spec(spec: str | int) -> LengthDist:
    """`512`, `const:512`, `uniform:LO,HI`, `normal:MEAN,STD` or `lognormal:MEAN,SIGMA`.
    Raises ValueError with a message fit for the command line."""
    text = str(spec).replace(" ", "")
    usage = f"bad length spec {text!r}: use N, uniform:LO,HI, normal:MEAN,STD or lognormal:MEAN,SIGMA"
    m = _SPEC.fullmatch(text)
    if not m:
        raise ValueError(usage)
    kind = m.group(1) or "const"
    try:
        a = float(m.group(2))
        b = float(m.group(3)) if m.group(3) is not None else None
    except ValueError:
        raise ValueError(usage) from None
    if (kind == "const") != (b is None) or not math.isfinite(a) or (b is not None and not math.isfinite(b)):
        raise ValueError(usage)
    b = b or 0.0
    problem = {
        "const": not 1 <= a <= MAX_LENGTH and f"a length must be from 1 to {MAX_LENGTH:,}",
        "uniform": not 1 <= a <= b <= MAX_LENGTH and f"need 1 <= LO <= HI <= {MAX_LENGTH:,}",
        "normal": (b < 0 or not 1 <= a <= MAX_LENGTH) and f"need 1 <= MEAN <= {MAX_LENGTH:,} and STD >= 0",
        "lognormal": (not 0 < a <= MAX_LENGTH or b < 0) and f"need 0 < MEAN <= {MAX_LENGTH:,} and SIGMA >= 0",
    }[kind]
    if problem:
        raise ValueError(f"bad length spec {text!r}: {problem}")
    return LengthDist(kind, a, b)


@dataclass
class GenConfig:
    num_requests: int = 300
    rate: float = 10.0  # mean arrival rate, requests per second
    arrival: str = "poisson"  # "poisson", or "gamma": bursty, gamma inter-arrival times
    cv: float = 1.0  # gamma: coefficient of variation of inter-arrival times (1 = Poisson)
    # Lengths of the *new* tokens of each request (its user message); a request's prompt
    # is its system prompt (if any) + earlier turns (if any) + these tokens.
    input_len: str = "uniform:100,600"
    output_len: str = "uniform:50,400"
    system_prompts: int = 0  # K distinct system prompts
    system_prompt_len: int = 512  # tokens; shared in whole blocks only (see _Prompt)
    shared_fraction: float = 0.0  # fraction of sessions that start with one of the K prompts
    multi_turn_fraction: float = 0.0  # fraction of requests that are turns of conversations
    turns: int = 3  # requests per conversation
    block_size: int = 64  # small, so that short prompts still share whole blocks
    seed: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        parse_length_spec(self.input_len)
        parse_length_spec(self.output_len)
        checks = [
            (self.num_requests >= 1, "num_requests must be >= 1"),
            (self.rate > 0 and math.isfinite(self.rate), "rate must be > 0"),
            (self.arrival in ("poisson", "gamma"), "arrival must be 'poisson' or 'gamma'"),
            (self.cv > 0, "cv must be > 0"),
            (self.system_prompts >= 0, "system_prompts must be >= 0"),
            (self.system_prompt_len >= 1, "system_prompt_len must be >= 1"),
            (0 <= self.shared_fraction <= 1, "shared_fraction must be in [0, 1]"),
            (0 <= self.multi_turn_fraction <= 1, "multi_turn_fraction must be in [0, 1]"),
            (self.turns >= 1, "turns must be >= 1"),
            (self.block_size >= 1, "block_size must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


class _Prompt:
    """A prompt under construction, as block hashes over its length.

    `owned_tail` says whether a partial last block belongs to this prompt's session. Only
    then may new tokens extend it under the same hash (its tokens in this prompt are a
    prefix of that block); a partial block of a shared system prompt gets a fresh hash
    when a request appends its own tokens, since other requests append different ones.
    """

    def __init__(self, block_size: int, hashes: list[int] | None = None, length: int = 0, owned_tail: bool = True):
        self.block_size = block_size
        self.hashes = list(hashes or [])
        self.length = length
        self.owned_tail = owned_tail

    def copy(self) -> _Prompt:
        return _Prompt(self.block_size, self.hashes, self.length, self.owned_tail)

    def append(self, n: int, fresh: _HashCounter) -> None:
        """Append n new tokens of this session's own content."""
        if self.length % self.block_size and not self.owned_tail:
            self.hashes[-1] = fresh()
        self.length += n
        while len(self.hashes) * self.block_size < self.length:
            self.hashes.append(fresh())
        self.owned_tail = True


class _HashCounter:
    def __init__(self, start: int = 0):
        self.next = start

    def __call__(self) -> int:
        self.next += 1
        return self.next - 1


def poisson_arrivals(n: int, rate: float, rng: np.random.Generator) -> list[float]:
    """n arrival times of a Poisson process at `rate` req/s, the first at 0."""
    gaps = rng.exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return np.round(np.cumsum(gaps), 6).tolist()  # microseconds are plenty; files stay short


def _arrivals(cfg: GenConfig, rng: np.random.Generator) -> list[float]:
    if cfg.arrival == "poisson":
        return poisson_arrivals(cfg.num_requests, cfg.rate, rng)
    # Gamma with shape k has CV 1/sqrt(k); scale keeps the mean gap at 1/rate.
    shape = 1.0 / cfg.cv**2
    gaps = rng.gamma(shape, 1.0 / (cfg.rate * shape), size=cfg.num_requests)
    gaps[0] = 0.0
    return np.round(np.cumsum(gaps), 6).tolist()


def generate_trace(cfg: GenConfig) -> Trace:
    cfg.validate()
    rng = np.random.default_rng(cfg.seed)
    n, bs = cfg.num_requests, cfg.block_size
    arrivals = _arrivals(cfg, rng)
    new_tokens = parse_length_spec(cfg.input_len).sample(rng, n)
    outputs = parse_length_spec(cfg.output_len).sample(rng, n)

    # Sessions: conversations of `turns` requests, then single requests. Their requests are
    # interleaved at random over the arrival slots, each conversation's turns in order.
    n_conv = min(round(n * cfg.multi_turn_fraction / cfg.turns), n // cfg.turns) if cfg.turns > 1 else 0
    session_sizes = [cfg.turns] * n_conv + [1] * (n - n_conv * cfg.turns)
    slots = rng.permutation(np.repeat(np.arange(len(session_sizes)), session_sizes))
    with_prompt = rng.random(len(session_sizes)) < cfg.shared_fraction
    which_prompt = rng.integers(0, max(cfg.system_prompts, 1), size=len(session_sizes))

    fresh = _HashCounter()
    system = [
        _Prompt(bs, [fresh() for _ in range(-(-cfg.system_prompt_len // bs))], cfg.system_prompt_len, owned_tail=False)
        for _ in range(cfg.system_prompts)
    ]
    state: dict[int, tuple[_Prompt, int, int]] = {}  # session -> (last prompt, its output_len, turns so far)
    requests: list[TraceRequest] = []
    for i, s in enumerate(slots.tolist()):
        shared = cfg.system_prompts > 0 and bool(with_prompt[s])
        if s in state:
            prev, prev_out, turn = state[s]
            prompt = prev.copy()
            prompt.append(prev_out, fresh)  # the previous answer, as the client sends it back
        else:
            turn = 0
            prompt = system[int(which_prompt[s])].copy() if shared else _Prompt(bs)
        prompt.append(int(new_tokens[i]), fresh)
        out = int(outputs[i])
        state[s] = (prompt, out, turn + 1)
        multi = session_sizes[s] > 1
        rid = f"conv{s}.turn{turn}" if multi else f"req{s - n_conv}"
        # Requests that share nothing carry no hashes: their tokens are unique anyway.
        hashes = prompt.hashes if (multi or shared) else None
        requests.append(TraceRequest(arrivals[i], prompt.length, out, None, hashes, bs, rid))
    return Trace(requests=requests, path=None, format="native")
