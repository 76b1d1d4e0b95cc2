"""new_token_ratio's decay (scheduler/sglang/token_ratio.py): k steps at once give the very float that k
steps one by one give, from SGLang's start value and from any other (a retraction's)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.token_ratio import NewTokenRatioDecay


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    conservativeness=st.floats(min_value=0.0, max_value=2.0),
    decay_steps=st.integers(min_value=1, max_value=2000),
    starts=st.lists(st.one_of(st.none(), st.floats(min_value=0.0, max_value=1.0)), min_size=1, max_size=4),
    steps=st.lists(st.integers(min_value=0, max_value=3000), min_size=1, max_size=6),
)
def test_steps_at_once_equal_steps_one_by_one(conservativeness, decay_steps, starts, steps):
    config = SchedulerConfig(
        kv_tokens=1000, context_len=100, schedule_conservativeness=conservativeness, new_token_ratio_decay_steps=decay_steps
    )
    decay = NewTokenRatioDecay(config.new_token_ratio_decay, config.min_new_token_ratio)
    for start in starts:
        ratio = config.init_new_token_ratio if start is None else start  # (a retraction sets any value)
        for k in steps:
            one_by_one = ratio
            for _ in range(k):
                one_by_one = max(one_by_one - config.new_token_ratio_decay, config.min_new_token_ratio)
            ratio = decay.after(ratio, k)
            assert ratio == one_by_one
