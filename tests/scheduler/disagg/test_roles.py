"""Each scheduler in a PD role (scheduler/disagg/), driven by hand: a prefill instance keeps a
request's KV after its one-token prefill until the transfer is done; a decode instance reserves the
prompt's KV, takes the request in with its first token and KV present (no extend), decodes it from
the second token, and holds back what its budget refuses."""

from __future__ import annotations

import pytest

from scheduler.core.forward_plan import ForwardMode
from scheduler.core.req import Req
from scheduler.core.sampling import SamplingParams
from scheduler.disagg.roles import Prefilled
from scheduler.disagg.sglang_roles import RESERVED_DECODE_TOKENS, SglangDecode, SglangPrefill
from scheduler.disagg.vllm_roles import VllmDecode, VllmPrefill
from scheduler.sglang.config import SchedulerConfig
from scheduler.vllm.config import VllmSchedulerConfig

KINDS = ["sglang", "vllm"]


def _prefill(kind: str, kv_tokens: int = 4000):
    if kind == "vllm":
        return VllmPrefill(VllmSchedulerConfig(kv_tokens=kv_tokens, context_len=8192, overlap=False))
    return SglangPrefill(SchedulerConfig(kv_tokens=kv_tokens, context_len=8192, overlap=False))


def _decode(kind: str, kv_tokens: int = 4000):
    if kind == "vllm":
        return VllmDecode(VllmSchedulerConfig(kv_tokens=kv_tokens, context_len=8192, overlap=False))
    return SglangDecode(SchedulerConfig(kv_tokens=kv_tokens, context_len=8192, overlap=False))


def _req(i: int, prompt_len: int, out: int) -> Req:
    prompt = list(range(i * 10_000, i * 10_000 + prompt_len))
    return Req(str(i), prompt_len, (lambda p=prompt: p), SamplingParams(max_new_tokens=out), 0.0, index=i)


def _step(sched, now: float):
    """One step without overlap: schedule, launch at now, process at now + 1 (every token 7)."""
    batch = sched.get_next_batch_to_run()
    if batch is None:
        return None
    launched = sched.launch(batch, now, False)
    sched.process_batch_result(launched, [7] * len(launched.reqs), now + 1)
    return launched


@pytest.mark.parametrize("kind", KINDS)
def test_a_prefill_instance_holds_the_kv_until_the_transfer_is_done(kind):
    sched = _prefill(kind)
    prefilled = []
    sched.on_prefilled = lambda req, now: prefilled.append((req, now))
    twin = _req(0, 100, 1)
    sched.add_request(twin)
    launched = _step(sched, 0.0)
    assert launched.plan.mode is not ForwardMode.DECODE and launched.plan.num_tokens == 100
    assert prefilled == [(twin, 1.0)] and twin.output_ids == [7] and twin.first_token_time == 1.0
    assert sched.done == [] and sched.kv_used_tokens() >= 100  # its KV stays for the transfer
    sched.transfer_done(twin, 1.5)
    assert sched.kv_used_tokens() >= 100  # (let go at the next schedule)
    sched.release_transferred(2.0)
    assert sched.done == [twin] and twin.finish_time == 2.0
    assert sched.kv_used_tokens() == 0 and sched.kv_cached_tokens() >= 96  # its prompt stays in the prefix cache
    sched.check_invariants()


@pytest.mark.parametrize("kind", KINDS)
def test_a_decode_instance_takes_a_request_in_with_its_kv_and_decodes_from_the_second_token(kind):
    sched = _decode(kind)
    reserved = []
    sched.on_preallocated = lambda req, now, held_s: reserved.append((req, now, held_s))
    req = _req(0, 100, 5)
    sched.add_request(req)
    assert list(sched.prealloc_queue) == [req] and not sched.waiting_queue
    sched.process_queues(1.0)
    assert reserved == [(req, 1.0, 0.0)] and req in sched.preallocated
    page = 16 if kind == "vllm" else 1
    assert sched.kv_used_tokens() == -(-100 // page) * page and sched.num_running() == 0
    assert sched.get_next_batch_to_run() is None  # (waiting for its KV: nothing to run)
    sched.kv_arrived(req, Prefilled(token=42, scheduled_time=0.2, cached_tokens=30, prefill_tokens=100))
    sched.process_queues(2.0)
    assert req.output_ids == [42] and req.first_token_time == 2.0 and req.token_times.tolist() == [2.0]
    assert (req.scheduled_time, req.cached_tokens, req.prefill_tokens) == (0.2, 30, 100)
    launched = _step(sched, 2.0)
    plan = launched.plan
    assert plan.mode is ForwardMode.DECODE and plan.prefix_lens == [100] and plan.extend_lens == [1]  # the KV is there: no extend
    now = 3.0
    while not req.finished():
        assert _step(sched, now).plan.mode is ForwardMode.DECODE
        now += 1
    assert len(req.output_ids) == 5 and sched.done == [req] and sched.kv_used_tokens() == 0
    sched.check_invariants()


@pytest.mark.parametrize("kind", KINDS)
def test_a_request_whose_first_token_is_its_last_finishes_as_it_comes_in(kind):
    sched = _decode(kind)
    req = _req(0, 64, 1)
    sched.add_request(req)
    sched.process_queues(0.0)
    sched.kv_arrived(req, Prefilled(7, 0.0, 0, 64))
    sched.process_queues(1.0)
    assert req.finished() and sched.done == [req] and req.finish_time == 1.0 and sched.kv_used_tokens() == 0
    sched.check_invariants()


def test_sglangs_decode_budget_holds_a_request_back_until_kv_frees():
    # 1000 tokens: a 400-token prompt takes 400 + 512 reserved; a second one does not fit beside it.
    sched = _decode("sglang", kv_tokens=1000)
    reserved = []
    sched.on_preallocated = lambda req, now, held_s: reserved.append((req.rid, now, held_s))
    a, b = _req(0, 400, 3), _req(1, 400, 3)
    sched.add_request(a)
    sched.add_request(b)
    sched.process_queues(1.0)
    assert reserved == [("0", 1.0, 0.0)] and list(sched.prealloc_queue) == [b] and sched.held_since == {b: 1.0}
    sched.kv_arrived(a, Prefilled(7, 0.5, 0, 400))
    now = 2.0
    while not a.finished():
        sched.process_queues(now)
        _step(sched, now)
        now += 1
    assert list(sched.prealloc_queue) == [b]  # held while a ran
    sched.process_queues(now)
    assert reserved[-1] == ("1", now, now - 1.0)
    assert 400 + RESERVED_DECODE_TOKENS <= 1000 < 2 * 400 + RESERVED_DECODE_TOKENS


def test_a_prompt_no_decode_instance_can_ever_reserve_is_rejected_at_arrival():
    sched = _decode("sglang", kv_tokens=1000)
    req = _req(0, 600, 3)  # 600 + 512 reserved > 1000
    sched.add_request(req)
    assert req.finished() and "never pre-allocated" in req.reject_reason and not sched.prealloc_queue
