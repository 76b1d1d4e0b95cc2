"""The scheduler core under stress, end to end: real traces, real SimPy, run folders.

Every run goes through `testbed.replay.replay` (which calls Scheduler.check_invariants
at the end and raises if it fails) or through Scheduler + EventLoop + SimDriver built
by hand. Traces are generated here with `generate_trace` and kept small, so that
each test takes a fraction of a second.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from scheduler.core.invariants import InvariantError
from scheduler.core.req import Req
from scheduler.core.sampling import SamplingParams
from scheduler.loop.event_loop import CpuWork, EventLoop
from scheduler.model_config import load_model_config
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.policy import POLICIES
from scheduler.sglang.scheduler import Scheduler
from simulator.costs.roofline import RooflineCostModel
from simulator.driver.sim_driver import SimDriver
from simulator.hardware.specs import load_hardware
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import load_run
from testbed.traces.gen import GenConfig, generate_trace
from testbed.traces.schema import Trace, TraceRequest, materialize_input_ids

ALL_POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random", "priority")


# --- helpers ---------------------------------------------------------------------------


def _write(trace: Trace, path: Path) -> Path:
    trace.write(path)
    return path


def _run(trace_path: Path, out: Path, **opts):
    """Replay and load the folder it wrote: (ReplayResult, Run)."""
    result = replay(str(trace_path), ReplayOptions(**opts), out=out)
    return result, load_run(out)


def _assert_every_request_done(run, trace: Trace) -> None:
    """One row per trace request, each finished with exactly its output length."""
    df = run.requests
    n = len(trace)
    assert len(df) == n, f"requests.parquet has {len(df)} rows for {n} trace requests"
    assert df["index"].tolist() == list(range(n))
    bad = df[df["status"] != "finished"]
    assert bad.empty, f"not finished: {bad[['rid', 'status', 'reason']].to_dict('records')[:5]}"
    want_out = np.array([r.output_len for r in trace.requests])
    got_out = df["output_tokens"].to_numpy()
    wrong = np.nonzero(got_out != want_out)[0]
    assert wrong.size == 0, f"rows {wrong[:5].tolist()}: output_tokens {got_out[wrong[:5]].tolist()} != {want_out[wrong[:5]].tolist()}"
    assert df["input_tokens"].tolist() == [r.input_len for r in trace.requests]
    # Every output token has a time, the first is the first token, the last the finish.
    for row in df.itertuples():
        tt = np.asarray(row.token_times)
        assert len(tt) == row.output_tokens, f"{row.rid}: {len(tt)} token times for {row.output_tokens} tokens"
        assert tt[0] == row.first_token and tt[-1] == row.finish
        assert np.all(np.diff(tt) >= 0)
    assert run.status == "complete"
    assert run.summary["completed"] == n
    assert run.summary["rejected"] == 0 and run.summary["unfinished"] == 0


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> tuple[Path, Trace]:
    """Shared system prompts, multi-turn conversations, prompts up to ~1.3k tokens
    (several 256-token chunks), short outputs, arrivals fast enough to batch."""
    cfg = GenConfig(
        num_requests=30,
        rate=80.0,
        input_len="uniform:30,700",
        output_len="uniform:1,60",
        system_prompts=3,
        system_prompt_len=300,
        shared_fraction=0.6,
        multi_turn_fraction=0.4,
        turns=3,
        block_size=16,
        seed=7,
    )
    trace = generate_trace(cfg)
    path = tmp_path_factory.mktemp("mixed") / "mixed.json"
    return _write(trace, path), trace


def _burst_trace(seed: int = 0, n: int = 8) -> Trace:
    """Everything arrives at once; outputs longer than the 4096 tokens that admission
    reserves per request (CLIP_MAX_NEW_TOKENS) on short prompts: a pool that admits two
    at a time cannot hold both to the end, so decode must retract. (Outputs of fixed
    length within the clip are reserved in full, as SGLang does for ignore_eos: they
    never retract.)"""
    return generate_trace(GenConfig(num_requests=n, rate=1000.0, input_len="uniform:10,60", output_len="uniform:4500,6000", seed=seed))


def _max_need(trace: Trace) -> int:
    return max(r.input_len + r.output_len for r in trace.requests)


def _two_at_a_time(trace: Trace) -> int:
    """A pool that admits two requests of the burst (their clipped reservations and a page
    each) but cannot finish them both: more than the largest request, less than any two."""
    return 2 * (max(r.input_len for r in trace.requests) + 16 + 4096 + 16) + 64


# --- the matrix: every policy x overlap x page size x chunking x cache ----------------


def test_policy_list_is_what_the_matrix_covers():
    assert set(POLICIES) == set(ALL_POLICIES)


@pytest.mark.slow
@pytest.mark.parametrize("radix", [True, False], ids=["radix", "no-radix"])
@pytest.mark.parametrize("chunk", [256, 0], ids=["chunk256", "nochunk"])
@pytest.mark.parametrize("page_size", [1, 16], ids=["page1", "page16"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_matrix_completes_with_exact_outputs(mixed, tmp_path, policy, overlap, page_size, chunk, radix):
    path, trace = mixed
    result, run = _run(
        path,
        tmp_path / "run",
        policy=policy,
        overlap=overlap,
        page_size=page_size,
        chunked_prefill_size=chunk,
        disable_radix_cache=not radix,
        seed=3,
    )
    assert result.status == "complete"
    _assert_every_request_done(run, trace)
    df, steps = run.requests, run.steps
    assert (df["cached_tokens"] <= df["prefill_tokens"]).all()
    assert (df["prefill_tokens"] >= df["input_tokens"]).all()
    if not radix:
        assert (df["cached_tokens"] == 0).all(), "no prefix cache, yet cached tokens were reported"
    else:
        # The trace shares system prompts and conversation history: something must hit.
        assert df["cached_tokens"].sum() > 0
    extend = steps[steps["mode"] == "extend"]
    if chunk > 0:
        assert extend["num_tokens"].max() <= chunk
    # The sum of new prefill tokens over extend steps covers every prompt token not cached.
    assert extend["num_tokens"].sum() == (df["prefill_tokens"] - df["cached_tokens"]).sum()
    assert steps["num_tokens"].sum() >= extend["num_tokens"].sum() + (df["output_tokens"] - 1).sum()


# --- tight KV pool: retraction -----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("radix", [True, False], ids=["radix", "no-radix"])
@pytest.mark.parametrize("page_size", [1, 16], ids=["page1", "page16"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
def test_tiny_kv_pool_retracts_and_still_produces_every_token(tmp_path, overlap, page_size, radix):
    trace = _burst_trace()
    path = _write(trace, tmp_path / "burst.json")
    kv = _two_at_a_time(trace)
    assert _max_need(trace) < kv < 2 * min(r.input_len + r.output_len for r in trace.requests)
    result, run = _run(path, tmp_path / "run", overlap=overlap, page_size=page_size, kv_tokens=kv, disable_radix_cache=not radix)
    if not radix:
        # Without a radix cache, admission of fixed-length requests simulates every running
        # request to its end (SGLang's add_one_req_ignore_eos): nothing is ever retracted.
        assert result.summary["num_retractions"] == 0
        _assert_every_request_done(run, trace)
        return
    assert result.summary["num_retractions"] > 0, "a pool this small must force decode retractions"
    assert run.requests["num_retractions"].sum() == result.summary["num_retractions"]
    assert run.steps["num_retracted"].sum() == result.summary["num_retractions"]
    _assert_every_request_done(run, trace)
    assert run.steps["kv_used_tokens"].max() <= kv
    # A retracted request is prefilled again: its admitted prompt tokens count twice.
    retracted = run.requests[run.requests["num_retractions"] > 0]
    assert (retracted["prefill_tokens"] > retracted["input_tokens"]).all()


@pytest.mark.slow
@pytest.mark.parametrize("page_size", [1, 16], ids=["page1", "page16"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_tiny_kv_pool_every_policy_completes(tmp_path, policy, overlap, page_size):
    trace = _burst_trace(seed=1, n=6)
    path = _write(trace, tmp_path / "burst.json")
    kv = _two_at_a_time(trace)
    result, run = _run(path, tmp_path / "run", policy=policy, overlap=overlap, page_size=page_size, kv_tokens=kv)
    assert result.status == "complete"
    _assert_every_request_done(run, trace)


# --- KV accounting of one request ---------------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 16], ids=["page1", "page16"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
def test_lone_request_kv_grows_one_slot_per_decode_step(tmp_path, overlap, page_size):
    """A single request (40 prompt, 30 output tokens): each decode step attends to one more
    token than the last, the KV it holds grows to prompt + output - 1 tokens, and the
    radix cache keeps them (page aligned) when it finishes. Overlap runs no extra decode:
    the step after the in-flight one that reaches the length leaves the request out
    (SGLang's skip-finishing-decode)."""
    n_in, n_out = 40, 30
    path = _write(Trace([TraceRequest(0.0, n_in, n_out, rid="solo")]), tmp_path / "solo.json")
    _, run = _run(path, tmp_path / "run", overlap=overlap, page_size=page_size, kv_tokens=5000)
    steps = run.steps
    extend, decode = steps[steps["mode"] == "extend"], steps[steps["mode"] == "decode"]
    assert len(extend) == 1 and extend["num_tokens"].iloc[0] == n_in
    assert len(decode) == n_out - 1
    assert decode["prefix_tokens"].tolist() == list(range(n_in, n_in + len(decode)))
    with_kv = n_in + n_out - 1  # the last sampled token is never fed back
    held = (steps["kv_used_tokens"] + steps["kv_cached_tokens"]).max()
    ps = page_size
    assert with_kv <= held <= -(-(n_in + n_out) // ps) * ps
    assert steps["kv_used_tokens"].iloc[-1] == 0
    assert steps["kv_cached_tokens"].iloc[-1] == with_kv // ps * ps
    _assert_every_request_done(run, Trace([TraceRequest(0.0, n_in, n_out)]))


# --- KV slot consistency at every wait of the loop ------------------------------------------


class _CheckedLoop(EventLoop):
    """The event loop, with the KV bookkeeping checked between every two waits."""

    checks = 0

    def run(self):
        gen = super().run()
        value = None
        while True:
            try:
                wait = gen.send(value)
            except StopIteration:
                return
            if isinstance(wait, CpuWork):  # after scheduling and after processing a result
                _check_kv_slots(self.scheduler)
                self.checks += 1
            value = yield wait


def _check_kv_slots(sched: Scheduler) -> None:
    alloc, cache = sched.allocator, sched.tree_cache
    ps = alloc.page_size
    free = alloc.free_pages
    assert len(set(free)) == len(free), "a KV page is free twice"
    free = set(free)
    unlocked: set[int] = set()
    locked: set[int] = set()
    if not cache.disabled:
        stack = [cache.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            (locked if node.lock_ref > 0 else unlocked).update(v // ps for v in node.value)
    assert not (unlocked & free) and not (locked & free), "a cached page is also on the free list"
    reqs = list(sched.running_batch.reqs)
    if sched.last_batch is not None:
        reqs += sched.last_batch.reqs
    if sched.chunked_req is not None:
        reqs.append(sched.chunked_req)
    seen: dict[int, str] = {}
    for r in {id(r): r for r in reqs}.values():
        if r.req_pool_idx is None or r.finished():
            continue
        row = sched.req_to_token_pool.req_to_token[r.req_pool_idx]
        assert len(row) >= r.seq_len, f"{r.rid}: {len(row)} KV slots for {r.seq_len} tokens"
        pages = {v // ps for v in row[: r.seq_len]}
        assert not (pages & free), f"{r.rid} computes on {len(pages & free)} free pages"
        assert not (pages & unlocked), f"{r.rid} uses {len(pages & unlocked)} evictable cached pages"
        for p in pages - locked:
            assert p not in seen, f"page {p} is private to both {seen[p]} and {r.rid}"
            seen[p] = r.rid


def _run_checked(trace: Trace, *, kv_tokens: int, policy: str, page_size: int, overlap: bool) -> tuple[Scheduler, _CheckedLoop]:
    """Scheduler + EventLoop + SimDriver built by hand, KV slots checked at every wait."""
    model = load_model_config("llama-3.1-8b")
    hw = load_hardware("h100")
    config = SchedulerConfig(
        kv_tokens=kv_tokens,
        context_len=model.context_len,
        policy=policy,
        page_size=page_size,
        chunked_prefill_size=256,
        overlap=overlap,
        seed=5,
    )
    sched = Scheduler(config)
    driver = SimDriver(RooflineCostModel(model, hw))
    reqs = (
        Req(
            rid=tr.rid or str(i),
            input_len=tr.input_len,
            input_ids_fn=(lambda tr=tr, i=i: materialize_input_ids(tr, i)),
            sampling_params=SamplingParams(max_new_tokens=tr.output_len, ignore_eos=True),
            arrival_time=tr.arrival_s,
            index=i,
        )
        for i, tr in enumerate(trace.requests)
    )
    loop = _CheckedLoop(sched, reqs, driver.clock, overlap)
    driver.run(loop)
    sched.check_invariants()
    assert loop.checks > 0
    assert len(sched.done) == len(trace)
    assert sorted(len(r.output_ids) for r in sched.done) == sorted(r.output_len for r in trace.requests)
    return sched, loop


@pytest.mark.slow
@pytest.mark.parametrize("policy", ALL_POLICIES)
@pytest.mark.parametrize("page_size", [1, 16], ids=["page1", "page16"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
def test_kv_slots_never_shared_or_free_while_in_use(mixed, overlap, page_size, policy):
    """Shared prefixes, chunked prefill, a pool that must evict: no running request ever
    computes on a free or evictable page, and two requests never share a page outside
    the locked part of the cache."""
    _, trace = mixed
    _run_checked(trace, kv_tokens=3 * _max_need(trace), policy=policy, page_size=page_size, overlap=overlap)


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
@pytest.mark.parametrize("page_size", [1, 16], ids=["page1", "page16"])
def test_kv_slots_consistent_through_retractions(policy, page_size):
    """The same checks on a pool barely larger than one request (overlap mode)."""
    trace = _burst_trace(seed=4, n=6)
    _run_checked(trace, kv_tokens=_two_at_a_time(trace), policy=policy, page_size=page_size, overlap=True)


@pytest.mark.slow
@pytest.mark.parametrize("page_size", [1, 16], ids=["page1", "page16"])
@pytest.mark.parametrize(
    "damage, message",
    [
        ("free_twice", "free twice"),
        ("leak", "KV leak"),
        ("cached_and_free", "also free"),
        ("fresh_on_free_list", "fresh page is on the free list"),
    ],
)
def test_end_of_run_check_names_a_broken_pool(mixed, page_size, damage, message):
    """After a clean run the end-of-run check passes; each way a KV page can go wrong makes it
    fail, naming what broke."""
    _, trace = mixed
    sched, _ = _run_checked(trace, kv_tokens=3 * _max_need(trace), policy="fcfs", page_size=page_size, overlap=True)
    alloc = sched.allocator
    held_page = sched.tree_cache.all_values()[0] // page_size
    assert len(alloc.free_pages) > 0 and held_page not in set(alloc.free_pages)
    if damage == "free_twice":
        alloc.free_pages.append(alloc.free_pages[0])
    elif damage == "leak":
        alloc.free_pages.pop()
    elif damage == "cached_and_free":
        alloc.free_pages.append(held_page)
    else:
        alloc.free_pages.append(alloc.next_fresh_page)
    with pytest.raises(InvariantError, match=message):
        sched.check_invariants()


# --- requests that can never run ---------------------------------------------------------


def test_request_longer_than_context_is_rejected_not_dropped(tmp_path):
    trace = Trace(
        [
            TraceRequest(0.0, 100, 20, rid="ok-a"),
            TraceRequest(0.01, 5000, 10, rid="too-long"),  # tiny-llama's context is 4096
            TraceRequest(0.02, 120, 15, rid="ok-b"),
        ]
    )
    path = _write(trace, tmp_path / "long.json")
    result, run = _run(path, tmp_path / "run", model="tiny-llama", hardware="cpu")
    assert result.status == "complete"
    df = run.requests.set_index("rid")
    assert len(df) == 3
    assert df.loc["too-long", "status"] == "rejected"
    reason = df.loc["too-long", "reason"]
    assert reason and "context" in reason.lower(), f"reason {reason!r} does not say why"
    assert df.loc["too-long", "output_tokens"] == 0
    assert math.isnan(df.loc["too-long", "first_token"])
    assert df.loc[["ok-a", "ok-b"], "status"].tolist() == ["finished", "finished"]
    assert df.loc[["ok-a", "ok-b"], "output_tokens"].tolist() == [20, 15]
    s = result.summary
    assert (s["completed"], s["rejected"], s["unfinished"]) == (2, 1, 0)


@pytest.mark.parametrize("page_size", [1, 16], ids=["page1", "page16"])
def test_request_larger_than_kv_pool_gets_its_output_truncated(tmp_path, page_size):
    """As SGLang: a prompt that fits is served, its output cut to what the pool leaves
    (pool - prompt rounded up to a page - a page - 1), and the run records the cut."""
    trace = Trace(
        [
            TraceRequest(0.0, 300, 50, rid="fits"),
            TraceRequest(0.0, 900, 200, rid="too-big"),  # 1100 tokens, the pool holds 1000
            TraceRequest(0.1, 200, 30, rid="fits-too"),
        ]
    )
    path = _write(trace, tmp_path / "big.json")
    result, run = _run(path, tmp_path / "run", kv_tokens=1000, page_size=page_size)
    assert result.status == "complete"
    df = run.requests.set_index("rid")
    pool = 1000 - 1000 % page_size
    want = pool - (-(-900 // page_size) * page_size) - page_size - 1
    assert want < 200
    assert df.loc["too-big", "status"] == "finished"
    assert df.loc["too-big", "output_tokens"] == df.loc["too-big", "max_new_tokens"] == want
    reason = df.loc["too-big", "reason"]
    assert reason.startswith("output truncated from 200") and "KV pool" in reason, reason
    assert df.loc[["fits", "fits-too"], "output_tokens"].tolist() == [50, 30]
    assert (result.summary["completed"], result.summary["rejected"], result.summary["truncated"]) == (3, 0, 1)


def test_prompt_that_leaves_no_room_for_output_is_rejected(tmp_path):
    """A prompt within 6 tokens of the pool (SGLang's max_req_input_len) cannot run: rejected with a reason."""
    trace = Trace([TraceRequest(0.0, 995, 10, rid="too-big"), TraceRequest(0.1, 20, 5, rid="ok")])
    path = _write(trace, tmp_path / "big.json")
    result, run = _run(path, tmp_path / "run", kv_tokens=1000)
    df = run.requests.set_index("rid")
    assert df.loc["too-big", "status"] == "rejected"
    assert "kv pool" in df.loc["too-big", "reason"].lower()
    assert df.loc["ok", "output_tokens"] == 5


@pytest.mark.parametrize("case", ["page64", "page16", "no-radix"])
def test_a_request_no_admission_takes_is_rejected_at_arrival_and_the_others_run(tmp_path, case):
    """SGLang queues a request its PrefillAdder refuses even on an empty pool and waits for it
    forever: a prompt whose pages and the page the adder keeps free fill the pool, or (no radix
    cache, ignoring EOS) an output the pool cannot hold to its end. Here it is rejected at arrival
    with the reason, the run completes, and the request after it is served."""
    n, out, opts = {
        "page64": (150, 10, {"page_size": 64, "kv_tokens": 192}),
        "page16": (50, 10, {"page_size": 16, "kv_tokens": 64}),
        "no-radix": (5, 591, {"kv_tokens": 186, "disable_radix_cache": True}),
    }[case]
    trace = Trace([TraceRequest(0.0, n, out, rid="never"), TraceRequest(0.5, 8, 4, rid="small")])
    path = _write(trace, tmp_path / "t.json")
    result, run = _run(path, tmp_path / "run", **opts)
    assert result.status == "complete"
    df = run.requests.set_index("rid")
    assert df.loc["never", "status"] == "rejected" and df.loc["never", "reason"].startswith("never admitted")
    assert "wait for it forever" in df.loc["never", "reason"]
    assert df.loc["small", "status"] == "finished" and df.loc["small", "output_tokens"] == 4
    assert (result.summary["completed"], result.summary["rejected"]) == (1, 1)


def test_an_output_cut_to_nothing_still_yields_the_prefill_token(tmp_path):
    """As SGLang 0.5.23 (init_req_max_new_tokens; the conformance harness agrees): a prompt whose
    pages leave no room for output gets max_new_tokens 0 and finishes with the one token its
    prefill samples; `truncated` counts it."""
    path = _write(Trace([TraceRequest(0.0, 100, 10, rid="zero")]), tmp_path / "z.json")
    result, run = _run(path, tmp_path / "run", page_size=64, kv_tokens=192)
    row = run.requests.set_index("rid").loc["zero"]
    assert row["status"] == "finished" and row["output_tokens"] == 1 and row["max_new_tokens"] == 0
    assert row["reason"].startswith("output truncated from 10 to 0")
    assert (result.summary["completed"], result.summary["truncated"]) == (1, 1)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
@pytest.mark.parametrize("page_size", [1, 16], ids=["page1", "page16"])
def test_request_exactly_the_size_of_the_pool_does_not_hang(tmp_path, page_size, overlap):
    """input + output == the KV pool: the run must end, with the request either served
    in full or rejected with a reason (it must not be accepted and then never scheduled)."""
    n_in, n_out = 110, 50  # 160 = 10 pages of 16
    trace = Trace([TraceRequest(0.0, n_in, n_out, rid="exact"), TraceRequest(0.5, 20, 10, rid="small")])
    path = _write(trace, tmp_path / "exact.json")
    result, run = _run(path, tmp_path / "run", kv_tokens=n_in + n_out, page_size=page_size, overlap=overlap)
    assert result.status == "complete"
    df = run.requests.set_index("rid")
    row = df.loc["exact"]
    assert row["status"] == "finished" and 0 < row["output_tokens"] < n_out  # truncated to fit
    assert row["reason"].startswith("output truncated")
    assert df.loc["small", "status"] == "finished" and df.loc["small", "output_tokens"] == 10


# --- what-if answers the user relies on -----------------------------------------------------


@pytest.mark.parametrize("model,hardware", [("llama-3.1-8b", "h100"), ("tiny-llama", "cpu")], ids=["8b-h100", "tiny-cpu"])
def test_overlap_gives_at_least_the_throughput_of_normal_mode(tmp_path, model, hardware):
    trace = generate_trace(GenConfig(num_requests=60, rate=100.0, input_len="uniform:20,100", output_len="uniform:100,300", seed=0))
    path = _write(trace, tmp_path / "decode_heavy.json")
    on, run_on = _run(path, tmp_path / "on", overlap=True, model=model, hardware=hardware)
    off, run_off = _run(path, tmp_path / "off", overlap=False, model=model, hardware=hardware)
    _assert_every_request_done(run_on, trace)
    _assert_every_request_done(run_off, trace)
    assert on.summary["output_throughput"] >= off.summary["output_throughput"]
    assert on.summary["mean_tpot_ms"] <= off.summary["mean_tpot_ms"]
    # The gain is CPU time hidden behind the device: in overlap mode the CPU schedules
    # step N+1 before step N's forward ends.
    st = run_on.steps
    hidden = (st["schedule_start"].to_numpy()[1:] < st["device_end"].to_numpy()[:-1]).sum()
    assert hidden > 0
    st = run_off.steps
    assert (st["schedule_start"].to_numpy()[1:] >= st["device_end"].to_numpy()[:-1]).all()


@pytest.fixture(scope="module")
def shared_prefix_trace(tmp_path_factory) -> tuple[Path, Trace]:
    trace = generate_trace(
        GenConfig(
            num_requests=80,
            rate=200.0,
            input_len="uniform:50,200",
            output_len="uniform:20,80",
            system_prompts=8,
            system_prompt_len=512,
            shared_fraction=0.9,
            block_size=16,
            seed=0,
        )
    )
    return _write(trace, tmp_path_factory.mktemp("shared") / "shared.json"), trace


@pytest.mark.slow
@pytest.mark.parametrize("kv_tokens", [2500, 4000])
@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_cache_aware_policy_hits_at_least_as_often_as_fcfs(shared_prefix_trace, tmp_path, policy, kv_tokens):
    """Eight 512-token system prompts, a burst of requests, a pool that holds only a few
    of them: ordering by the cache must not hit less than arrival order."""
    path, trace = shared_prefix_trace
    fcfs, _ = _run(path, tmp_path / "fcfs", policy="fcfs", kv_tokens=kv_tokens)
    aware, run = _run(path, tmp_path / policy, policy=policy, kv_tokens=kv_tokens)
    _assert_every_request_done(run, trace)
    assert aware.summary["cache_hit_rate"] >= fcfs.summary["cache_hit_rate"], (
        f"{policy} hit rate {aware.summary['cache_hit_rate']:.3f} < fcfs {fcfs.summary['cache_hit_rate']:.3f}"
    )


@pytest.mark.parametrize("page_size", [1, 16], ids=["page1", "page16"])
def test_chunked_prefill_bounds_every_extend_step(mixed, tmp_path, page_size):
    """Chunking caps the new tokens of every extend step at chunked_prefill_size, also when
    max_prefill_tokens is smaller (the first request of a batch is always admitted, up to
    one chunk); a prompt longer than the chunk is split over several extend steps."""
    path, trace = mixed
    longest = max(r.input_len for r in trace.requests)
    assert longest > 2 * 256
    for max_prefill in (16384, 128):
        _, run = _run(path, tmp_path / f"mp{max_prefill}", page_size=page_size, chunked_prefill_size=256, max_prefill_tokens=max_prefill)
        _assert_every_request_done(run, trace)
        extend = run.steps[run.steps["mode"] == "extend"]
        assert extend["num_tokens"].max() <= max(256, max_prefill)
        assert extend["num_tokens"].max() <= 256
        assert (extend["num_tokens"] == 256).any(), "no prompt was long enough to fill a chunk"
        # A batch of several requests stays within max_prefill_tokens, unless one chunk alone.
        multi = extend[extend["batch_size"] > 1]
        assert (multi["num_tokens"] <= max(256, max_prefill)).all()


def test_without_chunking_only_a_lone_request_exceeds_max_prefill_tokens(mixed, tmp_path):
    path, trace = mixed
    _, run = _run(path, tmp_path / "run", chunked_prefill_size=0, max_prefill_tokens=512)
    _assert_every_request_done(run, trace)
    extend = run.steps[run.steps["mode"] == "extend"]
    over = extend[extend["num_tokens"] > 512]
    assert (over["batch_size"] == 1).all(), over[["num_tokens", "batch_size"]].to_dict("records")
    # Without chunking a long prompt is prefilled in one step.
    assert extend["num_tokens"].max() > 512


@pytest.mark.slow
def test_higher_load_gives_higher_or_equal_ttft(tmp_path):
    trace = generate_trace(GenConfig(num_requests=80, rate=40.0, input_len="uniform:500,1500", output_len="uniform:20,100", seed=2))
    path = _write(trace, tmp_path / "load.json")
    fast, run_fast = _run(path, tmp_path / "x0.5", time_scale=0.5, model="tiny-llama", hardware="cpu")
    slow, run_slow = _run(path, tmp_path / "x2", time_scale=2.0, model="tiny-llama", hardware="cpu")
    _assert_every_request_done(run_fast, trace)
    _assert_every_request_done(run_slow, trace)
    # The arrivals really were compressed and stretched.
    a_fast, a_slow = run_fast.requests["arrival"].to_numpy(), run_slow.requests["arrival"].to_numpy()
    assert np.allclose(a_slow, 4 * a_fast)
    assert fast.summary["mean_ttft_ms"] >= slow.summary["mean_ttft_ms"]
    assert fast.summary["p90_ttft_ms"] >= slow.summary["p90_ttft_ms"]
