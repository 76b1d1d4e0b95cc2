"""The real engine's mixtures of experts equal transformers: same weights, same logits.

Tiny random Qwen3-MoE and Mixtral checkpoints are written by transformers' save_pretrained (the
experts one by one, as published checkpoints hold them, though transformers 5 fuses them in
memory), loaded by the engine's loader, and run through the scheduler:

- Qwen3-MoE renormalizing its top-k (norm_topk_prob), with a dense layer among the MoE ones
  (mlp_only_layers); Qwen3-MoE without renormalization, experts every second layer
  (decoder_sparse_step 2); Mixtral (block_sparse_moe, w1/w2/w3, always renormalized); the bundled
  tiny-qwen3-moe config itself;
- logits (fp32, 1e-4) of a prefill and its decode steps, of several prompts of different lengths
  prefilled and decoded in one batch, of chunked prefills beside decodes (mixed batches);
- the dense path a CUDA graph captures (DecodeGraphs(capture=False) runs it on the CPU);
- and the tests' own power: the engine with its routing broken (top-k renormalized when it should
  not be, or the other way, one expert fewer) no longer matches.
"""

from __future__ import annotations

import json

import pytest
import torch
from engine_helpers import ATOL, RTOL, TINY, ManualRun, check_record_against_hf, hf_logits, make_req, make_runner, prompt, scheduler_config
from safetensors import safe_open

from engine.cuda_graph import DecodeGraphs
from engine.moe import SparseMoeBlock
from scheduler.core.forward_plan import ForwardMode
from scheduler.model_config import CONFIGS_DIR

MOE_ARCHS = ("qwen3-moe", "qwen3-moe-step2", "mixtral", "tiny-qwen3-moe")
# A wide random init (TINY's): the router's logits spread over several units, so a token's
# top-k experts are well apart from the rest and a routing mistake moves the logits a lot.
MOE = dict(num_experts_per_tok=2, tie_word_embeddings=False)


def moe_hf_config(arch: str):
    from transformers import MixtralConfig, Qwen3MoeConfig

    if arch == "qwen3-moe":
        return Qwen3MoeConfig(
            **TINY | {"num_hidden_layers": 3},
            **MOE,
            num_experts=8,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            mlp_only_layers=[1],
            head_dim=32,
            use_sliding_window=False,
        )
    if arch == "qwen3-moe-step2":
        return Qwen3MoeConfig(
            **TINY, **MOE, num_experts=6, moe_intermediate_size=24, norm_topk_prob=False, decoder_sparse_step=2, use_sliding_window=False
        )
    if arch == "mixtral":
        return MixtralConfig(**TINY | {"intermediate_size": 48}, **MOE, num_local_experts=4, sliding_window=None)
    if arch == "tiny-qwen3-moe":  # the bundled config, as a user's folder would hold it
        raw = json.loads((CONFIGS_DIR / "tiny-qwen3-moe.json").read_text())
        return Qwen3MoeConfig(**raw | {"initializer_range": TINY["initializer_range"], "max_position_embeddings": 512})
    raise ValueError(arch)


