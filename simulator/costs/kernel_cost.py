"""KernelProfileCostModel: a forward's time from a profile of measured kernels (simulator/profiles/kernel_profile.py).

A forward of n new tokens for b requests, on one of the profile's TP GPUs:

    time = dense(n) + lm_head(b) + layers x (prefill_attention(extend part) + decode_attention(decode part))

    dense(n)        every non-attention kernel of every layer (GEMMs, norms, activation, all-reduces)
                    plus the embedding, at n tokens: piecewise linear over the profile's token grid
    lm_head(b)      one logits row per request
    prefill part    EXTEND: every request; MIXED: the requests with more than one new token. Its b'
                    requests, N new tokens and A causal query-key pairs (ForwardPlan.attention_pairs)
                    are priced as b' equal requests with the same N and A: N / b' new tokens each over
                    a prefix of A / N - (N / b' + 1) / 2 (>= 0 always), interpolated in the profile's
                    (batch x new tokens x prefix) table: linearly in batch and prefix, and along new
                    tokens linearly in the pairs they make (exact where the kernel's time is affine in
                    its work, as it is once compute bound)
    decode part     DECODE: every request; MIXED: those with one new token (times the profile's
                    `mixed_decode_factor` where it has one: what decode rows cost beside a prefill
                    chunk on that GPU, simulator/costs/mixed_attention.py). b requests of mean
                    context S / b (S: their summed sequence lengths), bilinear in the (batch x
                    context) table. Decode attention reads every request's KV once, so its time is
                    affine in b and S at a given batch: the mean prices a ragged batch as the
                    uniform batch of the same total KV, which is what a memory-bound kernel reads
                    (the database measures uniform batches only, so the ragged case is not checked)

Outside the grids (more tokens, requests, batch, prefix or context than the largest grid point)
every table extrapolates linearly from its last two points along that axis: a constant time per
token (GEMMs, compute bound), per request, per query-key pair (prefill attention, compute bound)
or per KV token (decode attention, memory bound). Below the first point (n < 1) it holds the
first value.

Every table is made monotone at load (a grid value is lowered to the smallest at a larger shape:
the database's timings have noise spikes, e.g. a 1-token GEMM measured slower than a 2-token one),
so more work never costs less. A forward is a sum of kernel times: no gaps between kernels (CUDA
graphs in decode make them small; eager prefill has some). CPU stages use the profile hardware's
default costs (roughly SGLang on a fast host), as the roofline does.

The profile's precision (`precision`: weights and KV cache; simulator/profiles/kernel_profile.py) is in its
tables; a replay asking for another (`check_precision`) is refused, naming both.

A forward the serving engine runs outside a CUDA graph (simulator/costs/cuda_graphs.py: vLLM's
forwards of more tokens than its largest graph, SGLang's extends) is dispatched kernel by kernel
from the host: the profile's `eager_overhead_s` is that dispatch time (simulator/profiles/eager_dispatch.py:
vLLM's 0.8 ms a layer, AIConfigurator's own term; SGLang's for its mixture-of-experts layers, from
its measured points). Kernel launches are
asynchronous: the host queues layer k+1 while the GPU runs layer k, so an eager forward takes
the longer of its kernels and its dispatch, not their sum. A small forward waits for the host;
a large prefill hides it entirely. (Adding the two made every vLLM step that carried a prefill
chunk 25.6 ms slower for an 8B model: 2-4x the measured TPOT of the H200 points in
`testbed validate`.) Without a policy every forward is priced as its kernels alone.

Attention data parallelism (a profile built with `dp` > 1, moe_roofline.py's layout): dp ranks,
each with its own requests and attention over the profile's TP GPUs, the routed experts over all
of them. One scheduler stands for the dp ranks, its requests spread round-robin, so the busiest
rank holds ceil(k / dp) of the forward's k decodes and of its k' prefills (and that share of their
tokens and pairs): dense(), lm_head() and both attentions are priced at that rank's share, the
experts (`per_layer_all_ranks`) at the tokens of every rank, and each rank replays a CUDA graph of
its own tokens.

Load-time work is all of the above; forward_time is a handful of bisections and multiply-adds
(O(1) per plan; MIXED plans loop once over their requests to split decode from extend). The
tables interpolated at a batch size are kept per batch size (a replay sees a few hundred).
"""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np

