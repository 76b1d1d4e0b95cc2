"""Fast-forward (decode stretches taken at once) gives what stepping one by one gives.

The property: on random traces (bursts, idle gaps, shared prefixes, pools so small that
requests are retracted or preempted) and random options (both schedulers, overlap on and
off, every policy, page sizes 1 and 16, chunked prefill, mixed chunk, priority scheduling),
a replay with fast-forward and one with --no-fast-forward write the same run: the same
summary, and every column of requests.parquet and steps.parquet equal (timestamps within
1e-9 s). A second test shows that the fast path is taken at all (far fewer waits than
steps), so the first cannot pass with it switched off. FF_EXAMPLES=500 runs a longer fuzz
(80 examples under --hypothesis-profile=deep, 20 under the default ci profile: hypothesis_profiles.py).
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from loop_helpers import CountingLoop, assert_same_run, run_spaced_requests

from scheduler.core.forward_plan import ForwardMode, ForwardPlan
from scheduler.core.ids import ids
from scheduler.core.req import Req
from scheduler.core.sampling import SamplingParams
from scheduler.loop.event_loop import DeadlockError
from scheduler.memory.memory_pool import TokenToKVPoolAllocator
from scheduler.model_config import load_model_config
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.decode_stretches import SglangDecodeStretches
from scheduler.sglang.scheduler import Scheduler
from scheduler.vllm.config import VllmSchedulerConfig
from scheduler.vllm.decode_stretches import VllmDecodeStretches
from scheduler.vllm.scheduler import VllmScheduler
from simulator.costs.roofline import RooflineCostModel
from simulator.driver.sim_driver import SimDriver
from simulator.hardware.specs import load_hardware
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import load_run
from testbed.traces.schema import Trace, TraceRequest

SGLANG_POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random", "priority")
# Each example is two whole replays: FF_EXAMPLES (when set) or examples(80).
FF_EXAMPLES = int(os.environ.get("FF_EXAMPLES", 0)) or examples(80)
TIME_COLUMNS = (
    "schedule_start",
    "schedule_end",
    "launch_start",
    "launch_end",
    "device_start",
    "device_end",
    "process_start",
    "process_end",
)


@st.composite
def _case(draw):
    n = draw(st.integers(1, 16))
    prefixes = [list(range(10_000 * (k + 1), 10_000 * (k + 1) + draw(st.integers(1, 120)))) for k in range(2)]
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.001, 0.02, 0.3, 2.0]))  # bursts and idle gaps
        head = prefixes[draw(st.integers(0, 1))] if draw(st.booleans()) else []
        tail = list(range(1000 * i + 50_000, 1000 * i + 50_000 + draw(st.integers(1, 150))))
        out = draw(st.sampled_from([1, 2, 5, 40, 120, 300]))
        reqs.append(TraceRequest(t, len(head + tail), out, input_ids=head + tail, priority=draw(st.integers(0, 2))))
    trace = Trace(reqs)
    need = max(r.input_len + r.output_len for r in reqs)
    opts = {
        "scheduler": draw(st.sampled_from(["sglang", "vllm"])),
        "overlap": draw(st.booleans()),
        "page_size": draw(st.sampled_from([1, 16])),
        # From a pool that retracts (or truncates, or rejects) to one that never does.
        "kv_tokens": draw(st.sampled_from([need // 2 + 16, need + 40, 2 * need + 64, 100_000])),
        "disable_radix_cache": draw(st.booleans()),
    }
    if opts["scheduler"] == "vllm":
        opts["policy"] = draw(st.sampled_from(["fcfs", "priority"]))
        opts["max_num_seqs"] = draw(st.sampled_from([2, 8, 256]))
        opts["max_num_batched_tokens"] = draw(st.sampled_from([32, 128, 8192]))
    else:
        opts["policy"] = draw(st.sampled_from(SGLANG_POLICIES))
        opts["chunked_prefill_size"] = draw(st.sampled_from([0, 64, 256]))
        opts["enable_mixed_chunk"] = draw(st.booleans())
        opts["enable_priority_scheduling"] = draw(st.booleans())
        opts["max_running_requests"] = draw(st.sampled_from([None, 3]))
    return trace, opts


def _replay(trace_path: Path, out: Path, **opts):
    result = replay(str(trace_path), ReplayOptions(**opts), out=out)
    return result, load_run(out)


def _assert_frames_equal(a: pd.DataFrame, b: pd.DataFrame, what: str) -> None:
    assert list(a.columns) == list(b.columns) and len(a) == len(b), what
    for c in a.columns:
        x, y = a[c], b[c]
        if c in TIME_COLUMNS or c == "token_times" or x.dtype.kind == "f":
            xs = np.concatenate([np.asarray(v, dtype=float) for v in x]) if x.dtype == object else x.to_numpy(float)
            ys = np.concatenate([np.asarray(v, dtype=float) for v in y]) if y.dtype == object else y.to_numpy(float)
            assert xs.shape == ys.shape, f"{what}.{c}"
            assert np.array_equal(np.isnan(xs), np.isnan(ys)), f"{what}.{c}"
            ok = ~np.isnan(xs)
            assert np.all(np.abs(xs[ok] - ys[ok]) <= 1e-9), f"{what}.{c}: max difference {np.max(np.abs(xs[ok] - ys[ok]))}"
        else:
            assert x.tolist() == y.tolist(), f"{what}.{c}"


# Found by the property: under vLLM, a prompt's last token computed alone (a one-token chunk)
# is an extend step, not the first step of a decode stretch.
_ONE_TOKEN_LAST_CHUNK = (
    Trace(
        requests=[
            TraceRequest(arrival_s=0.0, input_len=1, output_len=1, input_ids=[50000]),
            TraceRequest(arrival_s=0.001, input_len=29, output_len=2, input_ids=list(range(20000, 20029))),
            TraceRequest(arrival_s=0.001, input_len=35, output_len=5, input_ids=list(range(10000, 10035))),
        ]
    ),
    {
        "scheduler": "vllm",
        "overlap": False,
        "page_size": 16,
        "kv_tokens": 80,
        "disable_radix_cache": False,
        "policy": "fcfs",
        "max_num_seqs": 2,
        "max_num_batched_tokens": 32,
    },
)


@pytest.mark.slow
@settings(max_examples=FF_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=_case())
@example(case=_ONE_TOKEN_LAST_CHUNK)
def test_fast_forward_gives_the_run_that_stepping_gives(case, tmp_path_factory):
    trace, opts = case
    tmp = tmp_path_factory.mktemp("ff")
    path = tmp / "trace.json"
    trace.write(path)
    try:
        step_res, step_run = _replay(path, tmp / "step", fast_forward=False, **opts)
    except DeadlockError as e:  # a pool SGLang's rules never admit a request into: the same error
        with pytest.raises(DeadlockError, match=re.escape(str(e))):
            _replay(path, tmp / "ff", fast_forward=True, **opts)
        return
    ff_res, ff_run = _replay(path, tmp / "ff", fast_forward=True, **opts)
    assert ff_res.summary == step_res.summary
    assert ff_run.summary["num_steps"] == len(step_run.steps)
    _assert_frames_equal(step_run.steps, ff_run.steps, "steps")
    _assert_frames_equal(step_run.requests, ff_run.requests, "requests")
    assert ff_run.meta["options"]["fast_forward"] is True and step_run.meta["options"]["fast_forward"] is False


@st.composite
def _queued_case(draw):
    """A burst of requests, some with long prompts, on a pool for a few: the batch is full, the
    rest wait, and the step after a request leaves looks at the queue, whose head often does not
    fit (the checks a stretch goes through, scheduler/sglang/refused_admission.py)."""
    n = draw(st.integers(6, 24))
    prefixes = [list(range(10_000 * (k + 1), 10_000 * (k + 1) + draw(st.sampled_from([16, 100, 300])))) for k in range(2)]
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.001, 0.05]))
        size = draw(st.sampled_from([20, 150, 400, 900]))
        head = prefixes[draw(st.integers(0, 1))] if draw(st.booleans()) else []  # (a system prompt)
        prompt = head + list(range(1000 * i + 50_000, 1000 * i + 50_000 + draw(st.integers(size // 2, size))))
        reqs.append(TraceRequest(t, len(prompt), draw(st.integers(5, 250)), input_ids=prompt))
    need = max(r.input_len + r.output_len for r in reqs)
    opts = {
        "scheduler": "sglang",
        "overlap": draw(st.booleans()),
        "page_size": draw(st.sampled_from([1, 16])),
        "kv_tokens": draw(st.sampled_from([need + 200, 2 * need, 3 * need + 100])),
        "disable_radix_cache": draw(st.booleans()),
        "policy": draw(st.sampled_from(["fcfs", "lpm"])),
        "chunked_prefill_size": draw(st.sampled_from([0, 256])),
        "max_running_requests": draw(st.sampled_from([None, 4])),
    }
    return Trace(reqs), opts


def _queued_trace(shapes: list[tuple[float, int, list[tuple[int, int]]]]) -> Trace:
    """(arrival, output length, the prompt as ranges of token ids) each."""
    return Trace(
        [TraceRequest(t, sum(b - a for a, b in runs), out, input_ids=[x for a, b in runs for x in range(a, b)]) for t, out, runs in shapes]
    )


# Found by the property: with overlap, the stretch's first step processes the prefill it merges,
# whose request caches (and locks) the system prompt that the head of the queue shares, so the
# head's locked prefix grows in the stretch (a bound from the cache alone admitted at a check).
_PREFILL_LOCKS_THE_HEADS_PREFIX = (
    _queued_trace(
        [(0.0, 5, [(50_000 + 1000 * i, 50_010 + 1000 * i)]) for i in range(7)]
        + [(0.0, 96, [(57_000, 57_010)]), (0.001, 5, [(10_000, 10_100), (58_000, 58_075)])]
        + [(0.001, 6 if i == 65 else 5, [(1000 * i, 1000 * i + 10)]) for i in range(59, 66)]
        + [(0.001, 5, [(66_000, 66_200)]), (0.001, 5, [(10_000, 10_100), (67_000, 67_450)])]
    ),
    {
        "scheduler": "sglang",
        "overlap": True,
        "page_size": 1,
        "kv_tokens": 1110,
        "disable_radix_cache": False,
        "policy": "fcfs",
        "chunked_prefill_size": 0,
        "max_running_requests": None,
    },
)


@pytest.mark.slow
@settings(max_examples=FF_EXAMPLES // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=_queued_case())
@example(case=_PREFILL_LOCKS_THE_HEADS_PREFIX)
def test_stretches_through_admission_checks_give_the_run_that_stepping_gives(case, tmp_path_factory):
    test_fast_forward_gives_the_run_that_stepping_gives.hypothesis.inner_test(case, tmp_path_factory)


# --- the fast path is taken ------------------------------------------------------------------


class _RecordingSglangStretches(SglangDecodeStretches):
    """Keeps, on its scheduler, every decode stretch it advances (to see what they went through)."""

    def advance_decode_stretch(self, stretch, num_steps, *args):
        sched = self.sched
        sched.advanced.append((stretch.merges_prefill, stretch.taken(num_steps)))  # (and the segments its steps went through)
        sched.advanced_waiting.append((len(sched.waiting_queue), num_steps))
        return super().advance_decode_stretch(stretch, num_steps, *args)

    def _refused_admission_check(self):
        self.sched.admission_checks += 1
        super()._refused_admission_check()

    def _bulk_decode(self, *args):
        cached = self.sched.tree_cache.evictable_size()
        super()._bulk_decode(*args)
        self.sched.bulk_evictions += self.sched.tree_cache.evictable_size() < cached


class _StretchRecordingScheduler(Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.decode_stretches = _RecordingSglangStretches(self)
        self.advanced: list = []
        self.advanced_waiting: list[tuple[int, int]] = []  # (requests waiting, steps taken) of each
        self.bulk_evictions = 0  # bulk steps' schedules that evicted
        self.admission_checks = 0


class _StretchRecordingVllm(VllmScheduler):
    """Counts what its decode stretches did besides taking slots and giving tokens, outside
    the one step of each that the ordinary code schedules."""

    def __init__(self, config: VllmSchedulerConfig) -> None:
        super().__init__(config)
        self.bulk_evictions = 0  # blocks evicted by bulk steps' schedules
        self.bulk_cached_blocks = 0  # blocks that bulk steps put in the prefix cache
        self.bulk_finishes = 0  # requests finished by bulk processings
        self._in_bulk = False
        cache_known_blocks_of, get_new_blocks = self.kv.cache_known_blocks_of, self.kv.pool.get_new_blocks

        def counting_cache(reqs: list[Req]) -> None:
            have = sum(self.kv.reqs[r].num_cached for r in reqs)
            cache_known_blocks_of(reqs)
            self.bulk_cached_blocks += self._in_bulk * (sum(self.kv.reqs[r].num_cached for r in reqs) - have)

        def counting_take(n: int, evicted_at=None):
            before = self.kv.pool.num_evicted
            blocks = get_new_blocks(n, evicted_at)
            self.bulk_evictions += self._in_bulk * (self.kv.pool.num_evicted - before)
            return blocks

        cache_filled = self.kv.cache_filled

        def counting_filled(reqs: list[Req], filled) -> None:
            cache_filled(reqs, filled)
            self.bulk_cached_blocks += self._in_bulk * len(filled)

        self.kv.cache_known_blocks_of, self.kv.pool.get_new_blocks = counting_cache, counting_take
        self.kv.cache_filled = counting_filled
        self.decode_stretches = _BulkMarkingVllmStretches(self)

    def get_next_batch_to_run(self):
        in_bulk, self._in_bulk = self._in_bulk, False
        try:
            return super().get_next_batch_to_run()
        finally:
            self._in_bulk = in_bulk

    def finish(self, req: Req, now: float) -> None:
        self.bulk_finishes += self._in_bulk
        super().finish(req, now)


class _BulkMarkingVllmStretches(VllmDecodeStretches):
    """Marks its scheduler as in bulk while a stretch is taken."""

    def advance_decode_stretch(self, *args):
        self.sched._in_bulk = True
        try:
            return super().advance_decode_stretch(*args)
        finally:
            self.sched._in_bulk = False


def _light_run(
    fast_forward: bool, overlap: bool, kv_tokens: int = 200_000, page_size: int = 1, scheduler: str = "sglang"
) -> tuple[CountingLoop, Scheduler | VllmScheduler]:
    """20 requests 0.7 s apart, 100-400 tokens each: long decodes between arrivals."""
    if scheduler == "vllm":
        sched = _StretchRecordingVllm(VllmSchedulerConfig(kv_tokens=kv_tokens, context_len=8192, overlap=overlap, page_size=page_size))
    else:
        sched = _StretchRecordingScheduler(SchedulerConfig(kv_tokens=kv_tokens, context_len=8192, overlap=overlap, page_size=page_size))
    return run_spaced_requests(sched, 20, 0.7, 3, fast_forward, overlap), sched


@pytest.mark.slow
def test_fast_forward_takes_decode_stretches_in_few_waits():
    for overlap in (False, True):
        step_loop, step_sched = _light_run(False, overlap)
        ff_loop, ff_sched = _light_run(True, overlap)
        assert len(ff_loop.steps) == len(step_loop.steps) > 2000
        assert ff_loop.num_stretches > 0 and ff_loop.stretch_waits >= ff_loop.num_stretches
        # Stepping yields ~4 waits a step; the stretches cover most steps in one wait each.
        assert ff_loop.waits * 5 < step_loop.waits, (ff_loop.waits, step_loop.waits)
        assert_same_run(ff_loop, ff_sched, step_loop, step_sched)


@pytest.mark.slow
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("overlap", [False, True])
def test_stretches_go_through_finishes_and_evictions_as_steps_do(overlap, page_size):
    """A KV pool the radix cache fills: once it is full every few steps evict a cached prompt.
    Stretches go on through those evictions and through requests' last tokens (the request
    finishes and leaves the batch), and start where a prefill merges into the batch, with the
    very run stepping gives."""
    step_loop, step_sched = _light_run(False, overlap, kv_tokens=2500, page_size=page_size)
    ff_loop, ff_sched = _light_run(True, overlap, kv_tokens=2500, page_size=page_size)
    taken = ff_sched.advanced
    assert sum(len(segments) - 1 for _, segments in taken) >= 5, "stretches did not go on past requests' last tokens"
    assert sum(merges for merges, _ in taken) >= 5, "no stretch started where a prefill merges into the batch"
    assert ff_sched.bulk_evictions > 0, "no stretch evicted"
    assert ff_loop.waits * 3 < step_loop.waits, (ff_loop.waits, step_loop.waits)
    assert_same_run(ff_loop, ff_sched, step_loop, step_sched)


def _queued_run(
    fast_forward: bool, overlap: bool, page_size: int = 1, long_every: int = 0
) -> tuple[CountingLoop, _StretchRecordingScheduler]:
    """60 requests at once on a KV pool for about a dozen: the batch is full and the rest wait,
    each admitted when KV frees up. long_every: every so many a prompt of 1,500-2,500 tokens,
    which waits at the head of the queue for several requests to leave."""
    rnd = random.Random(5)
    model = load_model_config("llama-3.1-8b")
    sched = _StretchRecordingScheduler(SchedulerConfig(kv_tokens=6000, context_len=8192, overlap=overlap, page_size=page_size))
    reqs = []
    for i in range(60):
        n = rnd.randint(1500, 2500) if long_every and i % long_every == 0 else rnd.randint(100, 400)
        prompt = list(range(i * 1000, i * 1000 + n))
        reqs.append(Req(str(i), n, (lambda p=prompt: p), SamplingParams(max_new_tokens=rnd.randint(20, 200)), 0.001 * i, index=i))
    driver = SimDriver(RooflineCostModel(model, load_hardware("h100")), fast_forward=fast_forward)
    loop = CountingLoop(sched, iter(reqs), driver.clock, overlap)
    driver.run(loop)
    sched.check_invariants()
    return loop, sched


@pytest.mark.parametrize("overlap", [False, True])
def test_stretches_beside_a_waiting_queue_go_through_a_finish_as_steps_do(overlap):
    """With requests waiting and the batch full, the prefill branch does not look at the queue
    until a request has left: a stretch goes on through the step that computes the first last
    token (with overlap, through the step whose schedule drops that request and whose processing
    finishes it), with the very run stepping gives."""
    step_loop, step_sched = _queued_run(False, overlap)
    ff_loop, ff_sched = _queued_run(True, overlap)
    through = 0
    for (_, segments), (waiting, num_steps) in zip(ff_sched.advanced, ff_sched.advanced_waiting):
        if waiting:
            last = segments[-1]
            # overlap: the last step is a segment's first, which drops the leaving request;
            # without: the last step computes a request's last token.
            through += (
                bool(last.leaving and num_steps == last.first_step + 1) if overlap else bool(last.finishing and num_steps == last.stop)
            )
    assert through >= 10, "stretches beside a waiting queue stopped short of a finish"
    assert_same_run(ff_loop, ff_sched, step_loop, step_sched)


@pytest.mark.slow
@pytest.mark.parametrize("long_every", [3, 4])  # (4: with overlap, two requests leave at consecutive steps)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("overlap", [False, True])
def test_stretches_beside_a_waiting_queue_go_through_refused_admissions_as_steps_do(overlap, page_size, long_every):
    """Long prompts at the head of the queue wait for several requests to leave: the step after
    each leaves looks at the queue and refuses. Stretches go on through those checks (the
    ordinary check, run at its step inside the stretch) and start where a prefill merges into a
    full batch beside the queue, with the very run stepping gives (the cache's LRU clock too:
    each check matches the head's prefix)."""
    step_loop, step_sched = _queued_run(False, overlap, page_size, long_every)
    ff_loop, ff_sched = _queued_run(True, overlap, page_size, long_every)
    assert getattr(ff_sched, "admission_checks", 0) >= 10, "no stretch went through a refused admission check"
    merges = sum(1 for (merge, _), (waiting, _) in zip(ff_sched.advanced, ff_sched.advanced_waiting) if merge and waiting)
    assert merges >= 10, "no stretch beside a waiting queue started at a prefill's merge"
    assert ff_loop.waits * 15 < step_loop.waits, (ff_loop.waits, step_loop.waits)
    assert_same_run(ff_loop, ff_sched, step_loop, step_sched)


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True])
def test_vllm_stretches_go_through_filled_blocks_evictions_and_finishes_as_steps_do(overlap):
    """vLLM with prefix caching (blocks of 16) on a KV pool its cache fills: a block that a
    decode fills enters the cache at that step, once the pool is full steps evict cached
    blocks, and requests finish and leave the batch. Stretches go on through all three, with
    the very run stepping gives."""
    step_loop, step_sched = _light_run(False, overlap, kv_tokens=2500, page_size=16, scheduler="vllm")
    ff_loop, ff_sched = _light_run(True, overlap, kv_tokens=2500, page_size=16, scheduler="vllm")
    assert ff_sched.bulk_cached_blocks > 50, "stretches did not cache the blocks they filled"
    assert ff_sched.bulk_evictions > 0, "no stretch evicted"
    assert ff_sched.bulk_finishes >= 5, "stretches did not go on past requests' last tokens"
    assert ff_loop.waits * 3 < step_loop.waits, (ff_loop.waits, step_loop.waits)
    assert_same_run(ff_loop, ff_sched, step_loop, step_sched)


