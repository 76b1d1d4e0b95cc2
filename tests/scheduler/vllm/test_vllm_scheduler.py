"""The vLLM-style scheduler end to end: real traces, real SimPy, run folders.

What a user of `--scheduler vllm` relies on: one step never computes more than
--max-num-batched-tokens; a running decode is never left out of a step for a prefill;
a preempted request is recomputed and still makes exactly its output length; prefix
hits come in whole blocks; the KV bookkeeping holds at every wait of the loop and at
the end of every run. The last part is fuzzed with hypothesis over traces and configs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from scheduler.core.req import Req
from scheduler.core.sampling import SamplingParams
from scheduler.loop.event_loop import CpuWork, EventLoop
from scheduler.model_config import load_model_config
from scheduler.vllm.config import VllmSchedulerConfig
from scheduler.vllm.kv_blocks import RequestBlocks
from scheduler.vllm.scheduler import VllmScheduler
from simulator.costs.roofline import RooflineCostModel
from simulator.driver.sim_driver import SimDriver
from simulator.hardware.specs import load_hardware
from testbed.cli import main
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import load_run
from testbed.traces.gen import GenConfig, generate_trace
from testbed.traces.schema import Trace, TraceRequest, materialize_input_ids

# --- helpers ---------------------------------------------------------------------------


def _shared_trace(n: int = 30, seed: int = 7, rate: float = 80.0) -> Trace:
    """Shared system prompts, multi-turn conversations, prompts up to ~1.3k tokens."""
    return generate_trace(
        GenConfig(
            num_requests=n,
            rate=rate,
            input_len="uniform:30,700",
            output_len="uniform:1,60",
            system_prompts=3,
            system_prompt_len=300,
            shared_fraction=0.6,
            multi_turn_fraction=0.4,
            turns=3,
            block_size=16,
            seed=seed,
        )
    )


def _burst_trace(n: int = 20, seed: int = 4) -> Trace:
    """Everything at once, long outputs on short prompts: the KV pool runs out mid-decode."""
    return generate_trace(GenConfig(num_requests=n, rate=1000.0, input_len="uniform:10,60", output_len="uniform:100,450", seed=seed))


def _max_need(trace: Trace) -> int:
    return max(r.input_len + r.output_len for r in trace.requests)


def _replay(trace: Trace, tmp_path: Path, **opts):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "trace.json"
    trace.write(path)
    out = tmp_path / "run"
    result = replay(str(path), ReplayOptions(scheduler="vllm", **opts), out=out)
    return result, load_run(out)


def _assert_exact_outputs(run, trace: Trace) -> None:
    df = run.requests
    assert run.status == "complete" and len(df) == len(trace)
    assert (df["status"] == "finished").all(), df[df["status"] != "finished"][["rid", "reason"]].head().to_dict("records")
    assert df["output_tokens"].tolist() == [r.output_len for r in trace.requests]
    for row in df.itertuples():
        tt = np.asarray(row.token_times)
        assert len(tt) == row.output_tokens and tt[0] == row.first_token and tt[-1] == row.finish


class _CheckedLoop(EventLoop):
    """The event loop with the KV bookkeeping checked after every schedule and every result."""

    checks = 0

    def run(self):
        gen = super().run()
        value = None
        while True:
            try:
                wait = gen.send(value)
            except StopIteration:
                return
            if isinstance(wait, CpuWork):
                _check_kv(self.scheduler)
                self.checks += 1
            value = yield wait


def _check_kv(sched: VllmScheduler) -> None:
    """Each block is free or held, and held as many times as running requests hold it; a running
    request's slots lie in its own blocks; its cached blocks hold its own tokens' hashes."""
    kv, ps = sched.kv, sched.page_size
    kv.flush_cache()  # (the blocks logged to cache go in the map)
    pool = kv.pool
    holders: dict[int, int] = {}
    for r in sched.running:
        st = kv.reqs[r]
        for b in st.blocks:
            holders[b] = holders.get(b, 0) + 1
        row = sched.req_to_token_pool.req_to_token[r.req_pool_idx]
        assert len(row) == r.seq_len, f"{r.rid}: {len(row)} slots for {r.seq_len} computed tokens"
        assert len(st.blocks) == -(-r.seq_len // ps), f"{r.rid}: {len(st.blocks)} blocks for {r.seq_len} tokens"
        assert all(row[j] // ps == st.blocks[j // ps] for j in range(len(row))), f"{r.rid} computes outside its blocks"
        hashes = kv._hashes(r, st, st.num_cached)[: st.num_cached].tolist()
        cached = st.blocks[: st.num_cached]
        assert all(pool.is_cached[b] for b in cached), f"{r.rid}: a block it cached is not in the cache"
        assert [pool.block_hash[b] for b in cached] == hashes, f"{r.rid}: a cached block of another prefix"
    for b in range(pool.num_blocks):
        assert pool.ref_cnt[b] == holders.get(b, 0), f"block {b}: {pool.ref_cnt[b]} references, {holders.get(b, 0)} holders"
        assert (b in pool.free_queue) == (pool.ref_cnt[b] == 0), f"block {b} is free and held, or neither"
    assert len(pool.free_queue) == len(pool.free_queue.order()) == pool.num_blocks - len(holders)
    for r in sched.waiting_queue:
        assert r.req_pool_idx is None and r.seq_len == 0 and not kv.reqs.get(r, RequestBlocks()).blocks, f"waiting {r.rid} still holds KV"


def _hand_run(trace: Trace, config: VllmSchedulerConfig) -> tuple[VllmScheduler, _CheckedLoop, list[Req]]:
    model = load_model_config("llama-3.1-8b")
    sched = VllmScheduler(config)
    driver = SimDriver(RooflineCostModel(model, load_hardware("h100")))
    reqs = [
        Req(
            rid=tr.rid or str(i),
            input_len=tr.input_len,
            input_ids_fn=(lambda tr=tr, i=i: materialize_input_ids(tr, i)),
            sampling_params=SamplingParams(max_new_tokens=tr.output_len, ignore_eos=True),
            arrival_time=tr.arrival_s,
            priority=tr.priority,
            index=i,
        )
        for i, tr in enumerate(trace.requests)
    ]
    loop = _CheckedLoop(sched, iter(reqs), driver.clock, config.overlap)
    driver.run(loop)
    sched.check_invariants()
    assert loop.checks > 0 or all(r.finished_reason.value == "rejected" for r in reqs)
    return sched, loop, reqs


# --- the budget, decodes first, preemption ---------------------------------------------------


@pytest.mark.parametrize("overlap", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("budget", [64, 512])
def test_token_budget_is_never_exceeded_and_prompts_are_chunked(tmp_path, overlap, budget):
    trace = _shared_trace()
    _, run = _replay(trace, tmp_path, overlap=overlap, max_num_batched_tokens=budget)
    _assert_exact_outputs(run, trace)
    steps = run.steps
    assert steps["num_tokens"].max() <= budget
    assert (steps["mode"] == "mixed").any(), "decodes and prefill chunks were meant to share steps"
    # Prompts longer than the budget still complete: their prefill took several steps.
    long_prompts = run.requests[run.requests["input_tokens"] - run.requests["cached_tokens"] > budget]
    if budget == 64:
        assert len(long_prompts) > 0


@pytest.mark.parametrize("overlap", [True, False], ids=["async", "sync"])
def test_running_decodes_are_in_every_step_until_they_finish(tmp_path, overlap):
    """With room for every running decode in the budget, a request that is not preempted
    gets a token at every step from its first token to its last, prefills or not."""
    trace = _shared_trace(n=40, rate=200.0)
    _, run = _replay(trace, tmp_path, overlap=overlap, max_num_batched_tokens=300, max_num_seqs=64)
    _assert_exact_outputs(run, trace)
    steps = run.steps
    assert (steps["mode"] != "decode").sum() > 5
    times = np.sort(steps["process_start"].to_numpy())
    checked = 0
    for row in run.requests.itertuples():
        if row.num_retractions or row.output_tokens < 2:
            continue
        expected = times[(times >= row.first_token) & (times <= row.finish)]
        assert np.array_equal(np.asarray(row.token_times), expected), f"{row.rid} skipped a step while decoding"
        checked += 1
    assert checked > 20


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_preempted_requests_are_recomputed_and_make_exactly_their_outputs(tmp_path, overlap, page_size):
    trace = _burst_trace()
    result, run = _replay(trace, tmp_path, overlap=overlap, page_size=page_size, kv_tokens=_max_need(trace) + 64)
    _assert_exact_outputs(run, trace)
    df = run.requests
    assert df["num_retractions"].sum() > 0, "a pool for about one request was meant to preempt"
    assert run.steps["num_retracted"].sum() == df["num_retractions"].sum()
    # A preempted request is prefilled again with its outputs so far: more prompt tokens admitted.
    preempted = df[df["num_retractions"] > 0]
    assert (preempted["prefill_tokens"] > preempted["input_tokens"]).all()


def test_preemption_takes_the_last_admitted_request(tmp_path):
    """FCFS: when KV runs out, the most recently admitted running request goes back first,
    so the earliest arrivals finish before the later ones are preempted again."""
    trace = _burst_trace(n=12, seed=2)
    sched, _, reqs = _hand_run(trace, VllmSchedulerConfig(kv_tokens=_max_need(trace) + 48, context_len=131072, page_size=16))
    assert sched.num_preemptions > 0
    assert reqs[0].num_retractions == 0, "the first admitted request is never the victim while others run"


def test_priority_policy_preempts_the_lowest_priority(tmp_path):
    """vLLM's priority order: a smaller value runs first; the victim is the largest value."""
    trace = _burst_trace(n=12, seed=2)
    for i, r in enumerate(trace.requests):
        r.priority = 0 if i % 3 == 0 else 5
    config = VllmSchedulerConfig(kv_tokens=_max_need(trace) + 48, context_len=131072, page_size=16, policy="priority")
    sched, _, reqs = _hand_run(trace, config)
    assert sched.num_preemptions > 0
    urgent = [r for r in reqs if r.priority == 0]
    others = [r for r in reqs if r.priority == 5]
    assert sum(r.num_retractions for r in urgent) < sum(r.num_retractions for r in others)
    assert max(r.finish_time for r in urgent) <= max(r.finish_time for r in others)