from scheduler.core.forward_plan import ForwardMode, ForwardPlan
from scheduler.model_config import ModelConfig
from simulator.costs.cuda_graphs import CudaGraphPolicy
from simulator.costs.mixed_attention import MixedDecodeFactor
from simulator.costs.precision import BF16, Precision
from simulator.costs.profile_cost import ProfileError, check_header
from simulator.hardware.specs import HardwareConfigError, HardwareSpec

# The model dimensions a kernel profile was built for (its "model_shapes"): a model with other
# values needs another profile.
SHAPE_KEYS = (
    "architecture",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "qk_norm",
)


# A mixture of experts' own dimensions (a dense model's profile records none of them).
MOE_SHAPE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
MLA_SHAPE_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def model_shapes(model: ModelConfig) -> dict:
    keys = SHAPE_KEYS + (MOE_SHAPE_KEYS if model.is_moe else ()) + (MLA_SHAPE_KEYS if model.is_mla else ())
    return {k: getattr(model, k) for k in keys}


def monotone(table: np.ndarray) -> np.ndarray:
    """Each value lowered to the smallest at a larger-or-equal shape along every axis."""
    t = np.asarray(table, dtype=float)
    for axis in range(t.ndim):
        t = np.flip(np.minimum.accumulate(np.flip(t, axis), axis=axis), axis)
    return t


def _locate(xs: list[float], x: float) -> tuple[int, float]:
    """Segment i (0 .. len - 2) and weight w of x between xs[i] and xs[i + 1]; w > 1 past the end
    (linear extrapolation from the last two points), clamped to 0 before the start."""
    i = bisect_right(xs, x) - 1
    if i < 0:
        return 0, 0.0
    last = len(xs) - 2
    if i > last:
        i = last
    return i, (x - xs[i]) / (xs[i + 1] - xs[i])


class Curve:
    """y(x) piecewise linear over sorted xs; linear extrapolation past the last point."""

    __slots__ = ("xs", "ys", "slopes", "last")

    def __init__(self, xs, ys) -> None:
        self.xs, self.ys = [float(x) for x in xs], [float(y) for y in ys]
        self.slopes = [(self.ys[i + 1] - self.ys[i]) / (self.xs[i + 1] - self.xs[i]) for i in range(len(xs) - 1)]
        self.last = len(xs) - 2

    def __call__(self, x: float) -> float:
        i = bisect_right(self.xs, x) - 1
        if i < 0:
            return self.ys[0]
        if i > self.last:
            i = self.last
        return self.ys[i] + (x - self.xs[i]) * self.slopes[i]

    def many(self, x: np.ndarray) -> np.ndarray:
        """__call__ at each of x, elementwise the same float operations (a sum of two floats is
        the same either way round)."""
        xs = np.asarray(self.xs)
        i = np.searchsorted(xs, x, side="right") - 1  # bisect_right - 1
        below = i < 0
        np.clip(i, 0, self.last, out=i)
        y = x - xs[i]
        y *= np.asarray(self.slopes)[i]
        y += np.asarray(self.ys)[i]
        y[below] = self.ys[0]
        return y


class DecodeTable:
    """Decode attention of all layers: bilinear in (batch, context per request)."""

    def __init__(self, batch, context, seconds: np.ndarray) -> None:
        self.batch, self.context = [float(b) for b in batch], [float(c) for c in context]
        self.t = monotone(seconds)
        self.curves: dict[int, Curve] = {}  # per batch size

    def at_batch(self, b: int) -> Curve:
        """Seconds against context for a batch of b: the table interpolated along batch."""
        c = self.curves.get(b)
        if c is None:
            i, w = _locate(self.batch, b)
            c = self.curves[b] = Curve(self.context, self.t[i] + w * (self.t[i + 1] - self.t[i]))
        return c

    def __call__(self, b: int, context: float) -> float:
        return self.at_batch(b)(context)