# --- the allocator's bulk takes equal its step-by-step takes ---------------------------------------


def _allocator(rnd: random.Random) -> TokenToKVPoolAllocator:
    a = TokenToKVPoolAllocator(1 << 20, 1)
    a.next_fresh_page = rnd.randrange(0, 50)
    a.free_pages = ids(rnd.sample(range(1000, 2000), rnd.randrange(0, 40)))
    return a


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 10**6), per_step=st.integers(0, 7), steps=st.integers(1, 40)
)  # (both sides of take_pages_in_steps's numpy threshold)
def test_bulk_page_takes_equal_one_take_at_a_time(seed, per_step, steps):
    one, bulk, singly = (_allocator(random.Random(seed)) for _ in range(3))
    taken = ids()
    for _ in range(steps):
        taken.extend(one.take_pages(per_step))
    assert bulk.take_pages_in_steps(per_step, steps) == taken
    assert (bulk.free_pages, bulk.next_fresh_page) == (one.free_pages, one.next_fresh_page)
    dealt = _allocator(random.Random(seed))
    assert dealt.take_pages_in_steps_dealt(per_step, steps) == [taken[i::per_step] for i in range(per_step)]
    assert (dealt.free_pages, dealt.next_fresh_page) == (one.free_pages, one.next_fresh_page)
    one_by_one = _allocator(random.Random(seed))
    expected = ids()
    for _ in range(per_step * steps):
        expected.extend(one_by_one.take_pages(1))
    assert singly.take_pages_singly(per_step * steps) == expected
    assert (singly.free_pages, singly.next_fresh_page) == (one_by_one.free_pages, one_by_one.next_fresh_page)