# --- prefix caching at block granularity ---------------------------------------------------------


@pytest.mark.slow
def test_prefix_hits_come_in_whole_blocks(tmp_path):
    """Two prompts share 40 tokens: with blocks of 16 the second reuses 32 of them, with
    blocks of 64 none; a prompt equal to a cached one reuses all its full blocks but the
    one holding its last token (which must be computed for its logits)."""
    shared = list(range(1000, 1040))
    reqs = [
        TraceRequest(0.0, 60, 4, input_ids=shared + list(range(20))),
        TraceRequest(1.0, 50, 4, input_ids=shared + list(range(500, 510))),
        TraceRequest(2.0, 64, 4, input_ids=list(range(3000, 3064))),
        TraceRequest(3.0, 64, 4, input_ids=list(range(3000, 3064))),
    ]
    for page_size, want in ((16, [0, 32, 0, 48]), (64, [0, 0, 0, 0]), (1, [0, 40, 0, 63])):
        _, run = _replay(Trace(reqs), tmp_path / f"p{page_size}", page_size=page_size)
        assert run.requests["cached_tokens"].tolist() == want, f"page size {page_size}"
        assert run.summary["cache_hit_rate"] == pytest.approx(sum(want) / sum(r.input_len for r in reqs))


def test_blocks_cached_by_a_request_scheduled_in_the_same_step_are_hit():
    """vLLM caches a request's full blocks when it allocates them: a request admitted right
    after it in the same step reuses them, instead of computing the prompt twice."""
    shared = list(range(7000, 7256))
    trace = Trace(
        [TraceRequest(0.0, 266, 3, input_ids=shared + list(range(10))), TraceRequest(0.0, 266, 3, input_ids=shared + list(range(20, 30)))]
    )
    sched, loop, reqs = _hand_run(trace, VllmSchedulerConfig(kv_tokens=4096, context_len=131072, page_size=16))
    assert loop.steps.cols["batch_size"][0] == 2, "both were meant to be admitted in the first step"
    assert reqs[1].cached_tokens == 256
    assert loop.steps.cols["num_tokens"][0] == 266 + 10


