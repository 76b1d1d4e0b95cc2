"""`testbed replay --mode real`, run as a user runs it: in a subprocess, on a tiny model.

A real run writes the same run folder as a simulated one (files, table columns,
summary keys), its steps carry measured device intervals, and a bundled config runs
with dummy weights. Bad input (a folder without config.json, an unsupported
architecture or RoPE type, a folder without weights, --load-format auto without
weights) exits 2 with one line and no traceback; a request longer than the model's
context is recorded as rejected, with its reason, and the run completes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_clean_error
from engine_helpers import save_hf_model

from testbed.runs.folder import REQUESTS_FILE, RUN_FILE, STEPS_FILE, WALL_FILE, load_run
from testbed.traces.schema import Trace, TraceRequest

# Every test here starts `testbed replay` (most on the real engine) or waits on a module fixture
# that does: make test-fast leaves the file out.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "testbed.cli"]
CONTEXT = 256  # the model's max_position_embeddings
KV_TOKENS = "4096"  # not the default 1 GiB of CPU KV cache: a tiny model needs little
# benchmarks/gpu_check.sh runs this file on a GPU too, where a real run defaults to that GPU, overlap on.
DEFAULT_DEVICE = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
DEFAULT_OVERLAP = "on" if torch.cuda.is_available() else "off"


def _testbed(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], check=False, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert "Traceback" not in proc.stderr


def _trace() -> Trace:
    """Ten requests 10 ms apart; most share a 16-token block (radix hits); one is longer
    than the model's context."""
    reqs = [
        TraceRequest(arrival_s=0.01 * i, input_len=20 + 7 * i, output_len=3 + i, block_hashes=[1, 100 + i], block_size=16) for i in range(9)
    ]
    reqs.insert(4, TraceRequest(arrival_s=0.035, input_len=CONTEXT + 44, output_len=4, rid="too-long"))
    return Trace(reqs)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine-replay")
    model = root / "model"
    save_hf_model("qwen2", model, max_position_embeddings=CONTEXT)
    trace = root / "t.jsonl"
    _trace().write(trace)
    return root, model, trace


@pytest.fixture(scope="module")
def runs(setup):
    """The same trace, real then simulated, on the same model and KV pool."""
    root, model, trace = setup
    procs, folders = {}, {}
    for mode in ("real", "sim"):
        folders[mode] = root / f"run-{mode}"
        procs[mode] = _testbed("replay", trace, "--mode", mode, "--model", model, "--kv-tokens", KV_TOKENS, "--out", folders[mode], "-q")
    return procs, {mode: load_run(f) for mode, f in folders.items()}


def test_real_replay_exits_0_and_prints_the_summary(runs):
    procs, loaded = runs
    proc = procs["real"]
    _assert_ok(proc)
    assert "real engine:" in proc.stdout and "auto weights" in proc.stdout
    assert f", fcfs, overlap {DEFAULT_OVERLAP})" in proc.stdout and "(real, " in proc.stdout
    assert f" on {DEFAULT_DEVICE}, " in proc.stdout  # model on device
    assert "9 completed, 1 rejected, 0 unfinished" in proc.stdout
    for row in ("TTFT", "TPOT", "ITL", "E2E"):
        assert row in proc.stdout
    assert "run folder:" in proc.stdout
    r = loaded["real"]
    assert r.status == "complete"
    assert r.meta["mode"] == "real" and r.meta["load_format"] == "auto" and r.meta["attention_backend"] == "torch"
    assert r.summary["completed"] == 9 and r.summary["rejected"] == 1 and r.summary["kv_tokens"] == int(KV_TOKENS)


def test_real_and_sim_run_folders_have_the_same_schema(runs):
    procs, loaded = runs
    _assert_ok(procs["sim"])
    real, sim = loaded["real"], loaded["sim"]
    names = {p.name for p in real.path.iterdir()}
    assert names == {p.name for p in sim.path.iterdir()} == {RUN_FILE, REQUESTS_FILE, STEPS_FILE, WALL_FILE}
    assert list(real.requests.columns) == list(sim.requests.columns)
    assert dict(real.requests.dtypes) == dict(sim.requests.dtypes)
    assert list(real.steps.columns) == list(sim.steps.columns)
    assert dict(real.steps.dtypes) == dict(sim.steps.dtypes)
    assert set(real.summary) == set(sim.summary)
    common = {"status", "mode", "trace", "options", "model", "hardware", "scheduler", "versions", "summary"}
    assert common <= set(real.meta) and common <= set(sim.meta)
    assert set(real.meta["scheduler"]) == set(sim.meta["scheduler"])
    # The same requests, with the same fate and lengths (timing, hence cache hits, may differ).
    cols = ["rid", "input_tokens", "max_new_tokens", "output_tokens", "status"]
    assert real.requests[cols].equals(sim.requests[cols])


