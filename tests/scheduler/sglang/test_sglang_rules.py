"""SGLang 0.5.23's scheduling rules, each as the steps or budgets a user would see.

Each test pins one rule the conformance harness (make conformance, SGLang's own code as
the oracle) found or the issue listed; they run without SGLang. Steps come from the real
scheduler and event loop on a logical clock (scheduler.step_clock: one forward per step).
"""

from __future__ import annotations

import pytest

from scheduler.core.req import Req
from scheduler.core.sampling import SamplingParams
from scheduler.loop.step_clock import run_steps
from scheduler.memory.chunk_cache import ChunkCache
from scheduler.memory.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from scheduler.memory.radix_cache import RadixCache
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.policy import SchedulePolicy
from scheduler.sglang.prefill_adder import AddReqResult, PrefillAdder
from scheduler.sglang.scheduler import Scheduler
from scheduler.sglang.server_defaults import default_chunked_prefill_size, default_mem_fraction_static
from simulator.hardware.specs import load_hardware
from testbed.options import ReplayOptions, resolved_options
from testbed.replay import replay
from testbed.traces.schema import Trace, TraceRequest


def make(rid: str, n_in: int, n_out: int, at: int = 0, ignore_eos: bool = True, priority: int = 0, base: int = 0, index: int = 0) -> Req:
    prompt = [base + 1000 * (index + 1) + i for i in range(n_in)] if base == 0 else [base + i for i in range(n_in)]
    return Req(
        rid,
        n_in,
        lambda p=prompt: p,
        SamplingParams(max_new_tokens=n_out, ignore_eos=ignore_eos),
        float(at),
        priority=priority,
        index=index,
    )


def token(req: Req, k: int) -> int:
    return 7  # never an EOS: eos_token_ids is empty


def steps_of(reqs: list[Req], **config):
    config.setdefault("context_len", 8192)
    config.setdefault("overlap", False)
    sched = Scheduler(SchedulerConfig(**config))
    driver, _ = run_steps(sched, sorted(reqs, key=lambda r: (r.arrival_time, r.index)), token)
    sched.check_invariants()
    return driver.steps, sched


def extends(steps) -> list[list[str]]:
    return [[rid for rid, _ in s.reqs] for s in steps if s.mode == "extend"]


# --- admission budgets ------------------------------------------------------------------


@pytest.mark.parametrize("ignore_eos", [True, False], ids=["fixed-length", "may-stop"])
def test_running_fixed_length_request_reserves_its_whole_output(ignore_eos):
    """A running request that ignores EOS will decode all it has left; one that may stop
    is expected to decode new_token_ratio of it. B fits only beside the latter estimate."""
    a = make("a", 10, 1000, ignore_eos=ignore_eos, index=0)
    b = make("b", 10, 1000, at=1, ignore_eos=ignore_eos, index=1)
    steps, _ = steps_of([a, b], kv_tokens=1800)
    b_start = next(i for i, s in enumerate(steps) if s.mode == "extend" and s.reqs[0][0] == "b")
    if ignore_eos:
        assert b_start == 1000, "b waits until a has finished"
    else:
        assert b_start == 1, "b runs beside a at once"


def _adder(kv: int, page: int = 1, chunk: int | None = None, used: int = 0):
    alloc = TokenToKVPoolAllocator(kv, page)
    alloc.alloc(used)
    pool = ReqToTokenPool(8)
    cache = RadixCache(pool, alloc, page)
    return PrefillAdder(cache, alloc, None, 0.7, 16384, chunk, page), alloc


def _ready(req: Req, cache=None) -> Req:
    req.init_next_round_input(cache)
    return req