class PrefillTable:
    """Prefill attention of all layers for b equal requests: (batch, new tokens each, prefix) ->
    seconds; linear in batch and prefix, linear in causal pairs along new tokens."""

    def __init__(self, batch, tokens, prefix, seconds: np.ndarray) -> None:
        self.batch, self.tokens, self.prefix = ([float(v) for v in axis] for axis in (batch, tokens, prefix))
        self.t = monotone(seconds)
        self.planes: dict[int, list[list[float]]] = {}  # per batch size: the table interpolated along batch

    def plane(self, b: int) -> list[list[float]]:
        p = self.planes.get(b)
        if p is None:
            i, w = _locate(self.batch, b)
            p = self.planes[b] = (self.t[i] + w * (self.t[i + 1] - self.t[i])).tolist()
        return p

    def __call__(self, b: int, num_tokens: float, pairs: float) -> float:
        s = num_tokens / b
        p = pairs / num_tokens - (s + 1) / 2
        if p < 0:
            p = 0.0
        k, wp = _locate(self.prefix, p)
        j = bisect_right(self.tokens, s) - 1
        j = 0 if j < 0 else min(j, len(self.tokens) - 2)
        s0, s1 = self.tokens[j], self.tokens[j + 1]
        # Pairs of one request of x new tokens over prefix p: the coordinate along new tokens.
        c0 = s0 * (p + (s0 + 1) / 2)
        ws = (s * (p + (s + 1) / 2) - c0) / (s1 * (p + (s1 + 1) / 2) - c0)
        plane = self.plane(b)
        r0, r1 = plane[j], plane[j + 1]
        a = r0[k] + wp * (r0[k + 1] - r0[k])
        return a + ws * (r1[k] + wp * (r1[k + 1] - r1[k]) - a)