def test_no_prefix_cache_means_no_hits(tmp_path):
    trace = _shared_trace()
    _, run = _replay(trace, tmp_path, disable_radix_cache=True)
    _assert_exact_outputs(run, trace)
    assert (run.requests["cached_tokens"] == 0).all()


# --- KV bookkeeping at every wait, and fuzzing ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_kv_bookkeeping_holds_at_every_wait(overlap, page_size, policy):
    trace = _shared_trace()
    config = VllmSchedulerConfig(
        kv_tokens=2 * _max_need(trace), context_len=131072, page_size=page_size, max_num_batched_tokens=256, policy=policy, overlap=overlap
    )
    sched, _, reqs = _hand_run(trace, config)
    assert sorted(len(r.output_ids) for r in reqs) == sorted(r.output_len for r in trace.requests)
    assert sum(r.cached_tokens for r in reqs) > 0


@st.composite
def _case(draw):
    n = draw(st.integers(1, 14))
    page_size = draw(st.sampled_from([1, 4, 16]))
    prefixes = [list(range(10_000 * (k + 1), 10_000 * (k + 1) + draw(st.integers(1, 90)))) for k in range(2)]
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.001, 0.02, 0.3]))
        head = prefixes[draw(st.integers(0, 1))] if draw(st.booleans()) else []
        tail = list(range(100 * i + 50_000, 100 * i + 50_000 + draw(st.integers(1, 80))))
        ids = head + tail
        reqs.append(TraceRequest(t, len(ids), draw(st.integers(1, 70)), input_ids=ids, priority=draw(st.integers(0, 2))))
    trace = Trace(reqs)
    need = _max_need(trace)
    config = VllmSchedulerConfig(
        kv_tokens=draw(st.integers(max(need - 8, page_size), 4 * need + 64)),  # a few can never fit
        context_len=131072,
        page_size=page_size,
        max_num_batched_tokens=draw(st.integers(max(1, page_size), 300)),
        max_num_seqs=draw(st.integers(1, 8)),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        enable_prefix_caching=draw(st.booleans()),
        reserve_full_prompt=draw(st.booleans()),
        overlap=draw(st.booleans()),
    )
    return trace, config


