"""`testbed replay --mode real` of a mixture of experts, as a user runs it: the bundled
tiny-qwen3-moe on dummy weights and a Mixtral folder with weights run end to end and write a run
folder with TTFT and TPOT; a model the engine cannot build (DeepSeek's MLA, gpt-oss's sinks) or
whose weights cannot fit the device exits 2 with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_clean_error
from engine_helpers import TINY

from testbed.runs.folder import load_run
from testbed.traces.schema import Trace, TraceRequest

# Every test here starts `testbed replay`: make test-fast leaves the file out.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "testbed.cli"]
DEFAULT_DEVICE = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def _testbed(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], check=False, cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    """Eight requests 10 ms apart, sharing a 16-token block."""
    path = tmp_path_factory.mktemp("moe-replay") / "t.jsonl"
    reqs = [
        TraceRequest(arrival_s=0.01 * i, input_len=20 + 9 * i, output_len=4 + i, block_hashes=[1, 100 + i], block_size=16) for i in range(8)
    ]
    Trace(reqs).write(path)
    return path


def _assert_real_run(proc: subprocess.CompletedProcess, out: Path, model: str, load_format: str) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert "Traceback" not in proc.stderr
    assert f"(real, {model} on {DEFAULT_DEVICE}, " in proc.stdout and f"{load_format} weights" in proc.stdout
    assert "TTFT" in proc.stdout and "TPOT" in proc.stdout
    r = load_run(out)
    assert r.status == "complete" and r.meta["mode"] == "real" and r.meta["model"] == model
    assert r.meta["load_format"] == load_format
    assert (r.requests["status"] == "finished").all() and len(r.requests) == 8
    assert (r.requests["output_tokens"] == r.requests["max_new_tokens"]).all()
    assert r.summary["completed"] == 8 and r.summary["mean_ttft_ms"] > 0 and r.summary["mean_tpot_ms"] > 0
    assert "decode" in set(r.steps["mode"]) and (r.steps["device_start"] <= r.steps["device_end"]).all()


def test_bundled_tiny_qwen3_moe_runs_on_dummy_weights(trace, tmp_path):
    out = tmp_path / "run"
    proc = _testbed(
        "replay", trace, "--mode", "real", "--model", "tiny-qwen3-moe", "--load-format", "dummy", "--kv-tokens", "4096", "--out", out, "-q"
    )
    _assert_real_run(proc, out, "tiny-qwen3-moe", "dummy")


def test_a_mixtral_folder_runs_on_its_weights(trace, tmp_path):
    from transformers import AutoModelForCausalLM, MixtralConfig

    model = tmp_path / "tiny-mixtral"
    torch.manual_seed(0)
    cfg = MixtralConfig(**TINY | {"intermediate_size": 48}, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(model)
    out = tmp_path / "run"
    proc = _testbed("replay", trace, "--mode", "real", "--model", model, "--kv-tokens", "4096", "--out", out, "-q")
    _assert_real_run(proc, out, "tiny-mixtral", "auto")


@pytest.mark.parametrize(
    "model, needles",
    [
        ("deepseek-v3", ("--mode real", "deepseek-v3 (DeepseekV3ForCausalLM)", "multi-head latent attention", "--mode sim")),
        ("gpt-oss-120b", ("--mode real", "attention sinks", "--mode sim")),
        # Built on any machine, it would take 470 GB of bf16 weights: refused before any allocation.
        ("qwen3-235b-a22b", ("qwen3-235b-a22b's weights take", "GiB", "free on")),
    ],
)
def test_a_model_the_engine_cannot_run_exits_2_in_one_line(trace, tmp_path, model, needles):
    proc = _testbed("replay", trace, "--mode", "real", "--model", model, "--out", tmp_path / "run", "-q")
    assert_clean_error(proc, *needles)
