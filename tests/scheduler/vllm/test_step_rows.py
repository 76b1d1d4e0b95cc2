"""StepRows: a step's columns make the plan that ForwardPlan.summarize describes, whatever rows
were added, in whichever way, or removed."""

from __future__ import annotations

from scheduler.core.forward_plan import ForwardMode, ForwardPlan
from scheduler.core.ids import ids
from scheduler.core.req import Req
from scheduler.core.sampling import SamplingParams
from scheduler.vllm.step_rows import StepRows


def _req(i: int, prompt_len: int, outputs: list[int], pending: int | None = None) -> Req:
    r = Req(f"r{i}", prompt_len, lambda: list(range(100, 100 + prompt_len)), SamplingParams(max_new_tokens=50), 0.0, index=i)
    r.output_ids = list(outputs)
    r.pending_token = pending
    r.req_pool_idx = i
    return r


def test_plan_matches_summarize_and_rows_in_order() -> None:
    decode = _req(0, 5, [7, 8], pending=-3)  # tokens 0..7 known, 7 computed: its in-flight one next
    chunk = _req(1, 40, [])
    last = _req(2, 6, [9])  # its last output, not computed yet
    rows = StepRows()
    rows.add_decode(decode, 7, -3, 1000)
    rows.add(chunk, 8, 30, False, ids(range(2000, 2030)))
    rows.add(last, 6, 1, True, ids((3000,)))
    plan = rows.plan(None)
    assert plan.mode is ForwardMode.MIXED
    assert plan.req_pool_indices == [0, 1, 2]
    assert plan.seq_lens == [8, 38, 7]
    assert list(plan.input_ids) == [-3, *range(108, 138), 9]
    assert list(plan.out_cache_loc) == [1000, *range(2000, 2030), 3000]
    summary = (plan.num_tokens, plan.sum_seq_len, plan.sum_prefix_len, plan.attention_pairs, plan.max_seq_len)
    assert summary == ForwardPlan.summarize(plan.prefix_lens, plan.extend_lens)


def test_remove_drops_the_row_and_its_tokens() -> None:
    a, b, c = _req(0, 4, [1]), _req(1, 30, []), _req(2, 4, [2])
    rows = StepRows()
    rows.add(a, 4, 1, True, ids((10,)))
    rows.add(b, 0, 20, False, ids(range(20, 40)))
    rows.add(c, 4, 1, True, ids((50,)))
    assert rows.remove(b) == 20
    assert rows.remove(b) is None
    plan = rows.plan(None)
    assert plan.mode is ForwardMode.DECODE
    assert plan.req_pool_indices == [0, 2]
    assert list(plan.input_ids) == [1, 2] and list(plan.out_cache_loc) == [10, 50]
