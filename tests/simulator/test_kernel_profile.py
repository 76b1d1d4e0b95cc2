"""Kernel profiles from AIConfigurator's database: real queries, profiles built here, priced and replayed."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error

from scheduler.core.forward_plan import ForwardMode, ForwardPlan
from scheduler.model_config import load_model_config
from scheduler.sglang.server_defaults import default_chunked_prefill_size, default_mem_fraction_static
from simulator.costs.cuda_graphs import sglang_graphs, vllm_graphs
from simulator.costs.kernel_cost import KernelProfileCostModel
from simulator.costs.profile_cost import ProfileError
from simulator.costs.sources import load_profile
from simulator.hardware.kv_capacity import kv_capacity_tokens
from simulator.hardware.specs import load_hardware
from simulator.profiles.kernel_catalog import system_spec
from simulator.profiles.kernel_holdout import uniform_plan
from testbed.calibrate_kernels import calibrate_kernels, hbm_floor_s, profile_precision
from testbed.errors import ConfigError
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.traces.schema import Trace, TraceRequest

REPO = Path(__file__).resolve().parents[2]
MODEL = "qwen3-0.6b"  # small, and with Qwen3's q/k norm and tied embeddings
BUILDS = {"h100-tp1": ("h100_sxm", "sglang", 1), "h100-tp2": ("h100_sxm", "sglang", 2), "rtx-tp1": ("rtx_pro_6000_server", "vllm", 1)}


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for key, (system, backend, tp) in BUILDS.items():
        path = tmp_path_factory.mktemp("kernels") / f"{key}.json"
        phases = []
        calibrate_kernels(system, backend, None, MODEL, tp, path, progress=lambda phase, done, total: phases.append(phase))
        assert {"dense", "prefill attention", "decode attention"} <= set(phases), "progress is reported for every phase"
        out[key] = path
    return out


def cost(profiles, key) -> KernelProfileCostModel:
    model = load_profile(profiles[key])
    assert isinstance(model, KernelProfileCostModel)
    return model


def decode(cost_model, batch: int, context: int) -> float:
    return cost_model.forward_time(uniform_plan(ForwardMode.DECODE, batch, 1, context - 1))


def extend(cost_model, batch: int, new_tokens: int, prefix: int = 0) -> float:
    return cost_model.forward_time(uniform_plan(ForwardMode.EXTEND, batch, new_tokens, prefix))


def test_a_profile_records_its_source_and_is_small(profiles):
    p = json.loads(profiles["h100-tp2"].read_text())
    assert (p["source"], p["model"], p["tp"], p["hardware"]) == ("aiconfigurator", MODEL, 2, "h100_sxm")
    db = p["database"]
    assert db["system"] == "h100_sxm" and db["backend"] == "sglang" and db["backend_version"] and db["package_version"]
    assert p["hardware_spec"]["memory_bytes"] == system_spec("h100_sxm")["gpu"]["mem_capacity"]
    assert profiles["h100-tp2"].stat().st_size < 60_000
    # Every forward kind's table is there, for one layer, in seconds.
    k = p["kernels"]
    assert k["layers"] == load_model_config(MODEL).num_hidden_layers
    assert set(k["per_layer"]) >= {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "all_reduce"}
    assert min(k["per_layer"]["all_reduce"]) > 0, "TP 2 pays for its all-reduces"
    assert max(json.loads(profiles["h100-tp1"].read_text())["kernels"]["per_layer"]["all_reduce"]) == 0


def test_held_out_measurements_are_close(profiles):
    """At measured shapes the (half-grid) profile did not use, a forward is within a few percent of the database."""
    for key in BUILDS:
        h = json.loads(profiles[key].read_text())["holdout"]
        for kind in ("extend", "decode"):
            assert h[kind]["points"] >= 20, (key, kind)
            assert h[kind]["median_rel_err"] < 0.05 and h[kind]["p90_rel_err"] < 0.15, (key, kind, h[kind])


def test_decode_at_batch_1_is_not_faster_than_reading_the_weights(profiles):
    model = load_model_config(MODEL)
    for key, (system, _, tp) in BUILDS.items():
        floor = hbm_floor_s(model, tp, system_spec(system)["gpu"]["mem_bw"])
        t = decode(cost(profiles, key), 1, 256)
        assert floor <= t < 20 * floor, (key, t, floor)


def test_times_grow_with_tokens_batch_prefix_and_context(profiles):
    for key in BUILDS:
        c = cost(profiles, key)
        tokens = [extend(c, 1, n) for n in (1, 16, 100, 512, 2000, 4096, 10000, 50000)]
        assert tokens == sorted(tokens) and tokens[-1] > 20 * tokens[0]
        prefix = [extend(c, 1, 512, p) for p in (0, 100, 1000, 5000, 30000)]
        assert prefix == sorted(prefix) and prefix[-1] > prefix[0]
        batch = [extend(c, b, 256) for b in (1, 3, 8, 30)]
        assert batch == sorted(batch) and batch[-1] > batch[0]
        by_batch = [decode(c, b, 1000) for b in (1, 8, 33, 100, 256, 1000)]
        assert by_batch == sorted(by_batch) and by_batch[-1] > by_batch[0]
        by_context = [decode(c, 64, s) for s in (10, 300, 2000, 9000, 40000)]
        assert by_context == sorted(by_context) and by_context[-1] > 2 * by_context[0]


def test_a_ragged_decode_batch_is_priced_by_its_mean_context(profiles):
    c = cost(profiles, "h100-tp1")
    lens = [100, 300, 2000, 5000]
    ragged = mixed_plan(ForwardMode.DECODE, [s - 1 for s in lens], [1] * 4)
    assert c.forward_time(ragged) == pytest.approx(decode(c, 4, sum(lens) / 4))


def mixed_plan(mode: ForwardMode, prefix_lens: list[int], extend_lens: list[int]) -> ForwardPlan:
    n, sum_seq, sum_prefix, pairs, longest = ForwardPlan.summarize(prefix_lens, extend_lens)
    b = len(prefix_lens)
    return ForwardPlan(
        mode=mode,
        req_pool_indices=list(range(b)),
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        seq_lens=[p + e for p, e in zip(prefix_lens, extend_lens)],
        sampling=[],
        sample=[True] * b,
        out_cache_loc=None,
        num_tokens=n,
        sum_seq_len=sum_seq,
        sum_prefix_len=sum_prefix,
        attention_pairs=pairs,
        max_seq_len=longest,
    )


def test_a_mixed_batch_prices_its_chunk_and_its_decodes(profiles):
    """GEMMs over all tokens once; prefill attention for the chunk, decode attention for the rest."""
    c = cost(profiles, "rtx-tp1")
    chunk, decodes = (1024, 512), [(700, 1)] * 20  # a chunk of 512 over 1024 cached, 20 decodes at 701
    mixed = c.forward_time(mixed_plan(ForwardMode.MIXED, [chunk[0]] + [p for p, _ in decodes], [chunk[1]] + [e for _, e in decodes]))
    chunk_alone = extend(c, 1, 512, 1024)
    decodes_alone = decode(c, 20, 701)
    assert max(chunk_alone, decodes_alone) < mixed < chunk_alone + decodes_alone
    # Its parts are exactly the tables' prices.
    parts = c.dense(532) + c.lm_head(21) + c.prefill(1, 512, 512 * (1024 + 513 / 2)) + c.decode(20, 701)
    assert mixed == pytest.approx(parts)


def test_a_forward_outside_a_cuda_graph_waits_for_the_hosts_dispatch(profiles):
    """vLLM runs forwards of more tokens than its largest CUDA graph eagerly (its AIConfigurator model:
    0.8 ms a layer of dispatch); SGLang runs every extend eagerly, with no such term on a dense model.
    The host dispatches while the GPU computes: an eager forward takes the longer of the two."""
    layers = load_model_config(MODEL).num_hidden_layers
    vllm = json.loads(profiles["rtx-tp1"].read_text())
    assert vllm["kernels"]["eager_overhead_s"] == pytest.approx(0.8e-3 * layers)
    assert json.loads(profiles["h100-tp1"].read_text())["kernels"]["eager_overhead_s"] == 0
    graphs = vllm_graphs(max_num_seqs=128)  # graphs up to 256 tokens
    model = load_profile(profiles["rtx-tp1"], graphs=graphs)
    small, large = uniform_plan(ForwardMode.EXTEND, 1, 256, 0), uniform_plan(ForwardMode.EXTEND, 1, 257, 0)
    assert model.forward_time(small) == model.kernel_time(small)
    dispatch = 0.8e-3 * layers
    assert model.kernel_time(large) < dispatch  # a 257-token forward: the host is the bottleneck
    assert model.forward_time(large) == pytest.approx(dispatch)
    huge = uniform_plan(ForwardMode.EXTEND, 1, 16384, 0)
    assert model.kernel_time(huge) > dispatch  # a long prefill hides the dispatch entirely
    assert model.forward_time(huge) == model.kernel_time(huge)
    decode_batch = uniform_plan(ForwardMode.DECODE, 200, 1, 1000)
    assert model.forward_time(decode_batch) == model.kernel_time(decode_batch)
    # SGLang's rule on the same kernels: every extend is eager, decodes are captured.
    sglang = load_profile(profiles["rtx-tp1"], graphs=sglang_graphs(256))
    assert sglang.forward_time(small) > sglang.kernel_time(small)
    assert sglang.forward_time(decode_batch) == sglang.kernel_time(decode_batch)
    # Without a rule (pricing kernels alone) nothing is added.
    assert load_profile(profiles["rtx-tp1"]).forward_time(large) == model.kernel_time(large)


def test_vllms_capture_size_and_cudagraph_mode_decide_which_forwards_wait_for_the_host(profiles, tmp_path):
    """--max-cudagraph-capture-size 2048 (InferenceMAX's MiniMax recipes) puts a 1,024-token prefill
    in a graph; FULL_DECODE_ONLY (its Llama-3.1-70B B200 recipes) leaves every prefill eager, NONE
    every forward; and a replay with the flag gives the prefill's first tokens earlier."""
    dispatch = 0.8e-3 * load_model_config(MODEL).num_hidden_layers
    prefill, decode_batch = uniform_plan(ForwardMode.EXTEND, 1, 1024, 0), uniform_plan(ForwardMode.DECODE, 64, 1, 1000)

    def priced(**graphs):
        return load_profile(profiles["rtx-tp1"], graphs=vllm_graphs(max_num_seqs=1024, **graphs))

    assert priced().forward_time(prefill) == pytest.approx(max(dispatch, priced().kernel_time(prefill)))  # default: 512
    assert priced(max_capture_size=2048).forward_time(prefill) == priced().kernel_time(prefill)
    decode_only = priced(max_capture_size=2048, mode="FULL_DECODE_ONLY")
    assert decode_only.forward_time(prefill) > decode_only.kernel_time(prefill)
    assert decode_only.forward_time(decode_batch) == decode_only.kernel_time(decode_batch)
    assert priced(mode="NONE").forward_time(decode_batch) > priced().kernel_time(decode_batch)
    trace = tmp_path / "t.jsonl"
    Trace([TraceRequest(k * 0.5, 1000, 4, rid=f"r{k}") for k in range(4)]).write(trace)  # one prefill at a time
    ttft = {}
    for size in (None, 2048):
        opts = ReplayOptions(model=MODEL, scheduler="vllm", profile=str(profiles["rtx-tp1"]), max_cudagraph_capture_size=size)
        ttft[size] = replay(str(trace), opts, out=tmp_path / f"run-{size}").summary["mean_ttft_ms"]
    assert ttft[2048] < ttft[None]


def test_a_decode_stretch_priced_at_once_gives_the_floats_of_its_steps_priced_one_by_one(profiles):
    """decode_forward_times (a stretch's steps in bulk) against forward_time on each step's plan:
    equal floats, inside the tables and past them, in a graph and outside one (the host's dispatch)."""
    for graphs in (None, vllm_graphs(max_num_seqs=1024), vllm_graphs(max_num_seqs=4), vllm_graphs(8, mode="NONE")):
        model = load_profile(profiles["rtx-tp1"], graphs=graphs)
        for b, sum_prefix in ((1, 0), (3, 3 * 7), (64, 64 * 900), (257, 257 * 40000)):
            steps = 150
            bulk = model.decode_forward_times(b, sum_prefix, 0, steps)
            one_by_one = [model.forward_time(uniform_plan(ForwardMode.DECODE, b, 1, sum_prefix // b + j)) for j in range(steps)]
            assert bulk.tolist() == one_by_one, (graphs, b)


def test_tp2_is_faster_per_step_than_tp1_but_slower_than_half(profiles):
    one, two = cost(profiles, "h100-tp1"), cost(profiles, "h100-tp2")
    for price in (
        lambda c: decode(c, 32, 2000),
        lambda c: decode(c, 1, 100),
        lambda c: extend(c, 1, 4096),
        lambda c: extend(c, 4, 1000, 3000),
    ):
        t1, t2 = price(one), price(two)
        assert t1 / 2 < t2 < t1


def test_past_the_grids_prices_extrapolate_linearly(profiles):
    c = cost(profiles, "h100-tp1")
    k = json.loads(profiles["h100-tp1"].read_text())["kernels"]
    top_b, top_c = k["decode_attention"]["batch"][-1], k["decode_attention"]["context"][-1]
    # Decode attention past the largest batch: the last two batches' line, at any context.
    for ctx in (1000, 50000):
        t1, t2, beyond = c.decode(top_b // 2, ctx), c.decode(top_b, ctx), c.decode(2 * top_b, ctx)
        assert beyond == pytest.approx(t2 + 2 * (t2 - t1))
    # ... and past the longest context: a constant time per KV token.
    t1, t2, beyond = c.decode(8, top_c // 2), c.decode(8, top_c), c.decode(8, 3 * top_c)
    assert beyond == pytest.approx(t2 + 4 * (t2 - t1))
    # Dense kernels past the largest token count: a constant time per token.
    top_n = k["tokens"][-1]
    d1, d2 = c.dense(k["tokens"][-2]), c.dense(top_n)
    assert c.dense(2 * top_n) == pytest.approx(d2 + top_n * (d2 - d1) / (top_n - k["tokens"][-2]))
    # Prefill attention past the longest request: a constant time per causal query-key pair.
    top_s = k["prefill_attention"]["new_tokens"][-1]
    pairs = lambda s: s * (s + 1) / 2  # noqa: E731
    a1, a2 = c.prefill(1, top_s // 2, pairs(top_s // 2)), c.prefill(1, top_s, pairs(top_s))
    beyond = c.prefill(1, 2 * top_s, pairs(2 * top_s))
    assert beyond == pytest.approx(a2 + (a2 - a1) * (pairs(2 * top_s) - pairs(top_s)) / (pairs(top_s) - pairs(top_s // 2)))


@pytest.mark.slow
def test_a_replay_with_a_kernel_profile_sizes_kv_from_the_profiles_gpu(profiles, tmp_path):
    model = load_model_config(MODEL)
    for key, tp in (("rtx-tp1", 1), ("h100-tp2", 2)):
        out = tmp_path / key
        result = replay(
            str(REPO / "traces" / "a.json"), ReplayOptions(model=MODEL, tp=tp, profile=str(profiles[key]), max_requests=40), out=out
        )
        meta = json.loads((out / "run.json").read_text())
        system = BUILDS[key][0]
        assert result.status == "complete" and meta["hardware"] == system and meta["cost_model"] == f"profile:{key}.json"
        # SGLang's memory fraction and chunk for that GPU's memory, not the default --hardware's.
        spec = load_hardware(system)
        chunk = default_chunked_prefill_size(spec.memory_bytes)
        fraction = default_mem_fraction_static(spec.memory_bytes, chunk, ReplayOptions().max_prefill_tokens, None, tp)
        assert meta["options"]["chunked_prefill_size"] == chunk and meta["options"]["mem_fraction_static"] == fraction
        assert meta["summary"]["kv_tokens"] == kv_capacity_tokens(model, spec, fraction, tp=tp)
        assert meta["summary"]["mean_tpot_ms"] > 0


def test_a_profile_refuses_another_model_or_tp(profiles, tmp_path):
    trace = str(REPO / "traces" / "a.json")
    with pytest.raises(ConfigError, match=f"built for {MODEL} at TP 1, not llama-3.2-1b at TP 1"):
        replay(trace, ReplayOptions(model="llama-3.2-1b", profile=str(profiles["h100-tp1"])), out=tmp_path / "a")
    with pytest.raises(ConfigError, match=f"built for {MODEL} at TP 2, not {MODEL} at TP 1"):
        replay(trace, ReplayOptions(model=MODEL, profile=str(profiles["h100-tp2"])), out=tmp_path / "b")
    # A config of the same name with other shapes (a local folder named like the bundled model).
    folder = tmp_path / MODEL
    folder.mkdir()
    raw = load_model_config(MODEL).raw | {"intermediate_size": 4096}
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="other shapes.*intermediate_size"):
        replay(trace, ReplayOptions(model=str(folder), profile=str(profiles["h100-tp1"])), out=tmp_path / "c")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True, cwd=REPO, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, needles",
    [
        (["--system", "h100_sxmm"], ["h100_sxmm", "h100_sxm", "rtx_pro_6000_server"]),
        (["--system", "b60", "--backend", "sglang"], ["b60", "no 'sglang' kernels", "vllm"]),
        (["--system", "h100_sxm", "--backend-version", "0.0.1"], ["no version '0.0.1'", "0.5.14"]),
        (["--system", "h100_sxm", "--model", "no-such-model"], ["no-such-model", "bundled"]),
        (["--system", "h100_sxm", "--model", MODEL, "--tp", "3"], ["--tp 3", "16 attention heads"]),
        (["--system", "h100_sxm", "--model", MODEL, "--tp", "16"], ["--tp 16"]),
        ([], ["needs --system", "h100_sxm"]),
    ],
)
def test_calibrate_bad_input_is_one_line_exit_2(tmp_path, args, needles):
    assert_clean_error(run_cli("calibrate", "--source", "aiconfigurator", *args, "--out", str(tmp_path / "p.json"), "-q"), *needles)
    assert not (tmp_path / "p.json").exists()


@pytest.mark.slow
def test_without_the_package_the_error_names_the_extra(tmp_path):
    # Imports of the package fail, as where it is not installed.
    code = (
        "import sys; sys.modules['aiconfigurator_core'] = None; from testbed.cli import main; "
        f"sys.exit(main(['calibrate', '--source', 'aiconfigurator', '--system', 'h100_sxm', '--out', {str(tmp_path / 'p.json')!r}, '-q']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert_clean_error(proc, "pip install -e '.[aiconfigurator]'")
    code = (
        "import sys; sys.modules['aiconfigurator_core'] = None; from testbed.cli import main; "
        "sys.exit(main(['replay', 'traces/a.json', '--hardware', 'h100_sxm', '-q']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert_clean_error(proc, "h100_sxm", "[aiconfigurator]")


def test_kernel_options_without_source_aiconfigurator_are_refused(tmp_path):
    assert_clean_error(run_cli("calibrate", "--tp", "2", "--out", str(tmp_path / "p.json")), "--source aiconfigurator")


# --- a mixture of experts ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moe_profile(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("moe") / "qwen3-30b-a3b.json"
    calibrate_kernels("h200_sxm", "vllm", None, "qwen3-30b-a3b", 1, path)
    return path


def test_a_mixture_of_experts_is_priced_from_the_databases_moe_kernel(moe_profile):
    p = json.loads(moe_profile.read_text())
    ops = p["kernels"]["per_layer"]
    # Every layer of Qwen3-30B-A3B routes: no dense MLP, the router and the fused-MoE kernel instead.
    assert {"router", "experts"} <= set(ops) and not {"gate_up_proj", "down_proj"} & set(ops)
    assert p["model_shapes"]["num_experts"] == 128 and p["model_shapes"]["num_experts_per_tok"] == 8
    model = load_model_config("qwen3-30b-a3b")
    spec = p["hardware_spec"]
    cost_model = load_profile(moe_profile)
    # Batch 1 reads its token's 8 experts of 128 a layer: above that floor, far below all the weights.
    floor = hbm_floor_s(model, 1, spec["mem_bandwidth"])
    all_weights = model.weight_bytes(2, 1) / spec["mem_bandwidth"]
    assert floor < decode(cost_model, 1, 1024) < all_weights
    # A batch of 64 tokens touches most experts: its step costs more than batch 1's, less than 64 of them.
    assert decode(cost_model, 1, 1024) < decode(cost_model, 64, 1024) < 64 * decode(cost_model, 1, 1024)


def test_sliding_window_layers_and_mxfp4_experts_are_priced_from_the_databases_own_rows(tmp_path):
    # gpt-oss-120b on one H200 under vLLM, as its measured points run it: its own checkpoint (MXFP4 experts
    # beside bf16 attention and router), half its layers attending a 128-token window.
    from simulator.costs.precision import BYTES, MXFP4
    from simulator.profiles.gpu_shapes import GpuShapes
    from simulator.profiles.kernel_db import KernelDatabase
    from simulator.profiles.kernel_holdout import direct_forward

    path = tmp_path / "gpt-oss-120b.json"
    calibrate_kernels("h200_sxm", "vllm", None, "gpt-oss-120b", 1, path)
    p = json.loads(path.read_text())
    precision = p["precision"]
    assert (precision["weights"], precision["experts_only"], precision["gemm"]["quant_mode"]) == (MXFP4, True, "bfloat16")
    assert precision["expert_weights"]["quant_mode"] == "w4a16_mxfp4" and "mxfp4" in precision["expert_weights"]["kernel"]
    window = precision["sliding_window"]
    assert (window["window"], window["sliding_layers_share"]) == (128, 0.5) and "window_size 128" in window["priced_as"]
    assert window["decode_kernel"] and "attention_sinks" in window

    # The experts are the database's MXFP4 MoE rows at gpt-oss's shapes (128 experts of 2880, 4 a token):
    # at 4,096 tokens every expert is read, no faster than its 4-bit bytes cross the GPU's memory.
    model = load_model_config("gpt-oss-120b")
    db = KernelDatabase.open("h200_sxm", "vllm", p["database"]["backend_version"])
    experts = dict(zip(p["kernels"]["tokens"], p["kernels"]["per_layer"]["experts"]))
    for n in (1, 4096):  # (in between, randomly routed tokens touch fewer experts: test_expert_spread.py)
        assert experts[n] == pytest.approx(db.moe(n, 2880, 2880, 4, 128, 1, 1, "w4a16_mxfp4"), rel=1e-4)
    all_experts = model.num_experts * model.expert_matmul_params() * BYTES[MXFP4]
    assert experts[4096] > all_experts / p["hardware_spec"]["mem_bandwidth"]

    # 64 decodes at 32k tokens: the sliding layers attend 128 of them, so the step grows from 1k about half as
    # much as the same shapes priced with every layer attending the whole context.
    cost_model = load_profile(path)
    g = replace(GpuShapes.of(model, 1), expert_quant="w4a16_mxfp4")
    full = replace(g, sliding=None)
    assert decode(cost_model, 64, 32768) == pytest.approx(direct_forward(g, db, ForwardMode.DECODE, 64, 32768), rel=0.01)
    short, long = decode(cost_model, 64, 1024), decode(cost_model, 64, 32768)
    every_layer_full = direct_forward(full, db, ForwardMode.DECODE, 64, 32768)
    assert short < long < 0.8 * every_layer_full
    assert 0.4 < (long - short) / (every_layer_full - direct_forward(full, db, ForwardMode.DECODE, 64, 1024)) < 0.6

    # A replay of the model with the profile takes it: the checkpoint's MXFP4 experts, as the profile's.
    trace = tmp_path / "trace.jsonl"
    Trace([TraceRequest(0.0, 2048, 16, rid=f"r{k}") for k in range(4)]).write(trace)
    result = replay(str(trace), ReplayOptions(model="gpt-oss-120b", scheduler="vllm", profile=str(path)), out=tmp_path / "run")
    assert result.status == "complete" and result.summary["mean_tpot_ms"] > 0


def test_multi_head_latent_attention_is_priced_from_the_databases_mla_kernels(tmp_path):
    # DeepSeek-R1 on eight H200s under SGLang, its own fp8-block checkpoint, as the measured points run it.
    path = tmp_path / "deepseek-r1.json"
    calibrate_kernels("h200_sxm", "sglang", None, "deepseek-r1", 8, path, quantization="fp8_block")
    p = json.loads(path.read_text())
    ops = p["kernels"]["per_layer"]
    # The latents' projections instead of q/k/v ones; the MLA kernels price both attentions.
    assert {"qkv_a_proj", "q_b_proj", "o_proj"} <= set(ops) and "qkv_proj" not in ops
    assert "mla" in p["precision"]["prefill_attention"]["kernel"] and "mla" in p["precision"]["decode_attention"]["kernel"]
    # Checked against the database's measured MLA rows off the grid (none would leave these at 0 points).
    assert p["holdout"]["extend"]["points"] > 10 and p["holdout"]["decode"]["points"] > 10
    cost_model = load_profile(path)
    model = load_model_config("deepseek-r1")
    floor = hbm_floor_s(model, 8, p["hardware_spec"]["mem_bandwidth"], profile_precision(p))
    assert floor < decode(cost_model, 1, 1024) < 10 * floor
    # One latent a token and layer is all a decode reads of the KV: 64 requests at 16k tokens cost less
    # than twice what they cost at 1k (a GQA model with 128 heads' K and V would read 30x more).
    assert decode(cost_model, 64, 16384) < 2 * decode(cost_model, 64, 1024)


def test_expert_parallelism_prices_the_databases_ep_kernels_and_a_profile_keeps_its_ep(tmp_path):
    # Qwen3-235B-A22B on two H200s with fp8 blocks, as vLLM's measured points run it: experts split
    # over both GPUs (TP) or 64 whole experts on each (--ep 2).
    paths = {}
    for ep in (1, 2):
        paths[ep] = tmp_path / f"ep{ep}.json"
        calibrate_kernels("h200_sxm", "vllm", None, "qwen3-235b-a22b", 2, paths[ep], quantization="fp8_block", ep=ep)
    tp_only, with_ep = (json.loads(paths[ep].read_text()) for ep in (1, 2))
    assert (tp_only.get("ep", 1), with_ep["ep"]) == (1, 2)
    # Only the routed experts' kernel changes: the database's EP rows, not its TP rows.
    assert with_ep["kernels"]["per_layer"]["experts"] != tp_only["kernels"]["per_layer"]["experts"]
    assert with_ep["kernels"]["per_layer"]["qkv_proj"] == tp_only["kernels"]["per_layer"]["qkv_proj"]
    model = load_model_config("qwen3-235b-a22b")
    cost_model = load_profile(paths[2])
    cost_model.check_model(model, 2, 2)
    with pytest.raises(ProfileError, match="built for qwen3-235b-a22b at TP 2, EP 2, not qwen3-235b-a22b at TP 2$"):
        cost_model.check_model(model, 2, 1)
    with pytest.raises(ConfigError, match="--ep 3 does not divide"):
        calibrate_kernels("h200_sxm", "vllm", None, "qwen3-235b-a22b", 2, tmp_path / "ep3.json", quantization="fp8_block", ep=3)


def test_attention_data_parallelism_prices_the_busiest_rank_and_the_experts_over_every_ranks_tokens(tmp_path):
    # Qwen3-235B-A22B on two H200s under vLLM as `-tp 1 -dp 2` (AIConfigurator's gap-analysis points):
    # each rank attends its own requests on one GPU; the experts, split over both GPUs, take both
    # ranks' tokens, exchanged before and after them instead of TP's all-reduce.
    from simulator.profiles.gpu_shapes import GpuShapes
    from simulator.profiles.kernel_db import KernelDatabase
    from simulator.profiles.kernel_holdout import direct_forward

    path = tmp_path / "dp2.json"
    calibrate_kernels("h200_sxm", "vllm", None, "qwen3-235b-a22b", 1, path, quantization="fp8_block", dp=2)
    p = json.loads(path.read_text())
    assert p["dp"] == 2 and set(p["kernels"]["per_layer_all_ranks"]) == {"experts"}
    assert "moe_dispatch" in p["kernels"]["per_layer"] and "experts" not in p["kernels"]["per_layer"]
    model = load_model_config("qwen3-235b-a22b")
    cost_model = load_profile(path)
    db = KernelDatabase.open("h200_sxm", "vllm", p["database"]["backend_version"])
    g = replace(GpuShapes.of(model, 1, 1, 2), gemm_quant="fp8_block")
    # 8 decodes: 4 on each rank, the experts over all 8 tokens; 2 prompts of 1,024 tokens: one a rank.
    for mode, batch, seq in ((ForwardMode.DECODE, 8, 2048), (ForwardMode.EXTEND, 2, 1024)):
        plan = uniform_plan(mode, batch, seq, 0) if mode is ForwardMode.EXTEND else uniform_plan(mode, batch, 1, seq - 1)
        assert cost_model.forward_time(plan) == pytest.approx(direct_forward(g, db, mode, batch, seq), rel=0.01)
    # Two ranks of 4 decodes each cost less than one GPU holding all 8 (its attention and dense part
    # over twice the requests, every expert whole on it).
    one_gpu = replace(GpuShapes.of(model, 1, 1, 1), gemm_quant="fp8_block").with_experts_priced(db)
    assert decode(cost_model, 8, 2048) < direct_forward(one_gpu, db, ForwardMode.DECODE, 8, 2048)
    cost_model.check_model(model, 1, 1, 2)
    with pytest.raises(ProfileError, match="built for qwen3-235b-a22b at TP 1, DP 2, not qwen3-235b-a22b at TP 1$"):
        cost_model.check_model(model, 1, 1, 1)
    with pytest.raises(ConfigError, match="--tp 8 x --dp 2: h200_sxm has 8 GPUs a node"):
        calibrate_kernels("h200_sxm", "vllm", None, "qwen3-235b-a22b", 8, tmp_path / "x.json", quantization="fp8_block", dp=2)


def test_an_experts_split_the_database_lacks_follows_its_trend_over_smaller_splits(tmp_path):
    # MiniMax-M2.5 over 8 H200s under vLLM: the database has its fp8-block MoE rows split over 1, 2 and 4
    # GPUs, not 8. The profile extrapolates, says so, and lands below the 4-GPU split's time.
    split = {}
    for tp in (4, 8):
        path = tmp_path / f"tp{tp}.json"
        calibrate_kernels("h200_sxm", "vllm", None, "minimax-m2.5", tp, path, quantization="fp8_block")
        split[tp] = json.loads(path.read_text())
    assert "experts" not in split[4]["precision"]
    assert split[8]["precision"]["experts"]["moe_tp"] == 8 and "extrapolated" in split[8]["precision"]["experts"]["priced_as"]
    tokens = split[8]["kernels"]["tokens"]
    at = {tp: dict(zip(tokens, split[tp]["kernels"]["per_layer"]["experts"])) for tp in (4, 8)}
    assert all(0 < at[8][n] < at[4][n] for n in (1, 64, 4096))


def test_an_expert_imbalance_prices_the_databases_power_law_rows_and_a_profile_keeps_it(tmp_path):
    # Qwen3-30B-A3B on one H200 under vLLM, its experts balanced or under the SDK's power law of 1.01.
    profiles = {}
    for alpha in (None, 1.01):
        path = tmp_path / f"{alpha}.json"
        calibrate_kernels("h200_sxm", "vllm", None, "qwen3-30b-a3b", 1, path, expert_imbalance=alpha)
        profiles[alpha] = json.loads(path.read_text())
    assert (profiles[None]["expert_imbalance"], profiles[1.01]["expert_imbalance"]) == (None, 1.01)
    tokens = profiles[None]["kernels"]["tokens"]
    balanced, skewed = (dict(zip(tokens, profiles[a]["kernels"]["per_layer"]["experts"])) for a in (None, 1.01))
    # A skewed batch waits for its busiest experts: slower once it is large enough to load them.
    assert skewed[4096] > balanced[4096]
    assert profiles[1.01]["kernels"]["per_layer"]["qkv_proj"] == profiles[None]["kernels"]["per_layer"]["qkv_proj"]
    cost_model = load_profile(tmp_path / "1.01.json")
    cost_model.check_expert_load(1.01)
    with pytest.raises(ProfileError, match="built for --expert-imbalance 1.01, not balanced experts"):
        cost_model.check_expert_load(None)
    with pytest.raises(ConfigError, match="balanced, power_law_1.01 and power_law_1.2"):
        calibrate_kernels("h200_sxm", "vllm", None, "qwen3-30b-a3b", 1, tmp_path / "x.json", expert_imbalance=1.5)


def test_a_quantized_gemm_slower_than_bf16_at_one_token_is_priced_at_most_as_bf16(tmp_path):
    # vLLM's block-fp8 rows on the H200 take ~60 us at one token for Llama-3.1-8B's q/k/v projection,
    # against 16 us in bf16 and 13 us in per-tensor fp8: a per-call host floor, not the GPU.
    from simulator.profiles.kernel_db import KernelDatabase

    db = KernelDatabase.open("h200_sxm", "vllm", None)
    shape = (6144, 4096)  # (32 + 2 x 8 heads) x 128 out, 4096 in
    assert db.gemm(1, *shape, "fp8_block") > 2 * db.gemm(1, *shape, "bfloat16") > db.gemm(1, *shape, "fp8")
    qkv = {}
    for quant in ("fp8_block", "fp8"):
        path = tmp_path / f"{quant}.json"
        calibrate_kernels("h200_sxm", "vllm", None, "llama-3.1-8b", 1, path, quantization=quant)
        p = json.loads(path.read_text())
        qkv[quant] = dict(zip(p["kernels"]["tokens"], p["kernels"]["per_layer"]["qkv_proj"]))
    assert qkv["fp8_block"][1] == pytest.approx(db.gemm(1, *shape, "bfloat16"), rel=1e-3)
    assert qkv["fp8"][1] == pytest.approx(db.gemm(1, *shape, "fp8"), rel=1e-3)  # below bf16: its own row


# --- DeepSeek's sparse attention (GLM-5) -----------------------------------------------------------


def _mla_block(db, g, batch: int, context: int) -> float:
    """One layer's decode attention block as dense MLA prices it: the MLA kernels and the projections."""
    ops = g.layer_kernels(db, batch)
    return g.decode_attention(db, batch, context) + sum(ops[k] for k in ("qkv_a_proj", "q_b_proj", "o_proj"))


def test_glm_5s_sparse_attention_is_priced_from_the_databases_dsa_module(tmp_path):
    # GLM-5 on eight H200s under SGLang, its block-fp8 checkpoint, as the measured points run it.
    from simulator.profiles.gpu_shapes import GpuShapes
    from simulator.profiles.kernel_db import KernelDatabase

    path = tmp_path / "glm-5.json"
    calibrate_kernels("h200_sxm", "sglang", None, "glm-5", 8, path, quantization="fp8_block")
    p = json.loads(path.read_text())
    # The DSA module's rows hold the whole attention block, projections included: not priced twice.
    assert not {"qkv_a_proj", "q_b_proj", "o_proj"} & set(p["kernels"]["per_layer"])
    assert "DSA module" in p["precision"]["sparse_attention"]["priced_as"]
    assert p["precision"]["prefill_attention"]["kernel"].startswith("dsa_context_module (sglang_dsa_")
    assert p["precision"]["decode_attention"]["kernel"] == "dsa_generation_module (sglang_dsa_indexer_fa3)"
    assert p["holdout"]["extend"]["points"] > 10 and p["holdout"]["decode"]["points"] > 100
    # Against dense MLA of the same model and GPUs (the MLA tables, its projections as GEMMs), per layer.
    db = KernelDatabase.open("h200_sxm", "sglang", None)
    model = load_model_config("glm-5")
    dense = replace(GpuShapes.of(model, 8), gemm_quant="fp8_block", sparse=None)
    table = p["kernels"]["decode_attention"]
    dsa = {(b, c): table["seconds"][table["batch"].index(b)][table["context"].index(c)] for b in (64, 256) for c in (1024, 32768)}
    # Each query reads 2048 latents, not 32k: at 32k the block costs 0.74x dense MLA's at batch 64, 0.46x at 256
    # (the indexer still scores every cached key).
    assert dsa[64, 32768] < 0.8 * _mla_block(db, dense, 64, 32768)
    assert dsa[256, 32768] < 0.5 * _mla_block(db, dense, 256, 32768)
    # Below index_topk it attends all, as dense MLA: 1.3x and 1.2x dense MLA's, the indexer on top.
    for b in (64, 256):
        assert 1.0 < dsa[b, 1024] / _mla_block(db, dense, b, 1024) < 1.5


def test_glm_5s_sparse_attention_without_dsa_rows_is_mla_over_index_topk_plus_the_indexer():
    # Per-tensor fp8 weights: the database measured no DSA module with them. Composed: MLA over at most
    # index_topk tokens, and the indexer's projections, its MQA logits over every cached key, its top-k.
    from simulator.profiles.gpu_shapes import GpuShapes
    from simulator.profiles.kernel_db import KernelDatabase

    db = KernelDatabase.open("h200_sxm", "sglang", None)
    g = replace(GpuShapes.of(load_model_config("glm-5"), 8), gemm_quant="fp8")
    g = replace(g, sparse=g.sparse.priced(db, g))
    assert not g.sparse.prices_projections and "not fp8" in g.sparse.why_composed
    assert g.sparse.record()["priced_as"].startswith("composed") and (g.sparse.indexer_kv, g.sparse.indexer_fmha) == ("fp8", "fp8")
    dense = replace(g, sparse=None)
    # Its sparse MLA is dense MLA up to index_topk tokens, then stays at index_topk's: only the indexer grows.
    for b in (1, 64):
        indexer = {c: db.generation_attention(b, c, 32, 1, 128, False, "fp8") + g.sparse._indexer(db, g, b, c) for c in (1024, 32768)}
        assert g.decode_attention(db, b, 1024) == pytest.approx(dense.decode_attention(db, b, 1024) + indexer[1024])
        assert g.decode_attention(db, b, 32768) == pytest.approx(dense.decode_attention(db, b, 2048) + indexer[32768])
    # At 32k tokens: 0.61x dense MLA's attention at batch 64, 0.52x at 256 (at 1k: 1.9x and 1.7x, the indexer on top).
    assert g.decode_attention(db, 64, 32768) < 0.7 * dense.decode_attention(db, 64, 32768)
    assert g.decode_attention(db, 256, 32768) < 0.6 * dense.decode_attention(db, 256, 32768)
    # A prefill within index_topk is dense MLA's and the indexer's (2.7x dense MLA: its 32 heads are on every GPU);
    # past it each query attends index_topk keys, and only the indexer's logits grow with the context (1.07x).
    within, past = ((g.prefill_attention(db, 1, s, p) / dense.prefill_attention(db, 1, s, p)) for s, p in ((2048, 0), (8192, 8192)))
    assert past < within / 2


# --- vLLM's MLA from the database's MLA module tables (Kimi-K2.5) ----------------------------------


def _kimi_on_vllm(db, tp: int = 4):
    """Kimi-K2.5's shapes on `tp` B200s under vLLM with NVIDIA's NVFP4 checkpoint, MLA as the profile prices it."""
    from simulator.profiles.gpu_shapes import GpuShapes
    from simulator.profiles.mla_module import MlaModule

    g = replace(GpuShapes.of(load_model_config("kimi-k2.5"), tp), gemm_quant="nvfp4")
    return replace(g, mla_module=MlaModule.priced(db, g))


def test_kimi_k2_5s_mla_on_vllm_is_priced_from_the_databases_mla_module(tmp_path):
    # vLLM's database has no per-kernel MLA tables, only the MLA module's: each row one layer's whole block.
    import pandas as pd

    from simulator.profiles.kernel_catalog import systems_dir

    path = tmp_path / "kimi-k2.5.json"
    calibrate_kernels("b200_sxm", "vllm", None, "kimi-k2.5", 4, path, quantization="nvfp4")
    p = json.loads(path.read_text())
    # The module's rows hold the attention's projections: not priced twice.
    assert not {"qkv_a_proj", "q_b_proj", "o_proj", "qkv_proj"} & set(p["kernels"]["per_layer"])
    assert p["precision"]["prefill_attention"]["kernel"].startswith("mla_context_module (FLASHINFER_MLA, FLASH_ATTN)")
    assert p["precision"]["decode_attention"]["kernel"] == "mla_generation_module (FLASHINFER_MLA)"
    # NVIDIA's NVFP4 checkpoint keeps attention in bf16: the module's bf16 rows, and how a prefix is priced, recorded.
    record = p["precision"]["mla_module"]
    assert "MLA module rows with bfloat16 projections" in record["priced_as"] and "kv_b_proj" in record["cached_prefix"]
    assert p["holdout"]["extend"]["points"] > 10 and p["holdout"]["decode"]["points"] > 10
    assert p["holdout"]["extend"]["max_rel_err"] < 0.1 and p["holdout"]["decode"]["max_rel_err"] < 0.1
    cost_model = load_profile(path)
    floor = hbm_floor_s(load_model_config("kimi-k2.5"), 4, p["hardware_spec"]["mem_bandwidth"], profile_precision(p))
    # 8.4x the floor: at one token every kernel is latency-bound (the module alone takes 44 us a layer, its
    # weights 9 us to read), as SGLang's per-kernel profile of the same model and GPUs is (7.8x).
    assert floor < decode(cost_model, 1, 1024) < 10 * floor
    # One latent a token and layer is all a decode reads of the KV (1.4x).
    assert decode(cost_model, 64, 16384) < 2 * decode(cost_model, 64, 1024)
    # A prefill of 1 x 1024 tokens is the module's own measured row for 16 heads a GPU (64 over TP 4).
    table = systems_dir() / system_spec("b200_sxm")["data_dir"] / "mla" / "vllm" / p["database"]["backend_version"]
    rows = pd.read_parquet(table / "mla_context_module_perf.parquet")
    row = rows[
        (rows.num_heads == 16)
        & (rows.batch_size == 1)
        & (rows.isl == 1024)
        & (rows.kv_cache_dtype == "bfloat16")
        & (rows.mla_dtype == "bfloat16")
        & (rows.gemm_type == "bfloat16")
    ]
    attention = p["kernels"]["prefill_attention"]
    priced = attention["seconds"][0][attention["new_tokens"].index(1024)][attention["prefix"].index(0)]
    assert priced == pytest.approx(float(row.latency.iloc[0]) * 1e-3, rel=0.03)


def test_a_cached_prefix_on_vllms_mla_adds_what_vllm_runs_for_it():
    # The module's rows have no prefix: a chunk over one is the module over the chunk plus the prefix's latents
    # decompressed (kv_b_proj) and the chunk's attention over them (the database's MHA prefill, scaled to MLA's keys).
    from simulator.profiles.kernel_db import KernelDatabase

    db = KernelDatabase.open("b200_sxm", "vllm", None)
    g = _kimi_on_vllm(db)
    alone, whole = g.prefill_attention(db, 1, 2048, 0), g.prefill_attention(db, 1, 16384, 0)
    over_prefix = g.prefill_attention(db, 1, 2048, 14336)
    kv_b = g.linear(db, 14336, g.heads * (g.qk_nope + g.v_head), g.kv_lora, "bfloat16")
    assert alone + kv_b < over_prefix < whole
    # Prefilled in chunks of 2048, a 16k prompt costs more than at once (each chunk decompresses the prefix
    # again): 1.6x, as vLLM's chunked context runs it; within 2x.
    chunks = sum(g.prefill_attention(db, 1, 2048, prefix) for prefix in range(0, 16384, 2048))
    assert whole < chunks < 2 * whole
    # A few new tokens over a long prefix read its keys and values at least (the engine's causal-share rule
    # would leave them almost nothing); a 1-token query is vLLM's decode.
    assert g.prefill_attention(db, 64, 16, 2048) > g.prefill_attention(db, 64, 16, 0) + db.elementwise(64 * 2048, 16 * 320, 0)
    assert g.prefill_attention(db, 8, 1, 8192) == pytest.approx(g.decode_attention(db, 8, 8193))


def test_vllms_mla_module_prices_only_what_its_rows_measured():
    from simulator.profiles.gpu_shapes import GpuShapes
    from simulator.profiles.kernel_db import KernelDatabase, KernelDatabaseError
    from simulator.profiles.mla_module import MlaModule

    # SGLang's database has per-kernel MLA tables: MLA is composed from them, projections as GEMMs.
    sglang = KernelDatabase.open("b200_sxm", "sglang", None)
    assert MlaModule.priced(sglang, GpuShapes.of(load_model_config("kimi-k2.5"), 4)) is None
    db = KernelDatabase.open("b200_sxm", "vllm", None)
    g = _kimi_on_vllm(db, 8)
    # 64 heads over TP 8: the rows of 8 heads a GPU (DeepSeek-V3's 128 split 16 ways).
    assert g.mla_module.gemm == "bfloat16" and g.heads == 8
    assert not {"qkv_a_proj", "q_b_proj", "o_proj"} & set(g.layer_kernels(db, 1))
    # Per-tensor fp8 projections and other dimensions than DeepSeek-V3's have no rows: refused, saying why.
    with pytest.raises(KernelDatabaseError, match="not fp8"):
        MlaModule.priced(db, replace(g, gemm_quant="fp8", mla_module=None))
    with pytest.raises(KernelDatabaseError, match="DeepSeek-V3's dimensions"):
        MlaModule.priced(db, replace(g, hidden=4096, mla_module=None))


def test_qwen3_5s_linear_attention_layers_are_priced_from_the_databases_gated_deltanet_rows(tmp_path):
    # Qwen3.5-397B-A17B on eight B200s under SGLang in bf16, as its measured points run it: 45 of its 60
    # layers Gated DeltaNet (a state a request), 15 full attention with a KV cache, every layer MoE.
    from scheduler.sglang.config import SchedulerConfig
    from scheduler.sglang.mamba_pool import STATE_TO_KV_MEMORY, cap_running_requests
    from simulator.profiles.gpu_shapes import GpuShapes
    from simulator.profiles.kernel_db import KernelDatabase
    from simulator.profiles.kernel_holdout import direct_forward

    path = tmp_path / "qwen3.5.json"
    calibrate_kernels("b200_sxm", "sglang", None, "qwen3.5-397b-a17b", 8, path)
    p = json.loads(path.read_text())
    linear = p["precision"]["linear_attention"]
    assert linear["linear_layers_share"] == 0.75 and "gdn_perf" in linear["priced_as"]
    assert linear["heads_per_gpu"] == {"key": 2, "value": 8} and linear["state_dtype"] == "float32"
    assert {"linear_in_proj", "linear_out_proj", "experts", "shared_experts"} <= set(p["kernels"]["per_layer"])

    # 64 decodes from 1k to 128k tokens: only the full layers read a longer KV cache, so the step grows about
    # a quarter as much as the same shapes priced with every layer attending the whole context.
    model = load_model_config("qwen3.5-397b-a17b")
    db = KernelDatabase.open("b200_sxm", "sglang", p["database"]["backend_version"])
    cost_model = load_profile(path)
    g = GpuShapes.of(model, 8)
    every_layer_full = replace(g, linear_attention=None)
    assert decode(cost_model, 64, 32768) == pytest.approx(direct_forward(g, db, ForwardMode.DECODE, 64, 32768), rel=0.01)
    short, long = decode(cost_model, 64, 1024), decode(cost_model, 64, 131072)
    full_short, full_long = (direct_forward(every_layer_full, db, ForwardMode.DECODE, 64, c) for c in (1024, 131072))
    assert short < long < full_long
    assert 0.2 < (long - short) / (full_long - full_short) < 0.3

    # The KV pool holds the full layers' K and V only; SGLang gives the requests' states 0.9 of its memory
    # beside it, and admits a third of the states that fit as running requests (its radix cache keeps more).
    hw = cost_model.hardware_spec
    tokens = kv_capacity_tokens(model, hw, 0.82, tp=8)
    kv_bytes = model.kv_bytes_per_token(2, 8)
    free = hw.memory_bytes * 0.82 - model.weight_bytes(2, 8) - hw.activation_reserve_bytes
    assert tokens * kv_bytes == pytest.approx(free / (1 + STATE_TO_KV_MEMORY), rel=1e-4)
    config = cap_running_requests(SchedulerConfig(kv_tokens=tokens, context_len=model.context_len), model, kv_bytes, tp=8)
    states = int(tokens * kv_bytes * STATE_TO_KV_MEMORY // model.state_bytes_per_request(8))
    assert config.max_running_requests == states // 3 and config.effective_max_running_requests == states // 3


def test_minimaxs_q_and_k_norm_over_all_heads_all_reduces_its_variances_across_tp():
    """MiniMax-M2's q and k RMSNorm spans all of a layer's heads; under TP each GPU holds some of them,
    so vLLM all-reduces the two variances a token (MiniMaxText01RMSNormTP.forward_qk): one small
    all-reduce a layer, priced from the database's all-reduce rows. Qwen3's per-head norm needs none,
    nor does one GPU."""
    from simulator.profiles.gpu_shapes import GpuShapes
    from simulator.profiles.kernel_db import KernelDatabase

    db = KernelDatabase.open("h200_sxm", "vllm")
    minimax = load_model_config("minimax-m2.5")
    for n in (4, 1024):
        tp4 = replace(GpuShapes.of(minimax, 4), gemm_quant="fp8_block").layer_kernels(db, n)
        assert tp4["qk_norm_all_reduce"] == db.all_reduce(n, 4, 4) > 0
        assert tp4["qk_norm_all_reduce"] < tp4["all_reduce"]  # two floats a token against the hidden state, twice
    assert "qk_norm_all_reduce" not in replace(GpuShapes.of(minimax, 1), gemm_quant="fp8_block").layer_kernels(db, 4)
    assert "qk_norm_all_reduce" not in GpuShapes.of(load_model_config("qwen3-32b"), 4).layer_kernels(db, 4)


def test_an_all_reduce_smaller_than_the_databases_smallest_row_costs_that_row():
    """A tiny all-reduce is latency-bound: a token's 4 elements cost what the database's smallest
    measured message (128 elements) costs, and about what a token's whole hidden state does,
    not the database's interpolation towards zero below its first row."""
    from simulator.profiles.kernel_db import KernelDatabase

    db = KernelDatabase.open("h200_sxm", "vllm")
    smallest_row = db.all_reduce(32, 4, 8)  # 128 elements
    assert db.all_reduce(1, 4, 8) == db.all_reduce(4, 4, 8) == smallest_row
    assert db.all_reduce(1, 4, 8) > 0.5 * db.all_reduce(1, 3072, 8)
    assert db.all_reduce(1024, 4, 8) > smallest_row  # larger messages keep their own rows
