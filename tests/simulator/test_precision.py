"""--quantization (fp8, fp8_block, nvfp4) and --kv-cache-dtype: what they cost, what they hold, and what a profile of
another precision says.

Real profiles from AIConfigurator's database (built here, a second or two each) and the roofline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error

from scheduler.core.forward_plan import ForwardMode
from scheduler.model_config import load_model_config
from simulator.costs.precision import Precision
from simulator.costs.roofline import RooflineCostModel
from simulator.costs.sources import load_profile
from simulator.hardware.kv_capacity import kv_capacity_tokens
from simulator.hardware.specs import load_hardware
from simulator.profiles.kernel_holdout import uniform_plan
from testbed.calibrate_kernels import calibrate_kernels, hbm_floor_s
from testbed.errors import ConfigError
from testbed.options import ReplayOptions
from testbed.replay import replay

REPO = Path(__file__).resolve().parents[2]
TRACE = str(REPO / "traces" / "a.json")
MODEL = "llama-3.1-8b"  # memory bound at batch 1: its linear weights are 87% of its bytes
# key -> (system, backend, --quantization, --kv-cache-dtype)
BUILDS = {
    "bf16": ("h100_sxm", "sglang", None, "auto"),
    "fp8": ("h100_sxm", "sglang", "fp8", "auto"),
    "kvfp8": ("h100_sxm", "sglang", None, "fp8"),
    "a100-kvfp8": ("a100_sxm", "sglang", None, "fp8"),
    "fp8_block": ("h200_sxm", "sglang", "fp8_block", "auto"),
    "b200-fp8": ("b200_sxm", "vllm", "fp8", "auto"),
    "nvfp4": ("b200_sxm", "vllm", "nvfp4", "auto"),
}


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for key, (system, backend, quantization, kv) in BUILDS.items():
        path = tmp_path_factory.mktemp("precision") / f"{key}.json"
        calibrate_kernels(system, backend, None, MODEL, 1, path, quantization=quantization, kv_cache_dtype=kv)
        out[key] = path
    return out


def read(profiles, key) -> dict:
    return json.loads(profiles[key].read_text())


def decode(cost_model, batch: int, context: int) -> float:
    return cost_model.forward_time(uniform_plan(ForwardMode.DECODE, batch, 1, context - 1))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True, cwd=REPO, timeout=300)


def test_a_profile_records_its_precision_and_the_tables_that_priced_it(profiles):
    p = read(profiles, "fp8")["precision"]
    assert (p["weights"], p["kv_cache"]) == ("fp8", "bfloat16")
    # Per-tensor fp8 (SGLang's --quantization fp8 on a bf16 checkpoint), not DeepSeek's block-scaled fp8.
    assert p["gemm"] == {"quant_mode": "fp8", "kernel": "sglang_sgl_kernel_fp8_scaled_mm"}
    assert p["lm_head"]["quant_mode"] == "bfloat16", "the engines leave the LM head unquantized"
    assert read(profiles, "bf16")["precision"]["gemm"]["quant_mode"] == "bfloat16"
    kv = read(profiles, "kvfp8")["precision"]
    assert kv["kv_cache_dtype"] == {"asked": "fp8", "priced_as": "fp8"}
    # SGLang's FA3 on Hopper attends in fp8 over an fp8 KV cache: the database's (fp8 KV, fp8 attention) rows.
    assert kv["prefill_attention"] == {"kv_cache": "fp8", "fmha": "fp8", "kernel": "fa3"}
    assert kv["decode_attention"]["kv_cache"] == "fp8"


def test_fp8_weights_make_decode_at_batch_1_and_large_prefill_gemms_cheaper(profiles):
    bf16, fp8 = load_profile(profiles["bf16"]), load_profile(profiles["fp8"])
    model = load_model_config(MODEL)
    bw = read(profiles, "bf16")["hardware_spec"]["mem_bandwidth"]
    floor_bf16, floor_fp8 = hbm_floor_s(model, 1, bw), hbm_floor_s(model, 1, bw, Precision("fp8"))
    assert 0.5 < floor_fp8 / floor_bf16 < 0.6, "about half the weight bytes (the embedding and LM head stay bf16)"
    t_bf16, t_fp8 = decode(bf16, 1, 1024), decode(fp8, 1, 1024)
    assert floor_fp8 < t_fp8 < 0.8 * t_bf16, (t_fp8, t_bf16)  # memory bound: most of the bytes saved
    # A large prefill: the layer GEMMs at 8192 tokens and more, compute bound, on fp8 tensor cores.
    k16, k8 = read(profiles, "bf16")["kernels"], read(profiles, "fp8")["kernels"]
    assert k16["tokens"] == k8["tokens"]
    for i, n in enumerate(k16["tokens"]):
        if n >= 8192:
            gemms = lambda k: sum(k["per_layer"][op][i] for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))  # noqa: E731
            assert gemms(k8) < 0.8 * gemms(k16), n
    assert k8["lm_head"] == k16["lm_head"]


def test_block_fp8_and_nvfp4_weights_are_priced_from_their_own_gemm_tables(profiles):
    """fp8_block: the database's 128x128-block-scaled fp8 GEMMs; nvfp4: its fp4 GEMMs of Blackwell, which
    beat fp8 on a large prefill (twice the tensor-core FLOPs) and at decode batch 1 (half the weight bytes)."""
    block = read(profiles, "fp8_block")["precision"]
    assert block["weights"] == "fp8_block" and block["gemm"]["quant_mode"] == "fp8_block"
    fp4 = read(profiles, "nvfp4")["precision"]
    assert fp4["weights"] == "nvfp4" and fp4["gemm"]["quant_mode"] == "nvfp4" and fp4["lm_head"]["quant_mode"] == "bfloat16"
    k8, k4 = read(profiles, "b200-fp8")["kernels"], read(profiles, "nvfp4")["kernels"]
    gemms = lambda k, i: sum(k["per_layer"][op][i] for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))  # noqa: E731
    i = k8["tokens"].index(16384)
    assert gemms(k4, k4["tokens"].index(16384)) < 0.8 * gemms(k8, i)
    assert decode(load_profile(profiles["nvfp4"]), 1, 1024) < decode(load_profile(profiles["b200-fp8"]), 1, 1024)
    model = load_model_config(MODEL)
    # 0.5625 bytes a linear weight against 1; the embedding and LM head (2.1 GB of its 9.1 at fp8) stay bf16.
    assert 0.6 < hbm_floor_s(model, 1, 1e12, Precision("nvfp4")) / hbm_floor_s(model, 1, 1e12, Precision("fp8")) < 0.7


@pytest.mark.slow
def test_nvfp4_weights_on_a_gpu_without_fp4_gemms_are_refused(tmp_path):
    proc = run_cli(
        "calibrate",
        "--source",
        "aiconfigurator",
        "--system",
        "h100_sxm",
        "--model",
        "qwen3-0.6b",
        "--quantization",
        "nvfp4",
        "--out",
        str(tmp_path / "p.json"),
        "-q",
    )
    assert_clean_error(proc, "--quantization nvfp4", "h100_sxm", "no fp4 tensor cores")
    assert not (tmp_path / "p.json").exists()


def test_fp8_kv_attention_is_priced_from_the_fp8_kv_tables(profiles):
    bf16, kv = read(profiles, "bf16")["kernels"], read(profiles, "kvfp8")["kernels"]
    assert kv["per_layer"] == bf16["per_layer"], "the GEMMs are the same"
    d16, d8 = bf16["decode_attention"], kv["decode_attention"]
    big = d16["batch"].index(256), d16["context"].index(8192)
    assert d8["seconds"][big[0]][big[1]] < 0.85 * d16["seconds"][big[0]][big[1]], "half the KV bytes to read"


@pytest.mark.slow
def test_a_system_without_fp8_kv_attention_tables_says_it_priced_bf16(profiles, tmp_path):
    p = read(profiles, "a100-kvfp8")["precision"]
    assert p["kv_cache"] == "fp8", "the pool still holds fp8: a replay asks for fp8"
    record = p["kv_cache_dtype"]
    assert (record["asked"], record["priced_as"]) == ("fp8", "bfloat16")
    assert "a100_sxm" in record["why"] and "no fp8-KV" in record["why"]
    assert p["prefill_attention"]["kv_cache"] == p["decode_attention"]["kv_cache"] == "bfloat16"
    # calibrate says it in one line.
    proc = run_cli(
        "calibrate",
        "--source",
        "aiconfigurator",
        "--system",
        "a100_sxm",
        "--model",
        "qwen3-0.6b",
        "--kv-cache-dtype",
        "fp8",
        "--out",
        str(tmp_path / "p.json"),
        "-q",
    )
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stdout.splitlines() if "--kv-cache-dtype fp8" in line]
    assert len(said) == 1 and "priced as bfloat16" in said[0] and "no fp8-KV" in said[0], proc.stdout


@pytest.mark.slow
def test_fp8_weights_on_a_gpu_without_fp8_gemms_are_refused(tmp_path):
    proc = run_cli(
        "calibrate",
        "--source",
        "aiconfigurator",
        "--system",
        "a100_sxm",
        "--model",
        "qwen3-0.6b",
        "--quantization",
        "fp8",
        "--out",
        str(tmp_path / "p.json"),
        "-q",
    )
    assert_clean_error(proc, "--quantization fp8", "a100_sxm", "no fp8 tensor cores")
    assert not (tmp_path / "p.json").exists()


@pytest.mark.slow
def test_the_kv_pool_from_memory_holds_more_with_fp8_weights_and_twice_with_fp8_kv(profiles, tmp_path):
    tokens = {}
    for key, options in (("bf16", {}), ("fp8", {"quantization": "fp8"}), ("kvfp8", {"kv_cache_dtype": "fp8"})):
        out = tmp_path / key
        result = replay(TRACE, ReplayOptions(model=MODEL, profile=str(profiles[key]), max_requests=20, **options), out=out)
        assert result.status == "complete"
        meta = json.loads((out / "run.json").read_text())
        assert meta["options"]["quantization"] == options.get("quantization")
        tokens[key] = meta["summary"]["kv_tokens"]
    assert tokens["fp8"] > 1.1 * tokens["bf16"]  # 7 GB of weights less: 13% more KV on an 80 GB H100
    assert abs(tokens["kvfp8"] - 2 * tokens["bf16"]) <= 1
    # The roofline's pool (no profile) the same way; --page-size rounds it down.
    model, hw = load_model_config(MODEL), load_hardware("h100")
    bf16 = kv_capacity_tokens(model, hw, 0.83)
    assert kv_capacity_tokens(model, hw, 0.83, precision=Precision("fp8", "fp8")) > 2 * bf16
    assert abs(kv_capacity_tokens(model, hw, 0.83, precision=Precision("bfloat16", "fp8")) - 2 * bf16) <= 1


def test_the_roofline_reads_fp8_weights_at_1_byte_and_runs_them_at_the_fp8_peak():
    model = load_model_config(MODEL)
    h100, a100 = load_hardware("h100"), load_hardware("a100")
    assert h100.peak_flops_fp8 == 1979e12 and load_hardware("h200").peak_flops_fp8 == 1979e12 and a100.peak_flops_fp8 == 0
    assert load_hardware("h100_sxm").peak_flops_fp8 > 0 and load_hardware("a100_sxm").peak_flops_fp8 == 0
    prefill = uniform_plan(ForwardMode.EXTEND, 1, 8192, 0)
    for hw in (h100, a100):
        bf16, fp8 = RooflineCostModel(model, hw), RooflineCostModel(model, hw, precision=Precision("fp8"))
        assert decode(fp8, 1, 1024) < 0.65 * decode(bf16, 1, 1024)
        if hw.peak_flops_fp8:
            assert fp8.forward_time(prefill) < 0.7 * bf16.forward_time(prefill)
        else:  # no fp8 tensor cores: the engines dequantize into bf16 GEMMs
            assert fp8.forward_time(prefill) == bf16.forward_time(prefill)
    kv = RooflineCostModel(model, h100, precision=Precision("bfloat16", "fp8"))
    assert decode(kv, 64, 8192) < decode(RooflineCostModel(model, h100), 64, 8192)
    assert kv.name.endswith(",fp8-kv")
    # NVFP4 at 0.5625 bytes a weight, on Blackwell's fp4 tensor cores; weight-only (bf16 GEMMs) without them.
    b200 = load_hardware("b200_sxm")
    assert b200.peak_flops_fp4 == 2 * b200.peak_flops_fp8 and h100.peak_flops_fp4 == 0
    fp4, fp8 = (RooflineCostModel(model, b200, precision=Precision(w)) for w in ("nvfp4", "fp8"))
    assert fp4.forward_time(prefill) < 0.7 * fp8.forward_time(prefill) and decode(fp4, 1, 1024) < 0.7 * decode(fp8, 1, 1024)
    assert fp4.name.endswith(",nvfp4-weights")
    on_hopper = RooflineCostModel(model, h100, precision=Precision("nvfp4"))
    assert on_hopper.forward_time(prefill) == RooflineCostModel(model, h100).forward_time(prefill)


@pytest.mark.slow
def test_a_profile_of_another_precision_is_refused_naming_both(profiles, tmp_path):
    with pytest.raises(ConfigError, match="built for fp8 weights and bfloat16 KV cache, not bfloat16 weights and bfloat16 KV cache"):
        replay(TRACE, ReplayOptions(model=MODEL, profile=str(profiles["fp8"])), out=tmp_path / "a")
    proc = run_cli(
        "replay", TRACE, "--model", MODEL, "--profile", str(profiles["bf16"]), "--kv-cache-dtype", "fp8", "--out", str(tmp_path / "b"), "-q"
    )
    assert_clean_error(proc, "built for bfloat16 weights and bfloat16 KV cache", "not bfloat16 weights and fp8 KV cache")
    # The shipped profiles, made before these options, are bf16.
    proc = run_cli(
        "replay",
        TRACE,
        "--profile",
        "profiles/h100_sxm-sglang-llama-3.1-8b-tp1.json",
        "--quantization",
        "fp8",
        "--out",
        str(tmp_path / "c"),
        "-q",
    )
    assert_clean_error(proc, "built for bfloat16 weights", "not fp8 weights")
    # A profile of this project's engine runs the model's dtype.
    proc = run_cli(
        "replay",
        TRACE,
        "--model",
        "tiny-llama",
        "--profile",
        "profiles/cpu-tiny-llama.json",
        "--quantization",
        "fp8",
        "--out",
        str(tmp_path / "d"),
        "-q",
    )
    assert_clean_error(proc, "this project's engine", "fp8 weights")


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, needles",
    [
        (["replay", TRACE, "--quantization", "int4"], ["--quantization", "int4", "fp8"]),
        (["replay", TRACE, "--kv-cache-dtype", "fp16"], ["--kv-cache-dtype", "fp16", "auto", "bf16", "fp8"]),
        (["replay", TRACE, "--mode", "real", "--quantization", "fp8"], ["--quantization fp8", "--mode sim"]),
        (["calibrate", "--source", "aiconfigurator", "--system", "h100_sxm", "--quantization", "fp4"], ["--quantization", "fp4", "nvfp4"]),
        (["calibrate", "--source", "aiconfigurator", "--system", "h100_sxm", "--kv-cache-dtype", "int8"], ["--kv-cache-dtype", "int8"]),
        (["calibrate", "--kv-cache-dtype", "fp8"], ["--source aiconfigurator"]),
        (["sweep", TRACE, "--grid", "kv-cache-dtype=auto,fp9"], ["kv-cache-dtype", "fp9"]),
    ],
)
def test_an_unknown_or_misplaced_value_is_one_line_exit_2(tmp_path, args, needles):
    assert_clean_error(run_cli(*args, "--out", str(tmp_path / "out"), "-q"), *needles)


@pytest.mark.slow
def test_a_sweep_takes_them_as_axes(tmp_path):
    out = tmp_path / "sweep"
    proc = run_cli(
        "sweep",
        TRACE,
        "--max-requests",
        "10",
        "--grid",
        "kv-cache-dtype=auto,fp8",
        "--grid",
        "quantization=none,fp8",
        "--workers",
        "1",
        "--out",
        str(out),
        "-q",
    )
    assert proc.returncode == 0, proc.stderr
    kv = {}
    for run in (out / "points").iterdir():
        meta = json.loads((run / "run.json").read_text())
        kv[(meta["options"]["kv_cache_dtype"], meta["options"]["quantization"])] = meta["summary"]["kv_tokens"]
    assert len(kv) == 4
    assert kv[("fp8", None)] == pytest.approx(2 * kv[("auto", None)], abs=1)
    assert kv[("auto", "fp8")] > kv[("auto", None)] and kv[("fp8", "fp8")] > kv[("fp8", None)]