# --- every cost model prices a stretch's steps as it prices them one by one -------------------------

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
@pytest.mark.parametrize(
    "opts",
    [
        {"model": "tiny-llama", "profile": "profiles/cpu-tiny-llama.json", "overlap": False},  # calibrated profile
        {"profile": "profiles/h100_sxm-sglang-llama-3.1-8b-tp1.json"},  # kernel profile, SGLang's CUDA graphs
        {"profile": "profiles/rtx_pro_6000_server-vllm-llama-3.1-8b-tp1.json", "scheduler": "vllm", "overlap": False},  # vLLM's graphs
        {"tp": 2, "hardware": "h100", "page_size": 16},  # roofline with all-reduces
    ],
    ids=["calibrated", "kernels-sglang", "kernels-vllm", "roofline-tp2"],
)
def test_every_cost_model_gives_the_same_run_fast_forwarded(tmp_path, opts):
    rnd = random.Random(5)
    reqs, t = [], 0.0
    for i in range(40):
        t += rnd.expovariate(4.0)
        n = rnd.randint(20, 400)
        reqs.append(TraceRequest(t, n, rnd.randint(20, 300), input_ids=list(range(1000 * i, 1000 * i + n))))
    path = tmp_path / "trace.json"
    Trace(reqs).write(path)
    opts = {k: str(ROOT / v) if k == "profile" else v for k, v in opts.items()}
    step_res, step_run = _replay(path, tmp_path / "step", fast_forward=False, **opts)
    ff_res, ff_run = _replay(path, tmp_path / "ff", fast_forward=True, **opts)
    assert ff_res.summary == step_res.summary
    _assert_frames_equal(step_run.steps, ff_run.steps, "steps")
    _assert_frames_equal(step_run.requests, ff_run.requests, "requests")