class KernelProfileCostModel:
    """CostModel of a kernel profile (testbed calibrate --source aiconfigurator)."""

    def __init__(self, profile: dict, path: str | None = None, graphs: CudaGraphPolicy | None = None) -> None:
        where = path or "profile"
        check_header(profile, path)
        try:
            k = profile["kernels"]
            layers = int(k["layers"])
            tokens = k["tokens"]
            dense = np.sum([k["per_layer"][op] for op in k["per_layer"]], axis=0) * layers
            dense = dense + np.sum([k["per_forward"][op] for op in k["per_forward"]], axis=0)
            self.dense = Curve(tokens, monotone(dense))
            self.lm_head = Curve(k["requests"], monotone(k["lm_head"]))
            # Attention data parallelism: the kernels above and the attention tables are one rank's;
            # the routed experts take every rank's tokens (kernel_profile.py). Profiles made before --dp: none.
            self.dp = int(profile.get("dp", 1))
            all_ranks = k.get("per_layer_all_ranks") or {}
            self.all_ranks = Curve(tokens, monotone(np.sum([all_ranks[op] for op in all_ranks], axis=0) * layers)) if all_ranks else None

            pa, da = k["prefill_attention"], k["decode_attention"]
            self.prefill = PrefillTable(pa["batch"], pa["new_tokens"], pa["prefix"], np.asarray(pa["seconds"]) * layers)
            self.decode = DecodeTable(da["batch"], da["context"], np.asarray(da["seconds"]) * layers)
            self.hardware_spec = HardwareSpec.from_dict(profile["hardware_spec"])
            self.tp = int(profile["tp"])
            self.ep = int(profile.get("ep", 1))  # profiles made before --ep: none
            self.expert_imbalance = profile.get("expert_imbalance")
            self.model = profile["model"]
            self.model_shapes = profile["model_shapes"]
            self.eager_overhead = float(k.get("eager_overhead_s", 0.0))  # profiles made before it: none
            # Decode rows beside a prefill chunk, where the GPU's mixed batches were measured (mixed_attention.py).
            mixed = k.get("mixed_decode_factor")
            self.mixed_decode = MixedDecodeFactor.from_dict(mixed) if mixed else None
            # Profiles made before --quantization and --kv-cache-dtype: the model's dtype for both.
            kept = profile.get("precision") or {}
            self.precision = Precision(str(kept.get("weights", BF16)), str(kept.get("kv_cache", BF16)), bool(kept.get("experts_only")))
        except (KeyError, TypeError, ValueError, HardwareConfigError) as e:
            raise ProfileError(
                f"{where}: not a readable kernel profile ({type(e).__name__}: {e}); make it again with "
                f"testbed calibrate --source aiconfigurator"
            ) from None
        self.profile = profile
        self.path = where
        self.graphs = graphs
        self.engine_kv_tokens = None  # the KV pool follows from hardware_spec's memory
        self.cpu = self.hardware_spec.cpu
        name = path.rsplit("/", 1)[-1] if path else "inline"
        self.name = f"profile:{name}"
        # Per decode batch size: the whole forward against mean context, one curve (made on first use).
        self.decode_curves: dict[int, Curve] = {}

    def decode_curve(self, b: int) -> Curve:
        """A decode forward of b requests against their mean context: dense(b) + lm_head(b) +
        the decode table interpolated at batch b (the same as pricing each part on its own)."""
        c = self.decode.at_batch(b)
        if self.dp == 1:
            base = self.dense(b) + self.lm_head(b)
        else:  # the busiest rank's requests, and the experts over every rank's tokens
            rank = -(-b // self.dp)
            c = self.decode.at_batch(rank)
            base = self.dense(rank) + self.lm_head(rank) + (self.all_ranks(b) if self.all_ranks else 0.0)
        curve = self.decode_curves[b] = Curve(c.xs, [base + y for y in c.ys])
        return curve

    def check_model(self, model: ModelConfig, tp: int, ep: int = 1, dp: int = 1) -> None:
        """Refuse a model, TP, EP or DP the profile was not built for, naming both."""

        def at(name: str, t: int, e: int, d: int) -> str:
            return f"{name} at TP {t}" + (f", EP {e}" if e > 1 else "") + (f", DP {d}" if d > 1 else "")

        if model.name != self.model or (tp, ep, dp) != (self.tp, self.ep, self.dp):
            raise ProfileError(
                f"--profile {self.path} was built for {at(self.model, self.tp, self.ep, self.dp)}, not {at(model.name, tp, ep, dp)}"
            )
        if model_shapes(model) != self.model_shapes:
            differ = sorted(key for key, v in model_shapes(model).items() if self.model_shapes.get(key) != v)
            raise ProfileError(
                f"--profile {self.path} was built for {self.model} with other shapes than this {model.name} ({', '.join(differ)} differ)"
            )

    def check_expert_load(self, imbalance: float | None) -> None:
        """Refuse a replay asking for another expert load (--expert-imbalance) than the profile was priced under."""
        if imbalance != self.expert_imbalance:

            def load(alpha: float | None) -> str:
                return "balanced experts" if alpha is None else f"--expert-imbalance {alpha:g}"

            raise ProfileError(
                f"--profile {self.path} was built for {load(self.expert_imbalance)}, not {load(imbalance)}; make one with "
                "testbed calibrate --source aiconfigurator and the same --expert-imbalance"
            )

    def check_precision(self, asked: Precision) -> None:
        """Refuse a replay asking for other weights or KV than the profile was priced for, naming both."""
        if not self.precision.same_bytes(asked):
            raise ProfileError(
                f"--profile {self.path} was built for {self.precision.describe()}, not "
                f"{asked.describe()} (--quantization, --kv-cache-dtype); make one with testbed calibrate "
                f"--source aiconfigurator and the same options"
            )

    # ------------------------------------------------------------------ hot path
    def forward_time(self, plan: ForwardPlan) -> float:
        t = self.kernel_time(plan)
        if self.eager_overhead and self.graphs is not None and t and not self._captured(plan):
            t = max(t, self.eager_overhead)  # the host dispatches while the GPU runs: the longer of the two
        return t

    def decode_forward_times(self, batch_size: int, sum_prefix_len: int, max_seq_len: int, num_steps: int) -> np.ndarray:
        """forward_time of num_steps consecutive decode steps of the same batch_size requests (step j:
        sum_seq_len = sum_prefix_len + (j + 1) x batch_size), elementwise the same float operations
        as forward_time on each step's plan: a decode stretch priced at once (sim_driver.py)."""
        b = batch_size
        first = sum_prefix_len + b
        # Each step's sum_seq_len as floats: integers below 2**53, exact, so the division by b gives
        # the float that int / int does.
        x = np.arange(first, first + b * num_steps, b, dtype=np.float64)
        x /= b
        t = (self.decode_curves.get(b) or self.decode_curve(b)).many(x)
        if self.eager_overhead and self.graphs is not None and not self.graphs.captures(ForwardMode.DECODE, -(-b // self.dp)):
            np.maximum(t, self.eager_overhead, out=t, where=t != 0)
        return t

    def _captured(self, plan: ForwardPlan) -> bool:
        """Whether the forward replays a CUDA graph: each DP rank replays its own, of its own tokens."""
        if self.dp == 1:
            return self.graphs.captured(plan)
        b = len(plan.req_pool_indices)
        rank = -(-b // self.dp)
        return self.graphs.captures(plan.mode, math.ceil(plan.num_tokens * rank / b))

    def kernel_time(self, plan: ForwardPlan) -> float:
        """The sum of the forward's kernels (no eager overhead)."""
        b = len(plan.req_pool_indices)
        if b == 0:
            return 0.0
        mode = plan.mode
        if mode is ForwardMode.DECODE:
            curve = self.decode_curves.get(b) or self.decode_curve(b)
            return curve(plan.sum_seq_len / b)
        if self.dp > 1:
            return self._rank_kernel_time(plan)
        n = plan.num_tokens
        t = self.dense(n) + self.lm_head(b)
        if mode is ForwardMode.EXTEND:
            return t + self.prefill(b, n, plan.attention_pairs)
        # MIXED: requests with one new token decode; a decode request's pairs are its sequence length.
        decodes = decode_len = 0
        for e, s in zip(plan.extend_lens, plan.seq_lens):
            if e == 1:
                decodes += 1
                decode_len += s
        if decodes:
            d = self.decode(decodes, decode_len / decodes)
            if self.mixed_decode is not None and decodes < b:  # a prefill chunk shares the forward
                d *= self.mixed_decode(decodes, decode_len / decodes)
            t += d
        if decodes < b:
            t += self.prefill(b - decodes, n - decodes, plan.attention_pairs - decode_len)
        return t

    def _rank_kernel_time(self, plan: ForwardPlan) -> float:
        """kernel_time of a prefill or mixed forward under attention data parallelism: the busiest of
        the dp ranks, the requests spread round-robin over them (as moe_roofline.py), holds
        ceil(k / dp) of each kind of the forward's k requests (decodes, prefills) and that share of
        their tokens and attention pairs; the experts take the tokens of every rank."""
        dp, n = self.dp, plan.num_tokens
        b = len(plan.req_pool_indices)
        decodes = decode_len = 0
        for e, s in zip(plan.extend_lens, plan.seq_lens):
            if e == 1:
                decodes += 1
                decode_len += s
        rank_decodes, prefills = -(-decodes // dp), b - decodes
        rank_prefills = -(-prefills // dp)
        prefill_share = rank_prefills / prefills if prefills else 0.0
        rank_tokens = rank_decodes + (n - decodes) * prefill_share
        t = self.dense(rank_tokens) + self.lm_head(rank_decodes + rank_prefills)
        if self.all_ranks is not None:
            t += self.all_ranks(n)
        if decodes:
            d = self.decode(rank_decodes, decode_len / decodes)
            if self.mixed_decode is not None and prefills:
                d *= self.mixed_decode(rank_decodes, decode_len / decodes)
            t += d
        if prefills:
            t += self.prefill(rank_prefills, (n - decodes) * prefill_share, (plan.attention_pairs - decode_len) * prefill_share)
        return t

    def cpu_time(self, stage: str, num_reqs: int, num_tokens: int) -> float:
        return self.cpu.time(stage, num_reqs, num_tokens)