def test_kv_check_is_strict_and_reserves_a_page_per_request():
    """Admission needs prompt + output + one page < free slots (SGLang: `<`, not `<=`),
    and each admitted request takes its page-rounded prompt, its output and one page."""
    adder, _ = _adder(992, page=16)
    fits = _ready(make("a", 100, 50))  # 100 + 50 + 16 = 166 < 992
    assert adder.add_one_req(fits) == AddReqResult.CONTINUE
    assert adder.rem_total_tokens == 992 - (112 + 16 + 50)
    left = int(adder.rem_total_tokens)  # 814
    exact = _ready(make("b", left - 16 - 1, 1, index=1))  # total == left: refused
    assert adder.add_one_req(exact) == AddReqResult.NO_TOKEN
    below = _ready(make("c", left - 16 - 2, 1, index=2))  # total == left - 1: admitted
    adder.add_one_req(below)
    assert adder.can_run_list == [fits, below]


def test_continued_chunk_is_capped_by_the_kv_budget():
    """The next chunk of a chunked prompt is at most what the KV budget has left, not the full chunk size."""
    adder, _ = _adder(1000, chunk=256, used=900)  # 100 slots free
    req = _ready(make("a", 500, 10))
    assert adder.add_chunked_req(req) is req  # still not done
    assert req.extend_input_len == 100


def test_chunking_does_not_apply_the_input_budget_to_later_requests():
    """With chunked prefill, max_prefill_tokens stops admission only once spent (SGLang has no
    per-request input check then); without chunking a later request over the budget waits."""
    for chunk, admitted in ((4096, 2), (None, 1)):
        alloc = TokenToKVPoolAllocator(10000, 1)
        cache = RadixCache(ReqToTokenPool(8), alloc, 1)
        adder = PrefillAdder(cache, alloc, None, 0.7, 300, chunk, 1)
        adder.add_one_req(_ready(make("a", 200, 5)))
        adder.add_one_req(_ready(make("b", 200, 5, index=1)))
        assert len(adder.can_run_list) == admitted, chunk


def test_without_radix_cache_fixed_length_admission_simulates_the_batch_to_its_end():
    """No radix cache, ignore_eos: b is admitted only if the pool holds a and b decoding to
    their ends, shortest first (SGLang's add_one_req_ignore_eos), even if the plain budget would admit it."""
    alloc = TokenToKVPoolAllocator(294, 1)
    cache = ChunkCache(ReqToTokenPool(8), alloc, 1)
    adder = PrefillAdder(cache, alloc, None, 0.7, 16384, None, 1)
    assert adder.add_one_req(_ready(make("a", 50, 100))) == AddReqResult.CONTINUE
    b = _ready(make("b", 40, 100, index=1))
    assert 40 + 100 + 1 < adder.rem_total_tokens  # the plain budget would take b
    assert adder.add_one_req(b) == AddReqResult.NO_TOKEN  # a and b decoding together leave 2 slots for 2
    c = _ready(make("c", 20, 60, index=2))
    adder.add_one_req(c)
    assert adder.can_run_list[-1] is c


# --- the running batch ---------------------------------------------------------------------


def test_finished_requests_leave_the_running_batch_every_step():
    """max_running_requests 2: when a finishes, c is admitted at the next step (a finished
    request does not keep the batch 'full' until a decode step filters it)."""
    a, b, c = make("a", 10, 2, index=0), make("b", 10, 30, index=1), make("c", 10, 5, at=1, index=2)
    steps, _ = steps_of([a, b, c], kv_tokens=4000, max_running_requests=2)
    assert [s.mode for s in steps[:3]] == ["extend", "decode", "extend"]
    assert steps[2].reqs == [("c", 10)]


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
def test_request_within_a_few_tokens_of_the_pool_does_not_deadlock(tmp_path, overlap):
    """The issue's reproducer ((1, 1) and (3839, 4) at time 0, 3844 KV tokens) waited forever
    in overlap mode (DeadlockError). Now the run ends: 3839 leaves no room for output
    (SGLang's limit is the pool less 6 tokens), so it is rejected with a reason."""
    trace = Trace([TraceRequest(0.0, 1, 1, rid="small"), TraceRequest(0.0, 3839, 4, rid="big")])
    trace.write(tmp_path / "t.json")
    result = replay(str(tmp_path / "t.json"), ReplayOptions(kv_tokens=3844, overlap=overlap), out=tmp_path / "run")
    assert result.status == "complete"
    assert (result.summary["completed"], result.summary["rejected"]) == (1, 1)