@pytest.mark.slow
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])  # 15 under ci, 60 under deep
@given(_case())
def test_fuzz_every_run_completes_exactly_within_budget_with_kv_consistent(case):
    """Random traces (shared prefixes, bursts, tiny pools) and configs: every request that
    fits the pool makes exactly its output length (the others are rejected), no step
    exceeds the budget, the KV bookkeeping holds at every wait and the end-of-run
    invariants hold (check_invariants raises otherwise)."""
    trace, config = case
    sched, loop, reqs = _hand_run(trace, config)
    pages = config.kv_tokens // config.page_size
    fits = [-(-(r.input_len + r.output_len - 1) // config.page_size) <= pages for r in trace.requests]
    assert [r.finished_reason.value for r in reqs] == ["length" if f else "rejected" for f in fits]
    assert [len(r.output_ids) for r in reqs] == [r.output_len if f else 0 for r, f in zip(trace.requests, fits)]
    if not any(fits):
        return
    assert max(loop.steps.cols["num_tokens"]) <= config.max_num_batched_tokens
    assert max(loop.steps.cols["num_running"]) <= config.max_num_seqs
    for r in (r for r, f in zip(reqs, fits) if f):
        assert r.cached_tokens % config.page_size == 0
        assert len(r.token_times) == r.max_new_tokens and r.first_token_time <= r.finish_time


# --- requests that never fit, options, run.json ----------------------------------------------------


def test_requests_that_can_never_fit_are_rejected_not_dropped(tmp_path):
    trace = Trace([TraceRequest(0.0, 100, 20), TraceRequest(0.01, 900, 200), TraceRequest(0.02, 120, 15)])
    _, run = _replay(trace, tmp_path, kv_tokens=512, page_size=16)
    df = run.requests
    assert df["status"].tolist() == ["finished", "rejected", "finished"]
    assert "KV pool" in df["reason"][1]


@pytest.mark.slow
def test_run_json_records_the_scheduler_and_vllm_defaults(tmp_path):
    trace = _shared_trace(n=5)
    _, run = _replay(trace, tmp_path)
    opts, sched = run.meta["options"], run.meta["scheduler"]
    assert opts["scheduler"] == "vllm" and opts["page_size"] == 16
    assert opts["max_num_seqs"] == 1024 and opts["max_num_batched_tokens"] == 8192
    assert sched["name"] == "vllm" and sched["follows"] == "vLLM 0.19.0 v1 scheduler"
    sglang = replay(str(tmp_path / "trace.json"), ReplayOptions(), out=tmp_path / "sglang")
    meta = json.loads((sglang.run_dir / "run.json").read_text())
    assert meta["options"]["scheduler"] == "sglang" and meta["options"]["page_size"] == 1


@pytest.mark.parametrize(
    "args, needles",
    [
        (
            ["--scheduler", "vllm", "--chunked-prefill-size", "512"],
            ["--chunked-prefill-size belongs to --scheduler sglang", "--max-num-batched-tokens"],
        ),
        (
            ["--scheduler", "vllm", "--max-running-requests", "8"],
            ["--max-running-requests belongs to --scheduler sglang", "--max-num-seqs"],
        ),
        (["--scheduler", "vllm", "--policy", "lpm"], ["--policy lpm is SGLang's", "fcfs or priority"]),
        (["--max-num-seqs", "8"], ["--max-num-seqs belongs to --scheduler vllm", "--max-running-requests"]),
        (["--max-num-batched-tokens", "512"], ["--max-num-batched-tokens belongs to --scheduler vllm"]),
    ],
)
def test_an_option_of_the_other_scheduler_is_one_line_error(tmp_path, capsys, args, needles):
    path = tmp_path / "t.json"
    _shared_trace(n=3).write(path)
    code = main(["replay", str(path), "--out", str(tmp_path / "run"), "-q", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    for needle in needles:
        assert needle in err[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_both_schedulers_replay_one_trace_and_compare(tmp_path):
    """The same trace, GPU and cost model under both schedulers: both complete, and the
    comparison names the scheduler as what differs."""
    trace = _shared_trace(n=40, rate=200.0)
    path = tmp_path / "t.json"
    trace.write(path)
    for name in ("sglang", "vllm"):
        replay(str(path), ReplayOptions(scheduler=name, page_size=16), out=tmp_path / name)
        _assert_exact_outputs(load_run(tmp_path / name), trace)
    code = main(["compare", str(tmp_path / "sglang"), str(tmp_path / "vllm")])
    assert code == 2