@pytest.mark.parametrize("attention_flops", [1.0, 1e4])
@pytest.mark.parametrize("per_component", [True, False])
@pytest.mark.parametrize("tp", [1, 2])
def test_roofline_prices_a_stretch_as_each_step_alone(per_component, tp, attention_flops):
    """decode_forward_times (all of a stretch's steps in one call) equals forward_time on the
    plan of each step, as prepare_for_decode summarizes it: memory bound throughout (long
    sequences), compute bound throughout (large batches of short ones), and crossing over."""
    cost = RooflineCostModel(load_model_config("llama-3.1-8b"), load_hardware("h100"), per_component=per_component, tp=tp)
    # Attention is memory bound in decode on every real GPU and model; made 1e4 times costlier
    # in compute, it is compute bound, and its branch is checked too.
    cost._pair_flop_s *= attention_flops
    rnd = random.Random(tp)
    for bs, longest in ((1, 30_000), (7, 30_000), (256, 30_000), (256, 50), (1024, 10), (2048, 10)):
        seq_lens = [rnd.randint(1, longest) for _ in range(bs)]
        bulk = cost.decode_forward_times(bs, sum(seq_lens), max(seq_lens) + 1, 300)
        for j in range(300):
            before = [s + j for s in seq_lens]
            plan = ForwardPlan(
                ForwardMode.DECODE,
                list(range(bs)),
                before,
                [1] * bs,
                [s + 1 for s in before],
                [],
                [True] * bs,
                ids(),
                num_tokens=bs,
                sum_seq_len=sum(before) + bs,
                sum_prefix_len=sum(before),
                attention_pairs=float(sum(before) + bs),
                max_seq_len=max(before) + 1,
            )
            assert bulk[j] == cost.forward_time(plan)


@settings(max_examples=300, deadline=None)
@given(
    free=st.integers(-5, 400),
    per_step=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    reserve=st.integers(0, 40),
    limit=st.integers(0, 120),
)
def test_steps_with_pages_counts_as_taking_them_one_step_at_a_time(free, per_step, reserve, limit):
    """The stretch planner's count of steps that find their pages (closed-form where pages are
    slots) against taking the pages a step at a time."""
    from scheduler.fast_forward.decode_stretch import steps_with_pages

    left, count = free, 0
    while count < limit and left >= reserve:
        left -= per_step[count % len(per_step)]
        count += 1
    assert steps_with_pages(free, per_step, reserve, limit) == count