def test_an_empty_running_batch_is_never_full():
    """What kept that request waiting: the batch-full flag, set while the small request ran,
    was never cleared once the running batch emptied. An empty batch now admits."""
    sched = Scheduler(SchedulerConfig(kv_tokens=4000, context_len=8192))
    sched.running_batch.batch_is_full = True
    sched.add_request(make("big", 3000, 4))
    batch = sched.get_next_batch_to_run()
    assert batch is not None and [r.rid for r in batch.reqs] == ["big"]


def test_on_idle_resets_the_decode_estimate_only_when_fully_idle():
    sched = Scheduler(SchedulerConfig(kv_tokens=1000, context_len=4096))
    sched.new_token_ratio = 0.3
    sched.add_request(make("a", 10, 5))
    sched.on_idle()  # a waits: not idle
    assert sched.new_token_ratio == 0.3
    sched.waiting_queue.clear()
    sched.on_idle()
    assert sched.new_token_ratio == sched.config.init_new_token_ratio


def test_retraction_ratio_and_the_order_of_the_kept_requests():
    """After a retraction the estimate is (decoded + 20 per kept request) / (their max_new + 1)
    (SGLang's, capped at 1), and the kept requests decode in SGLang's keep order: most
    outputs first, then the shortest prompt."""
    # As the estimate decays, a second long request is admitted beside the first; both cannot finish.
    reqs = [make(f"r{i}", 10 + i, 2000, ignore_eos=False, index=i) for i in range(3)]
    steps, sched = steps_of(reqs, kv_tokens=3000)
    i = next(k for k, s in enumerate(steps) if s.retracted)
    kept = [rid for rid, _ in steps[i].reqs]
    by_rid = {r.rid: r for r in reqs}
    # Outputs of each kept request when the retraction happened: one per step it ran in so far.
    decoded = {rid: sum(1 for s in steps[:i] for r, _ in s.reqs if r == rid) for rid in kept}
    want = min(1.0, (sum(decoded.values()) + 20 * len(kept)) / (sum(by_rid[r].max_new_tokens for r in kept) + 1))
    assert steps[i].new_token_ratio == pytest.approx(want, abs=1e-8)
    assert kept == sorted(kept, key=lambda r: (-decoded[r], by_rid[r].input_len))


def test_max_running_requests_is_at_most_half_the_pool():
    assert SchedulerConfig(kv_tokens=100, context_len=4096).effective_max_running_requests == 50
    assert SchedulerConfig(kv_tokens=100, context_len=4096, max_running_requests=80).effective_max_running_requests == 50
    assert SchedulerConfig(kv_tokens=10**6, context_len=4096, max_running_requests=80).effective_max_running_requests == 80


# --- queue order -----------------------------------------------------------------------------


def test_only_lpm_falls_back_to_fcfs_on_a_long_queue():
    """Above 128 waiting requests LPM keeps queue order; DFS-weight still groups by prefix."""
    alloc = TokenToKVPoolAllocator(10**6, 1)
    cache = RadixCache(ReqToTokenPool(8), alloc, 1)
    shared = [5000 + i for i in range(64)]
    cache.insert(shared, alloc.alloc(64))
    queue = []
    for i in range(140):
        tail = [100000 + 100 * i + k for k in range(4)]
        prompt = (shared + tail) if i % 2 else ([200000 + 100 * i + k for k in range(64)] + tail)
        queue.append(Req(f"q{i}", len(prompt), lambda p=prompt: p, SamplingParams(5), 0.0, index=i))
    for policy, reordered in (("lpm", False), ("dfs-weight", True)):
        q = list(queue)
        SchedulePolicy(policy, cache).calc_priority(q)
        assert (q != queue) is reordered, policy


def test_requeued_request_goes_behind_equal_priorities():
    """Priority scheduling, one request at a time: h (priority 20) preempts l (0); l re-enters
    the queue behind w (0), which arrived after l but queued before l came back."""
    l, h, w = make("l", 10, 50, index=0), make("h", 10, 5, at=2, priority=20, index=1), make("w", 10, 5, at=2, index=2)
    steps, _ = steps_of([l, h, w], kv_tokens=4000, max_running_requests=1, enable_priority_scheduling=True)
    assert extends(steps) == [["l"], ["h"], ["w"], ["l"]]
    assert steps[2].retracted == ["l"] and steps[2].reqs == [("h", 10)]