def save_moe_model(arch: str, folder, seed: int):
    """A tiny random transformers MoE, its norm scales drawn too, saved; the model, eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(moe_hf_config(arch), dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model


class Env:
    def __init__(self, arch: str, folder, seed: int) -> None:
        self.arch, self.folder = arch, folder
        self.hf = save_moe_model(arch, folder, seed)
        self.runner = make_runner(folder)


@pytest.fixture(scope="module", params=MOE_ARCHS)
def env(request, tmp_path_factory) -> Env:
    return Env(request.param, tmp_path_factory.mktemp(request.param), seed=MOE_ARCHS.index(request.param))


def moe_blocks(runner) -> list[SparseMoeBlock]:
    return [m for m in runner.model.modules() if isinstance(m, SparseMoeBlock)]


def test_checkpoints_are_what_the_engine_is_meant_to_cover(env):
    cfg, model = env.runner.model_cfg, env.runner.model
    with safe_open(str(env.folder / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    # The checkpoint names experts one by one, and the engine's parameters are exactly its keys.
    assert keys == {n for n, _ in model.named_parameters()}
    hf_moe = [i for i, layer in enumerate(env.hf.model.layers) if "SparseMoeBlock" in type(layer.mlp).__name__]
    ours = [i for i, layer in enumerate(model.model.layers) if isinstance(layer._modules[layer.ffn_name], SparseMoeBlock)]
    assert ours == hf_moe and cfg.is_moe
    blocks = moe_blocks(env.runner)
    if env.arch == "qwen3-moe":
        assert ours == [0, 2] and "model.layers.0.mlp.experts.7.gate_proj.weight" in keys
        assert all(b.norm_topk_prob for b in blocks) and cfg.qk_norm and cfg.head_dim == 32
    if env.arch == "qwen3-moe-step2":
        assert ours == [1] and not any(b.norm_topk_prob for b in blocks)
    if env.arch == "mixtral":
        assert ours == [0, 1] and "model.layers.1.block_sparse_moe.experts.3.w2.weight" in keys
        assert all(b.norm_topk_prob for b in blocks)
    if env.arch == "tiny-qwen3-moe":
        assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (8, 2, 32)
        assert all(b.norm_topk_prob for b in blocks)


def test_prefill_then_decode_logits_equal_transformers(env):
    p = prompt(1, 40)
    run = ManualRun(env.runner, scheduler_config(env.runner))
    req = run.add(make_req("a", p, 6))
    run.run()
    rec = run.records["a"]
    assert [plan.mode for plan, _ in rec.plans] == [ForwardMode.EXTEND] + [ForwardMode.DECODE] * 5
    check_record_against_hf(env.hf, rec, req.output_ids, "prefill, then decode")


def test_batched_prefill_and_decode_equal_transformers(env):
    lens, outs = [12, 33, 47, 60], [5, 8, 3, 6]
    run = ManualRun(env.runner, scheduler_config(env.runner))
    reqs = [run.add(make_req(f"r{i}", prompt(10 + i, n), o, index=i)) for i, (n, o) in enumerate(zip(lens, outs))]
    run.run()
    first = run.plans[0]
    assert first.mode is ForwardMode.EXTEND and first.extend_lens == lens
    assert max(plan.batch_size for plan in run.plans if plan.mode is ForwardMode.DECODE) == 4
    for r in reqs:
        check_record_against_hf(env.hf, run.records[r.rid], r.output_ids, f"request {r.rid} of a batch")


def test_chunked_prefill_beside_decodes_equals_transformers(env):
    run = ManualRun(env.runner, scheduler_config(env.runner, chunked_prefill_size=16, enable_mixed_chunk=True))
    a = run.add(make_req("a", prompt(30, 20), 12))
    run.step()  # a is prefilled, then decodes beside b's chunks
    b = run.add(make_req("b", prompt(31, 45), 4, index=1))
    run.run()
    assert any(plan.mode is ForwardMode.MIXED for plan in run.plans)
    for r in (a, b):
        check_record_against_hf(env.hf, run.records[r.rid], r.output_ids, f"request {r.rid}, chunks and mixed batches")


def test_graph_safe_padded_decode_equals_transformers(env):
    """The dense expert path of a CUDA graph's decode, run eagerly over the padded batch."""
    runner = env.runner
    config = scheduler_config(runner)
    runner.graphs = DecodeGraphs(runner.model, runner.attn, runner.cache, max_batch=config.max_running_requests, capture=False)
    try:
        run = ManualRun(runner, config)
        reqs = [run.add(make_req(f"r{i}", prompt(50 + i, n), o, index=i)) for i, (n, o) in enumerate(zip([40, 77, 52], [6, 9, 4]))]
        run.run()
        assert runner.graphs.replays == sum(plan.mode is ForwardMode.DECODE for plan in run.plans) > 0
        for r in reqs:
            check_record_against_hf(env.hf, run.records[r.rid], r.output_ids, f"request {r.rid}, graph-safe decode")
    finally:
        runner.graphs = None


def test_dense_and_grouped_experts_agree_and_grouped_runs_only_routed_experts(env):
    block = moe_blocks(env.runner)[0]
    x = torch.randn(5, env.runner.model_cfg.hidden_size, generator=torch.Generator().manual_seed(0)).to(env.runner.device)
    weights, experts = block.route(x)
    ran: list[int] = []
    hooks = [e.register_forward_hook(lambda m, *_: ran.append(id(m))) for e in block.experts]
    try:
        grouped = block(x)
    finally:
        for h in hooks:
            h.remove()
    assert sorted(set(ran)) == sorted(id(block.experts[e]) for e in set(experts.flatten().tolist()))
    assert len(ran) == len(set(ran))  # each routed expert once, on all of its tokens
    torch.testing.assert_close(block(x, graph_safe=True), grouped, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("mistake", ["flip-renormalization", "one-expert-fewer"])
def test_a_routing_mistake_is_caught(env, mistake):
    """The tolerance the tests above use is far below what a wrong routing changes."""
    blocks = moe_blocks(env.runner)
    saved = [(b.norm_topk_prob, b.top_k) for b in blocks]
    for b in blocks:
        if mistake == "flip-renormalization":
            b.norm_topk_prob = not b.norm_topk_prob
        else:
            b.top_k -= 1
    try:
        p = prompt(2, 30)
        run = ManualRun(env.runner, scheduler_config(env.runner))
        run.add(make_req("a", p, 1))
        run.run()
        diff = (run.records["a"].logits[0] - hf_logits(env.hf, p)[-1]).abs().max().item()
        assert diff > 1e-2, f"{mistake}: logits moved only {diff:.3g}"
    finally:
        for b, (norm, k) in zip(blocks, saved):
            b.norm_topk_prob, b.top_k = norm, k


def test_the_graph_safe_path_has_no_data_dependent_shape():
    """What a CUDA graph's capture needs, checked without a GPU: torch.compile(fullgraph=True)
    traces the dense path whole, and stops at the grouped path's per-expert token counts."""
    from engine.moe import moe_family
    from scheduler.model_config import load_model_config

    cfg = load_model_config("tiny-qwen3-moe")
    block = SparseMoeBlock(cfg, moe_family(cfg)).eval()
    x = torch.randn(4, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    try:
        with torch.inference_mode():
            dense = torch.compile(lambda x: block(x, graph_safe=True), backend="eager", fullgraph=True)(x)
            torch.testing.assert_close(dense, block(x))
            grouped = torch.compile(lambda x: block(x, graph_safe=False), backend="eager", fullgraph=True)
            with pytest.raises(Exception, match="data-dependent"):
                grouped(x)
    finally:
        torch._dynamo.reset()