def test_real_steps_have_measured_device_intervals(runs):
    _, loaded = runs
    steps = loaded["real"].steps
    assert len(steps) > 0
    assert set(steps["mode"]) <= {"extend", "decode", "mixed"} and "decode" in set(steps["mode"])
    assert (steps["device_start"] <= steps["device_end"]).all()
    assert (steps["device_end"] > steps["device_start"]).any()  # wall-clock forwards take time
    # The forward runs after it is scheduled and finishes before its result is processed.
    assert (steps["schedule_end"] <= steps["device_start"]).all()
    assert (steps["device_end"] <= steps["process_start"]).all()
    assert (steps["process_start"] <= steps["process_end"]).all()
    assert steps["device_start"].is_monotonic_increasing
    # Prefix sharing of the trace reached the radix cache.
    assert steps["cache_hit_tokens"].sum() > 0


def test_request_longer_than_the_context_is_rejected_with_a_reason(runs):
    _, loaded = runs
    for mode in ("real", "sim"):
        df = loaded[mode].requests.set_index("rid")
        row = df.loc["too-long"]
        assert row["status"] == "rejected", mode
        assert "context length" in row["reason"] and str(CONTEXT) in row["reason"], row["reason"]
        assert row["output_tokens"] == 0
        others = df.drop(index="too-long")
        assert (others["status"] == "finished").all()
        assert (others["output_tokens"] == others["max_new_tokens"]).all()


def test_bundled_config_with_dummy_weights_runs(setup, tmp_path):
    _, _, trace = setup
    out = tmp_path / "run"
    proc = _testbed(
        "replay", trace, "--mode", "real", "--model", "tiny-llama", "--load-format", "dummy",
        "--no-overlap", "--kv-tokens", KV_TOKENS, "--out", out, "-q",
    )  # fmt: skip
    _assert_ok(proc)
    assert "dummy weights" in proc.stdout and f"(real, tiny-llama on {DEFAULT_DEVICE}, fcfs, overlap off)" in proc.stdout
    r = load_run(out)
    assert r.status == "complete" and r.meta["load_format"] == "dummy" and r.meta["model"] == "tiny-llama"
    # tiny-llama's context is 4096: the long request runs too.
    assert (r.requests["status"] == "finished").all() and len(r.requests) == 10
    assert (r.steps["device_start"] <= r.steps["device_end"]).all()


# --- bad input --------------------------------------------------------------------------------


def test_model_folder_without_config_json_exits_2(setup, tmp_path):
    _, _, trace = setup
    folder = tmp_path / "no-config"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    proc = _testbed("replay", trace, "--mode", "real", "--model", folder, "--out", tmp_path / "run", "-q")
    assert_clean_error(proc, "config.json")


def test_unsupported_architecture_exits_2_naming_it(setup, tmp_path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    _, _, trace = setup
    folder = tmp_path / "gpt2"
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=256)).save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["GPT2LMHeadModel"]
    proc = _testbed("replay", trace, "--mode", "real", "--model", folder, "--out", tmp_path / "run", "-q")
    assert_clean_error(proc, "GPT2LMHeadModel", "unsupported architecture")


def test_unsupported_rope_type_exits_2(setup, tmp_path):
    _, model, trace = setup
    folder = tmp_path / "yarn"
    folder.mkdir()
    cfg = json.loads((model / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0}
    cfg["rope_scaling"] = None
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "model.safetensors").symlink_to(model / "model.safetensors")
    proc = _testbed("replay", trace, "--mode", "real", "--model", folder, "--kv-tokens", KV_TOKENS, "--out", tmp_path / "run", "-q")
    assert_clean_error(proc, "yarn")


def test_model_folder_without_weights_exits_2(setup, tmp_path):
    _, model, trace = setup
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text((model / "config.json").read_text())
    proc = _testbed("replay", trace, "--mode", "real", "--model", folder, "--kv-tokens", KV_TOKENS, "--out", tmp_path / "run", "-q")
    assert_clean_error(proc, "safetensors", "--load-format dummy")


def test_load_format_auto_with_a_bundled_config_exits_2(setup, tmp_path):
    _, _, trace = setup
    proc = _testbed(
        "replay", trace, "--mode", "real", "--model", "tiny-llama", "--load-format", "auto",
        "--kv-tokens", KV_TOKENS, "--out", tmp_path / "run", "-q",
    )  # fmt: skip
    assert_clean_error(proc, "--load-format", "tiny-llama")