def test_preemption_needs_a_priority_gap_above_the_threshold():
    l, h = make("l", 10, 50, index=0), make("h", 10, 5, at=2, priority=10, index=1)
    steps, _ = steps_of(
        [l, h], kv_tokens=4000, max_running_requests=1, enable_priority_scheduling=True, priority_scheduling_preemption_threshold=10
    )
    assert extends(steps) == [["l"], ["h"]] and not any(s.retracted for s in steps)
    l, h = make("l", 10, 50, index=0), make("h", 10, 5, at=2, priority=11, index=1)
    steps, _ = steps_of(
        [l, h], kv_tokens=4000, max_running_requests=1, enable_priority_scheduling=True, priority_scheduling_preemption_threshold=10
    )
    assert extends(steps) == [["l"], ["h"], ["l"]]


# --- the prefix cache --------------------------------------------------------------------------


def test_finished_request_is_cached_split_at_its_prompt():
    """Eviction drops a finished request's outputs before its prompt (SGLang splits the node)."""
    a = make("a", 40, 20)
    _, sched = steps_of([a], kv_tokens=1000)
    cache = sched.tree_cache
    assert cache.evictable_size() == 40 + 19
    cache.evict(1)  # the smallest eviction takes the output leaf, all of it
    assert cache.evictable_size() == 40
    matched, _ = cache.match_prefix(a.origin_input_ids if a._input_ids else [1000 + i for i in range(40)])
    assert len(matched) == 40


def test_waiting_requests_prefixes_are_refreshed_before_eviction():
    """Every 32nd pass the waiting requests' cached prefixes are touched, so LRU eviction
    takes another leaf first."""
    alloc = TokenToKVPoolAllocator(1000, 1)
    cache = RadixCache(ReqToTokenPool(8), alloc, 1)
    old, new = [1 + i for i in range(10)], [500 + i for i in range(10)]
    cache.insert(old, alloc.alloc(10))
    cache.insert(new, alloc.alloc(10))  # `old` is now the least recently used
    waiting = Req("w", 12, lambda: old + [98, 99], SamplingParams(5), 0.0)
    SchedulePolicy("fcfs", cache).calc_priority([waiting])
    cache.evict(10)
    assert len(cache.match_prefix(old)[0]) == 10 and len(cache.match_prefix(new)[0]) == 0


# --- mixed chunk ---------------------------------------------------------------------------------


def test_mixed_chunk_decodes_ride_along_in_the_prefill():
    """--enable-mixed-chunk: while b is prefilled in chunks, a decodes in the same forwards;
    the rows are the prefill first, then the decodes; every request still gets its length."""
    a, b = make("a", 10, 40, index=0), make("b", 300, 5, at=2, index=1)
    steps, sched = steps_of([a, b], kv_tokens=4000, chunked_prefill_size=128, enable_mixed_chunk=True)
    mixed = [s for s in steps if s.mode == "mixed"]
    assert len(mixed) == 3  # 128 + 128 + 44 of b, each with a's decode
    assert [s.reqs[-1] for s in mixed] == [("a", 1)] * 3
    assert [s.reqs[0][1] for s in mixed] == [127, 127, 46]  # the chunk budget less the decode token
    assert {r.rid: len(r.output_ids) for r in sched.done} == {"a": 40, "b": 5}


def test_schedule_conservativeness_scales_the_decode_estimate():
    assert SchedulerConfig(kv_tokens=100, context_len=4096, schedule_conservativeness=0.5).init_new_token_ratio == pytest.approx(0.35)
    assert SchedulerConfig(kv_tokens=100, context_len=4096, schedule_conservativeness=2.0).init_new_token_ratio == 1.0


# --- defaults from the device memory ------------------------------------------------------------


