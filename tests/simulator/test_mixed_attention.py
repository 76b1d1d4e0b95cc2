"""Decode rows beside a prefill chunk, priced from a GPU's measured mixed batches.

LLMServingSim's kernel timings of the RTX PRO 6000 under vLLM 0.19 (../shared/ground_truth/ops-*) hold
one layer's attention for prefill chunks alone, decode batches alone, and both in one forward. A kernel
profile built with them (testbed calibrate --source aiconfigurator --mixed-attention) charges the decode
rows of a mixed forward what those rows cost there; profiles without them price the parts as before.
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error

from scheduler.core.forward_plan import ForwardMode, ForwardPlan
from simulator.costs.kernel_cost import KernelProfileCostModel
from simulator.costs.llmservingsim_attention import AttentionTimingsError
from simulator.costs.mixed_attention import from_llmservingsim
from simulator.profiles.kernel_holdout import uniform_plan
from simulator.profiles.kernel_profile import build_kernel_profile

REPO = Path(__file__).resolve().parents[2]
TIMINGS = REPO.parent / "shared" / "ground_truth" / "ops-rtxpro6000-llama-3.1-8b" / "attention.csv"


def measured(pc: int, kp: int, nd: int, kd: int) -> float:
    with open(TIMINGS, newline="") as f:
        for row in csv.DictReader(f):
            if (int(row["prefill_chunk"]), int(row["kv_prefill"]), int(row["n_decode"]), int(row["kv_decode"])) == (pc, kp, nd, kd):
                return float(row["time_us"])
    raise KeyError((pc, kp, nd, kd))


def mixed_plan(chunk: int, decodes: int, context: int) -> ForwardPlan:
    """One prefill chunk of `chunk` new tokens beside `decodes` requests of `context` tokens."""
    prefix_lens, extend_lens = [0] + [context - 1] * decodes, [chunk] + [1] * decodes
    n, sum_seq, sum_prefix, pairs, longest = ForwardPlan.summarize(prefix_lens, extend_lens)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    return ForwardPlan(
        mode=ForwardMode.MIXED,
        req_pool_indices=list(range(decodes + 1)),
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        seq_lens=seq_lens,
        sampling=[],
        sample=[True] * (decodes + 1),
        out_cache_loc=None,
        num_tokens=n,
        sum_seq_len=sum_seq,
        sum_prefix_len=sum_prefix,
        attention_pairs=pairs,
        max_seq_len=longest,
    )


@pytest.fixture(scope="module")
def profiles() -> tuple[KernelProfileCostModel, KernelProfileCostModel]:
    plain = build_kernel_profile("rtx_pro_6000_server", "vllm", None, "llama-3.1-8b", 1)
    mixed = build_kernel_profile("rtx_pro_6000_server", "vllm", None, "llama-3.1-8b", 1, mixed_attention=TIMINGS)
    return KernelProfileCostModel(plain), KernelProfileCostModel(mixed)


def test_the_factor_is_what_the_measured_mixed_batches_say():
    factor = from_llmservingsim(TIMINGS)
    # 64 decodes of 4,096 tokens: each mixed row less its prefill chunk alone, over the decodes alone.
    alone = measured(0, 0, 64, 4096)
    rows = [(measured(pc, kp, 64, 4096) - measured(pc, kp, 0, 0)) / alone for pc, kp in ((16, 0), (256, 1024), (2048, 0))]
    assert factor(64, 4096) == pytest.approx(statistics.median(rows), rel=0.15)
    assert 1.5 < factor(64, 4096) < 2.3  # the varlen prefill path: no split-KV for the decode rows
    assert factor(1, 16) < 0.3  # one short decode hides inside the prefill kernel's time


def test_a_mixed_forward_charges_its_decode_rows_the_measured_factor_and_nothing_else_changes(profiles):
    plain, mixed = profiles
    for plan in (uniform_plan(ForwardMode.DECODE, 64, 1, 4095), uniform_plan(ForwardMode.EXTEND, 1, 2048, 0)):
        assert mixed.forward_time(plan) == plain.forward_time(plan)
    plan = mixed_plan(512, 64, 4096)
    decode_rows = plain.decode(64, 4096)
    extra = mixed.forward_time(plan) - plain.forward_time(plan)
    assert extra == pytest.approx(decode_rows * (mixed.mixed_decode(64, 4096) - 1), rel=1e-9)
    assert extra > 0.5 * decode_rows


@pytest.mark.slow
def test_calibrate_records_the_factor_and_refuses_a_file_that_is_not_mixed_timings(tmp_path):
    out = tmp_path / "p.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed.cli",
            "calibrate",
            "--source",
            "aiconfigurator",
            "--system",
            "rtx_pro_6000_server",
            "--backend",
            "vllm",
            "--model",
            "llama-3.1-8b",
            "--mixed-attention",
            str(TIMINGS),
            "--out",
            str(out),
            "-q",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "decode rows beside a prefill chunk" in proc.stdout and "x at 64 of 4,096" in proc.stdout
    assert json.loads(out.read_text())["kernels"]["mixed_decode_factor"]["source"] == str(TIMINGS)
    bad = tmp_path / "dense.csv"
    bad.write_text("layer,tokens,time_us\nqkv_proj,1,3.0\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed.cli",
            "calibrate",
            "--source",
            "aiconfigurator",
            "--system",
            "rtx_pro_6000_server",
            "--backend",
            "vllm",
            "--mixed-attention",
            str(bad),
            "--out",
            str(tmp_path / "q.json"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert_clean_error(proc, str(bad), "prefill_chunk")
    with pytest.raises(AttentionTimingsError, match="no column"):
        from_llmservingsim(bad)
