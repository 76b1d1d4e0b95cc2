"""An SGLang forward outside a CUDA graph waits for its host to launch each layer's kernels, and
SGLang's decode graphs reach as far as its defaults for the GPU and TP say."""

from __future__ import annotations

import json

import pytest

from scheduler.core.forward_plan import ForwardMode
from scheduler.model_config import load_model_config
from simulator.costs.cuda_graphs import sglang_graphs
from simulator.costs.sources import load_profile
from simulator.profiles.eager_dispatch import SGLANG_MOE_LAYER_DISPATCH_S
from simulator.profiles.kernel_holdout import uniform_plan
from testbed.calibrate_kernels import calibrate_kernels
from testbed.options import ReplayOptions
from testbed.schedulers import scheduler_kind


def test_an_sglang_prefill_of_a_mixture_of_experts_is_no_faster_than_its_hosts_dispatch(tmp_path):
    """Qwen3-30B-A3B on SGLang: a 1,000-token prefill's kernels take less than its 48 MoE layers'
    dispatch, so the host sets its time; a 16k-token prefill hides the dispatch; a decode batch
    replays a graph and is its kernels. The same model's vLLM profile keeps vLLM's own dispatch."""
    path = tmp_path / "sglang.json"
    calibrate_kernels("h200_sxm", "sglang", None, "qwen3-30b-a3b", 1, path)
    model = load_model_config("qwen3-30b-a3b")
    dispatch = model.num_moe_layers * SGLANG_MOE_LAYER_DISPATCH_S
    assert json.loads(path.read_text())["kernels"]["eager_overhead_s"] == pytest.approx(dispatch)
    priced = load_profile(path, graphs=sglang_graphs(256))
    short, long = uniform_plan(ForwardMode.EXTEND, 1, 1000, 0), uniform_plan(ForwardMode.EXTEND, 1, 16384, 0)
    assert priced.kernel_time(short) < dispatch
    assert priced.forward_time(short) == pytest.approx(dispatch)
    assert priced.kernel_time(long) > dispatch
    assert priced.forward_time(long) == priced.kernel_time(long)
    decode = uniform_plan(ForwardMode.DECODE, 64, 1, 1000)
    assert priced.forward_time(decode) == priced.kernel_time(decode)
    # Past the largest graph a decode batch is eager too.
    assert load_profile(path, graphs=sglang_graphs(32)).forward_time(decode) == pytest.approx(dispatch)


@pytest.mark.parametrize(
    "hardware, tp, max_bs",
    [("h200", 1, 256), ("h200", 8, 512), ("h100", 2, 256), ("h100", 4, 512), ("a100", 1, 256)],
)
def test_sglangs_decode_graphs_follow_its_defaults_for_the_gpus_memory_and_tp(hardware, tp, max_bs):
    """SGLang 0.5.9 captures decode batches up to 256 at TP 1-2 and 512 at TP 4+ on 60-160 GiB GPUs:
    a 512-request decode at TP 8 on an H200 replays a graph, at TP 1 it runs eagerly."""
    opts = ReplayOptions(mode="sim", scheduler="sglang", model="llama-3.1-8b", hardware=hardware, tp=tp)
    graphs = scheduler_kind("sglang").cuda_graphs(opts)
    assert graphs.captures(ForwardMode.DECODE, max_bs)
    assert not graphs.captures(ForwardMode.DECODE, max_bs + 1)
    assert not graphs.captures(ForwardMode.EXTEND, 1)