def test_chunk_size_and_memory_fraction_follow_the_device_memory():
    """SGLang's rules: 8192-token chunks and 0.83 of an H100's 79.6 GiB (reserve 13.9 GB:
    activations of 8192 tokens, CUDA graphs); 0.903 of an H200; 2048 on a 16 GiB GPU."""
    h100 = resolved_options(ReplayOptions(hardware="h100"))
    assert (h100.chunked_prefill_size, h100.mem_fraction_static) == (8192, 0.83)
    assert resolved_options(ReplayOptions(hardware="h200")).mem_fraction_static == 0.903
    assert default_chunked_prefill_size(16 << 30) == 2048
    assert default_mem_fraction_static(16 << 30, 2048, 16384) == round((16384 - (512 + 3072 + 128 + 16 + 8 * 42)) / 16384, 3)
    # Each GPU of a TP group keeps 128 MiB of slack per GPU in the group; at TP >= 4 it
    # captures decode graphs up to 512 requests (58 prefill graph sizes up to 8192 tokens).
    h100_tp4 = resolved_options(ReplayOptions(hardware="h100", tp=4))
    mib = load_hardware("h100").memory_bytes / (1 << 20)
    assert h100_tp4.mem_fraction_static == round((mib - (512 + 8192 * 1.5 + 4 * 128 + 2 * 512 + 8 * 58)) / mib, 3)
    assert h100_tp4.mem_fraction_static < h100.mem_fraction_static
    given = resolved_options(ReplayOptions(hardware="h100", chunked_prefill_size=512, mem_fraction_static=0.5))
    assert (given.chunked_prefill_size, given.mem_fraction_static) == (512, 0.5)


def test_request_sglang_never_admits_is_rejected_at_arrival(tmp_path):
    """Without a radix cache, a fixed-length request whose output was cut to the pool's limit
    fails SGLang's ignore-EOS check forever (SGLang would wait): it is rejected at arrival with
    the reason, and a replay whose every request is rejected says so in one line, exit code 2."""
    import subprocess
    import sys

    Trace([TraceRequest(0.0, 900, 200, rid="big")]).write(tmp_path / "t.json")
    cmd = [
        sys.executable,
        "-m",
        "testbed.cli",
        "replay",
        str(tmp_path / "t.json"),
        "--kv-tokens",
        "1000",
        "--disable-radix-cache",
        "--out",
        str(tmp_path / "run"),
        "-q",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "every request was rejected: 1 never admitted" in p.stderr and "wait for it forever" in p.stderr


@pytest.mark.parametrize(
    "model, hardware, kv",
    [("glm-5", "b200_sxm", "fp8"), ("glm-5", "b300_sxm", "fp8"), ("glm-5", "h200", "auto"), ("deepseek-v3", "b200_sxm", "auto")],
)
def test_sparse_attention_keeps_its_kv_cache_in_fp8_on_blackwell(model, hardware, kv):
    # SGLang resolves --kv-cache-dtype auto to fp8 for DeepSeek Sparse Attention (GLM-5) on compute
    # capability 10 and later; every other model, and Hopper, keep the model's dtype.
    assert resolved_options(ReplayOptions(mode="sim", model=model, hardware=hardware)).kv_cache_dtype == kv
    told = resolved_options(ReplayOptions(mode="sim", model=model, hardware=hardware, kv_cache_dtype="bf16"))
    assert told.kv_cache_dtype == "bf16"  # an explicit dtype stays


def test_a_hybrid_linear_attention_model_with_the_radix_cache_runs_without_overlap():
    # SGLang's default state strategy for Gated DeltaNet layers (no_buffer) cannot overlap with its radix
    # cache on, so it turns the overlap schedule off; without the radix cache it overlaps.
    qwen35 = dict(mode="sim", model="qwen3.5-397b-a17b", hardware="b200_sxm")
    assert resolved_options(ReplayOptions(**qwen35)).overlap is False
    assert resolved_options(ReplayOptions(**qwen35, disable_radix_cache=True)).overlap is True
    assert resolved_options(ReplayOptions(mode="sim", model="glm-5", hardware="b200_sxm")).overlap is True
