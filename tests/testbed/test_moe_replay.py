"""`testbed replay` of a mixture of experts, as a user runs it: the bundled MoE and MLA
models simulate end to end, --ep / --dp / --expert-imbalance reach the cost model and run.json
(only where set, so every other run's run.json is as before), and bad input is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error

from testbed.options import ReplayOptions, parse_option_value, recorded_options

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "testbed.cli", "replay", "traces/a.json", "--mode", "sim", "--max-requests", "30", "-q"]


def _replay(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "run"
    proc = subprocess.run([*CLI, *map(str, args), "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    meta = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else None
    return proc, meta


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, cost_model",
    [
        (("--model", "qwen3-30b-a3b", "--hardware", "h100"), "roofline:qwen3-30b-a3b@h100"),
        (("--model", "mixtral-8x7b", "--tp", "2"), "roofline:mixtral-8x7b@h100,tp2"),
        (("--model", "deepseek-v3", "--tp", "8", "--hardware", "h200"), "roofline:deepseek-v3@h200,tp8,fp8_block-weights"),
        (
            (
                "--model",
                "deepseek-r1",
                "--dp",
                "8",
                "--enable-dp-attention",
                "--ep",
                "8",
                "--hardware",
                "h200",
                "--expert-imbalance",
                "1.01",
            ),
            "roofline:deepseek-r1@h200,dp8,ep8,fp8_block-weights,imbalance1.01",
        ),
        (("--model", "gpt-oss-120b"), "roofline:gpt-oss-120b@h100,mxfp4-expert-weights"),
    ],
)
def test_a_moe_model_replays_end_to_end(tmp_path, args, cost_model):
    proc, meta = _replay(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    assert meta["cost_model"] == cost_model
    assert meta["summary"]["completed"] == 30
    recorded = meta["options"]
    if "--dp" in args:
        assert (recorded["ep"], recorded["dp"], recorded["enable_dp_attention"], recorded["expert_imbalance"]) == (8, 8, True, 1.01)
        assert meta["scheduler"]["kv_tokens"] % 8 == 0  # eight ranks' pools together
    else:
        assert (recorded["ep"], recorded["dp"], recorded["enable_dp_attention"], recorded["expert_imbalance"]) == (1, 1, False, None)


@pytest.mark.parametrize(
    "args, needles",
    [
        (("--model", "qwen3-30b-a3b", "--ep", "3"), ("--ep 3 does not divide", "128 experts")),
        (("--model", "qwen3-30b-a3b", "--tp", "2", "--ep", "4"), ("--ep 4 does not divide the 2 GPUs",)),
        (("--model", "qwen3-30b-a3b", "--dp", "2"), ("--enable-dp-attention",)),
        (("--model", "llama-3.1-8b", "--ep", "2"), ("dense model",)),
        (("--model", "llama-3.1-8b", "--expert-imbalance", "1.01"), ("dense model",)),
        (("--model", "qwen3-30b-a3b", "--ep", "0"), ("--ep",)),
        (("--model", "qwen3-30b-a3b", "--expert-imbalance", "-1"), ("--expert-imbalance",)),
        (("--model", "qwen3-235b-a22b"), ("does not fit on 'h100'",)),
        (("--model", "deepseek-v3", "--mode", "real"), ("--mode real", "multi-head latent attention", "--mode sim")),
        (("--model", "deepseek-v3", "--mode", "real", "--ep", "2"), ("for --mode sim",)),
    ],
)
def test_bad_parallelism_is_one_line_exit_2(tmp_path, args, needles):
    proc, _ = _replay(tmp_path, *args)
    assert_clean_error(proc, *needles)


def test_the_moe_options_are_recorded_and_sweep_as_axes():
    rec = recorded_options(ReplayOptions(ep=4, expert_imbalance=1.2))
    assert rec["ep"] == 4 and rec["expert_imbalance"] == 1.2 and rec["dp"] == 1 and rec["enable_dp_attention"] is False
    assert parse_option_value("ep", "8") == 8 and parse_option_value("expert_imbalance", "1.01") == 1.01
    assert parse_option_value("enable_dp_attention", "on") is True and parse_option_value("expert_imbalance", "none") is None


def test_vllms_limits_are_each_dp_ranks_and_sglangs_the_servers():
    # vLLM runs an engine core per DP rank, each under --max-num-seqs and --max-num-batched-tokens: the
    # one scheduler standing for the ranks takes dp times them. SGLang divides its limits over the ranks.
    from scheduler.model_config import load_model_config
    from testbed.schedulers import scheduler_kind

    model = load_model_config("qwen3-30b-a3b")
    for dp in (1, 4):
        opts = ReplayOptions(scheduler="vllm", model="qwen3-30b-a3b", dp=dp, enable_dp_attention=dp > 1, max_num_seqs=64)
        kind = scheduler_kind("vllm")
        cfg = kind.config(kind.with_defaults(opts), model, 100_000)
        assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (64 * dp, 8192 * dp)
        sglang = ReplayOptions(model="qwen3-30b-a3b", dp=dp, enable_dp_attention=dp > 1, max_running_requests=64, chunked_prefill_size=4096)
        kind = scheduler_kind("sglang")
        cfg = kind.config(kind.with_defaults(sglang), model, 100_000)
        assert (cfg.max_running_requests, cfg.chunked_prefill_size) == (64, 4096)
