"""The experts' kernel under a balanced load: randomly routed tokens, priced from the database's
perfectly spread `balanced` rows (simulator/profiles/gpu_shapes.py, expert_load.spread_row_tokens)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from scheduler.model_config import load_model_config
from simulator.costs.expert_load import ExpertLoad, distinct_experts, spread_row_tokens


def test_random_routing_touches_the_experts_the_roofline_and_the_kernel_profile_both_count():
    # gpt-oss: 128 experts, 4 a token. 32 decodes touch every expert in the database's balanced rows,
    # about 82 when each token draws its 4 at random (the expectation, checked against draws).
    rng = random.Random(0)
    draws = [len({e for _ in range(32) for e in rng.sample(range(128), 4)}) for _ in range(2000)]
    assert distinct_experts(32, 128, 4) == pytest.approx(sum(draws) / len(draws), rel=0.01)
    assert distinct_experts(32, 128, 4) == pytest.approx(81.6, abs=0.1)
    assert spread_row_tokens(32, 128, 4) == pytest.approx(81.6 / 4, abs=0.05)
    # The roofline's balanced load is the same count.
    assert ExpertLoad(128, 4).busiest_rank(32)[1] == pytest.approx(distinct_experts(32, 128, 4))
    # One token touches its own k; thousands touch them all, as the spread rows do.
    assert spread_row_tokens(1, 128, 4) == pytest.approx(1.0)
    assert spread_row_tokens(4096, 128, 4) == pytest.approx(32.0)


def test_a_decode_batch_reads_only_the_experts_its_tokens_are_routed_to():
    # gpt-oss-120b on one B200 under vLLM: the database's MXFP4 MoE rows grow by one expert's weights a
    # token up to 32 tokens (all 128 experts), then stay flat. A 32-token decode is priced at the row
    # that touches as many experts as 32 random tokens do (20), below the 32-token row.
    from simulator.profiles.gpu_shapes import GpuShapes
    from simulator.profiles.kernel_db import KernelDatabase

    db = KernelDatabase.open("b200_sxm", "vllm", None)
    g = replace(GpuShapes.of(load_model_config("gpt-oss-120b"), 1), expert_quant="w4a16_mxfp4")

    def row(n: int) -> float:
        return db.moe(n, 2880, 2880, 4, 128, 1, 1, "w4a16_mxfp4")

    assert row(16) < row(32) == pytest.approx(row(64), rel=0.05)  # the table's shape this relies on
    assert g.experts_kernel(db, 32) == pytest.approx(row(20), rel=1e-6)
    assert g.experts_kernel(db, 32) < 0.75 * row(32)
    # Above 32 tokens the untouched experts' reads come off the flat row: 64 random tokens touch 111.
    assert g.experts_kernel(db, 64) == pytest.approx(row(64) - row(32) + row(28), rel=1e-6)
    assert row(32) * 0.8 < g.experts_kernel(db, 64) < row(64)
    # One token, and a prefill that touches every expert, are the rows themselves.
    for n in (1, 8192):
        assert g.experts_kernel(db, n) == pytest.approx(row(n), rel=1e-6)
    # A skewed load (--expert-imbalance) is the database's own power-law rows, taken as they are.
    skewed = replace(g, expert_load="power_law_1.01")
    assert skewed.experts_kernel(db, 32) == db.moe(32, 2880, 2880, 4, 128, 1, 1, "w4a16_mxfp4", "power_law_1.01")
