"""ModelConfig of mixtures of experts and MLA: the bundled configs parse to the published
sizes, each family's own keys are read, KV and weights per GPU follow the layout, and a shape the
simulator cannot price is a ModelConfigError naming it."""

from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.model_config import MOE_ARCHITECTURES, ModelConfig, ModelConfigError, load_model_config

# Published totals and active parameters per token (model cards). Active: Qwen, Mistral and DeepSeek
# count the embedding table; OpenAI's gpt-oss card does not (active_params(include_embedding=False)).
PUBLISHED = {
    "qwen3-30b-a3b": (30.5e9, 3.3e9, True),  # Qwen3-30B-A3B card: 30.5B total, 3.3B activated
    "qwen3-235b-a22b": (235e9, 22e9, True),  # Qwen3-235B-A22B card: 235B, 22B activated
    "mixtral-8x7b": (46.7e9, 12.9e9, True),  # Mistral: 46.7B total, 12.9B a token
    "deepseek-v3": (671e9, 37e9, True),  # DeepSeek-V3 report: 671B total (without the 14B MTP module), 37B activated
    "deepseek-r1": (671e9, 37e9, True),  # the same shape
    "gpt-oss-120b": (116.83e9, 5.13e9, False),  # gpt-oss model card: 116.83B total, 5.13B active
}

# DeepSeek-V2-Lite's config.json (15.7B total, 2.4B active; MLA without a q latent): DeepseekV2 parses too.
V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "topk_method": "greedy",
    "vocab_size": 102400,
    "max_position_embeddings": 163840,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_within_2_percent(name):
    cfg = load_model_config(name)
    total, active, with_embedding = PUBLISHED[name]
    assert cfg.architecture in MOE_ARCHITECTURES and cfg.is_moe
    assert cfg.num_params == pytest.approx(total, rel=0.02)
    assert cfg.active_params(include_embedding=with_embedding) == pytest.approx(active, rel=0.02)
    assert cfg.weight_bytes() == 2 * cfg.num_params


def test_deepseek_v2_lite_parses_with_q_proj_directly():
    cfg = ModelConfig.from_hf_config(V2_LITE, name="deepseek-v2-lite")
    assert cfg.is_mla and cfg.q_lora_rank is None and cfg.dense_layers == (0,)
    assert cfg.num_params == pytest.approx(15.7e9, rel=0.02)
    # DeepSeek-V2's paper counts the 2.4B activated without the embedding table (2.45B; 2.66B with it).
    assert cfg.active_params(include_embedding=False) == pytest.approx(2.4e9, rel=0.03)


def test_each_family_reads_its_own_keys():
    qwen = load_model_config("qwen3-30b-a3b")
    assert (qwen.num_experts, qwen.num_experts_per_tok, qwen.moe_intermediate_size) == (128, 8, 768)
    assert qwen.dense_layers == () and qwen.shared_expert_intermediate_size == 0 and qwen.qk_norm
    mixtral = load_model_config("mixtral-8x7b")  # num_local_experts; an expert is intermediate_size wide
    assert (mixtral.num_experts, mixtral.num_experts_per_tok, mixtral.moe_intermediate_size) == (8, 2, 14336)
    ds = load_model_config("deepseek-v3")  # n_routed_experts, n_shared_experts, first_k_dense_replace
    assert (ds.num_experts, ds.num_experts_per_tok, ds.moe_intermediate_size) == (256, 8, 2048)
    assert ds.shared_expert_intermediate_size == 2048 and ds.dense_layers == (0, 1, 2) and ds.num_moe_layers == 58
    assert (ds.kv_lora_rank, ds.q_lora_rank, ds.qk_nope_head_dim, ds.qk_rope_head_dim, ds.v_head_dim) == (512, 1536, 128, 64, 128)
    assert ds.head_dim == 192 and ds.router_bias  # q/k heads: no-RoPE and RoPE parts; e_score_correction_bias
    assert ds.checkpoint_quantization == "fp8_block" and not ds.checkpoint_quantizes_experts_only
    oss = load_model_config("gpt-oss-120b")  # num_local_experts, experts_per_token, layer_types, sinks, mxfp4
    assert (oss.num_experts, oss.num_experts_per_tok, oss.moe_intermediate_size) == (128, 4, 2880)
    assert oss.sliding_window == 128 and oss.sliding_window_layers == 18 and oss.attention_sinks
    assert oss.router_bias and oss.expert_bias and oss.attention_bias
    assert oss.checkpoint_quantization == "mxfp4" and oss.checkpoint_quantizes_experts_only


def _kimi_k2_5_fields(m: ModelConfig) -> tuple:
    """What a user checks of Kimi-K2.5: its experts, MLA latents and layers (the first one dense)."""
    return (
        (m.architecture, m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size, m.shared_expert_intermediate_size),
        (m.kv_lora_rank, m.q_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim),
        (m.num_hidden_layers, m.dense_layers, m.num_moe_layers, m.num_attention_heads, m.hidden_size, m.vocab_size, m.context_len),
    )


KIMI_K2_5 = (
    ("DeepseekV3ForCausalLM", 384, 8, 2048, 2048),
    (512, 1536, 128, 64, 128),
    (61, (0,), 60, 64, 7168, 163840, 262144),
)


def test_kimi_k2_5_is_deepseek_v3_shaped_with_its_card_sizes():
    m = load_model_config("kimi-k2.5")
    assert _kimi_k2_5_fields(m) == KIMI_K2_5
    assert m.router_bias and m.rope_theta == 50000.0 and m.eos_token_id == (163585,)
    # Kimi-K2.5's card: 1T total and 32B activated parameters (rounded; the 400M vision encoder aside).
    assert m.num_params == pytest.approx(1.0e12, rel=0.03)
    assert m.active_params() == pytest.approx(32e9, rel=0.03)
    assert m.routed_expert_params() == 60 * 384 * 3 * 7168 * 2048  # 60 MoE layers of 384 gated experts
    # MLA: one latent of kv_lora_rank + qk_rope_head_dim a token and layer, held whole by every TP GPU.
    assert m.kv_bytes_per_token() == m.kv_bytes_per_token(2, tp=8) == 61 * (512 + 64) * 2 == 70272


def test_a_multimodal_config_loads_as_the_language_model_its_text_config_holds(tmp_path):
    text = load_model_config("kimi-k2.5").raw
    wrapper = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": text, "vision_config": {"patch_size": 14}}
    folder = tmp_path / "Kimi-K2.5"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(wrapper))
    local = load_model_config(folder)
    assert local.name == "Kimi-K2.5" and local.raw["architectures"] == ["DeepseekV3ForCausalLM"]
    assert _kimi_k2_5_fields(local) == KIMI_K2_5
    with pytest.raises(ModelConfigError, match="text_config"):
        ModelConfig.from_hf_config({"architectures": ["KimiK25ForConditionalGeneration"]}, name="bad")


@pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None, reason="needs the aiconfigurator extra")
@pytest.mark.parametrize("shipped", ["moonshotai--Kimi-K2.5", "nvidia--Kimi-K2.5-NVFP4"])
def test_the_published_kimi_k2_5_config_json_gives_the_bundled_config(tmp_path, shipped):
    # aiconfigurator-core ships the checkpoints' config.json files (KimiK25ForConditionalGeneration).
    package = Path(next(iter(importlib.util.find_spec("aiconfigurator_core").submodule_search_locations)))
    folder = tmp_path / shipped.split("--")[1]
    folder.mkdir()
    shutil.copy(package / "model_configs" / f"{shipped}_config.json", folder / "config.json")
    local, bundled = load_model_config(folder), load_model_config("kimi-k2.5")
    assert _kimi_k2_5_fields(local) == KIMI_K2_5
    assert replace(local, name=bundled.name) == bundled and local.rope_scaling == bundled.rope_scaling
    assert local.folder == str(folder.resolve()) and bundled.folder is None


def test_qwen3_moe_dense_layers_follow_mlp_only_layers_and_the_sparse_step():
    raw = dict(load_model_config("qwen3-30b-a3b").raw, mlp_only_layers=[0, 47], decoder_sparse_step=2)
    cfg = ModelConfig.from_hf_config(raw, name="q")
    # Experts where (i + 1) % 2 == 0 and i not listed: the odd layers but 47.
    assert cfg.dense_layers == tuple(i for i in range(48) if i % 2 == 0 or i == 47)
    assert cfg.num_moe_layers == 23 and cfg.num_dense_mlp_layers == 25


def test_mla_kv_is_one_latent_a_layer_that_tp_does_not_divide():
    ds = load_model_config("deepseek-v3")
    assert ds.kv_bytes_per_token() == 61 * (512 + 64) * 2 == 70272
    assert ds.kv_bytes_per_token(1) == 35136
    assert ds.kv_bytes_per_token(2, tp=8) == ds.kv_bytes_per_token(2, tp=1)  # every GPU of the TP group holds it
    # Against the K and V heads it replaces: 2 x 128 heads x 192 x 61 layers x 2 bytes.
    assert ds.kv_bytes_per_token() < 2 * 128 * 192 * 61 * 2 / 80
    qwen = load_model_config("qwen3-235b-a22b")  # GQA: the dense rule
    assert qwen.kv_bytes_per_token(2, 4) == 2 * 94 * 1 * 128 * 2


def test_weights_per_gpu_follow_tp_ep_and_dp():
    m = load_model_config("qwen3-235b-a22b")
    # Experts over 8 GPUs: 16 whole experts each (EP 8) or an eighth of every one (TP 8) hold the same.
    assert m.routed_expert_params(8, 8, 1) == m.routed_expert_params(8, 1, 1) == m.routed_expert_params() // 8
    assert m.params_per_gpu(8, ep=8) == m.params_per_gpu(8)
    # DP attention: attention and the rest at TP 1 on every rank, the experts over all 8 GPUs.
    per_gpu = m.params_per_gpu(1, ep=8, dp=8)
    assert per_gpu == m.num_params - m.routed_expert_params() + m.routed_expert_params() // 8
    # Quantized weights: every decoder matmul (not the router) at linear_bytes; experts only where asked.
    assert m.weight_bytes(2, linear_bytes=1) == 2 * m.num_params - m.decoder_matmul_params()
    oss = load_model_config("gpt-oss-120b")
    assert oss.weight_bytes(2, linear_bytes=0.53125, experts_only=True) == pytest.approx(
        2 * oss.num_params - oss.routed_expert_params() * (2 - 0.53125)
    )


def test_check_parallel_names_what_does_not_divide():
    m = load_model_config("qwen3-30b-a3b")
    m.check_parallel(2, ep=2)
    m.check_parallel(1, ep=8, dp=8)
    with pytest.raises(ModelConfigError, match="--ep 3 does not divide qwen3-30b-a3b's 128 experts"):
        m.check_parallel(1, ep=3, dp=3)
    with pytest.raises(ModelConfigError, match=r"--ep 4 does not divide the 2 GPUs \(--tp 2 x --dp 1\)"):
        m.check_parallel(2, ep=4)
    with pytest.raises(ModelConfigError, match="expert intermediate size 768"):
        m.check_parallel(1, ep=1, dp=512)  # each expert split over 512 GPUs
    with pytest.raises(ModelConfigError, match="dense model"):
        load_model_config("llama-3.1-8b").check_parallel(1, ep=2)
    # MLA has no KV heads to split: TP 16 of DeepSeek's 128 heads is fine.
    load_model_config("deepseek-v3").check_tp(16)


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"num_experts_per_tok": 256}, "more than its 128 experts"),
        ({"num_experts_per_tok": None}, "num_experts_per_tok must be a positive integer"),
        ({"num_experts": None}, "names no experts"),
        ({"num_experts": 0}, "num_experts must be a positive integer"),
        ({"mlp_only_layers": [99]}, "mlp_only_layers"),
        ({"mlp_only_layers": list(range(48))}, "no layer has experts"),
        ({"moe_intermediate_size": None}, "moe_intermediate_size"),
    ],
)
def test_a_moe_shape_it_cannot_price_is_one_clear_error(change, needle):
    raw = dict(load_model_config("qwen3-30b-a3b").raw, **change)
    with pytest.raises(ModelConfigError, match=needle):
        ModelConfig.from_hf_config(raw, name="bad")


def test_bad_mla_and_gpt_oss_configs_are_clear_errors(tmp_path):
    raw = dict(load_model_config("deepseek-v3").raw)
    del raw["kv_lora_rank"]
    with pytest.raises(ModelConfigError, match="kv_lora_rank"):
        ModelConfig.from_hf_config(raw, name="bad")
    raw = dict(load_model_config("gpt-oss-120b").raw, layer_types=["full_attention"] * 3)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelConfigError, match="layer_types"):
        load_model_config(tmp_path)


def test_a_config_json_of_each_family_loads_from_a_folder(tmp_path):
    for name in PUBLISHED:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(load_model_config(name).raw))
        assert load_model_config(folder).num_params == load_model_config(name).num_params


def test_minimax_m2_parses_as_a_mixture_of_experts_with_gqa():
    m = load_model_config("minimax-m2.5")
    assert m.architecture == "MiniMaxM2ForCausalLM" and m.is_moe and not m.is_mla
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size, m.num_moe_layers) == (256, 8, 1536, 62)
    assert m.qk_norm and m.router_bias and m.checkpoint_quantization == "fp8_block"
    # MiniMax-M2's card: 230B total, 10B active (rounded to whole billions; the embedding table not counted).
    assert abs(m.num_params - 230e9) / 230e9 < 0.02
    assert 9.5e9 <= m.active_params(include_embedding=False) <= 10.5e9


def test_glm_5_parses_as_mla_with_deepseek_sparse_attention_and_caches_its_indexer_keys():
    m = load_model_config("glm-5")
    assert m.architecture == "GlmMoeDsaForCausalLM" and m.is_moe and m.is_mla and m.is_dsa
    # MLA with GLM-5's own head sizes: a 512-wide latent, 192 + 64 query/key and 256 value dims a head.
    mla = (m.kv_lora_rank, m.q_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.head_dim)
    assert mla == (512, 2048, 192, 64, 256, 256)
    assert (m.index_topk, m.index_n_heads, m.index_head_dim) == (2048, 32, 128)
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size, m.shared_expert_intermediate_size) == (256, 8, 2048, 2048)
    assert m.dense_layers == (0, 1, 2) and m.num_moe_layers == 75 and m.router_bias
    # GLM-5's card: 744B parameters, 40B active (the 0.7B of indexers counted here; MTP layer not).
    assert m.num_params == pytest.approx(744e9, rel=0.01)
    assert m.active_params(include_embedding=False) == pytest.approx(40e9, rel=0.03)
    # A token caches MLA's latent and RoPE key, plus the indexer's fp8 key and its fp32 scale (128 + 4
    # bytes) in each of 78 layers, whole on every GPU of the TP group: 78 x (576 x 2 + 132) in bf16.
    assert m.index_key_bytes == 132
    assert m.kv_bytes_per_token() == m.kv_bytes_per_token(2, tp=8) == 78 * (576 * 2 + 132) == 100152
    assert m.kv_bytes_per_token(1) == 78 * (576 + 132) == 55224  # fp8 KV: the indexer keys are fp8 either way
    assert load_model_config("deepseek-v3").index_key_bytes == 0
    m.check_parallel(8)
    raw = dict(m.raw)
    del raw["index_topk"]
    with pytest.raises(ModelConfigError, match="index_topk"):
        ModelConfig.from_hf_config(raw, name="bad")


def test_qwen3_5_loads_as_a_hybrid_of_linear_and_full_attention_layers():
    m = load_model_config("qwen3.5-397b-a17b")
    # The published config.json wraps the language model (Qwen3_5MoeForConditionalGeneration's text_config).
    assert m.architecture == "Qwen3_5MoeForCausalLM" and m.raw["architectures"] == ["Qwen3_5MoeForCausalLM"]
    assert (m.num_hidden_layers, m.linear_attention_layers, m.full_attention_layers) == (60, 45, 15)  # every 4th layer full
    assert (m.linear_num_key_heads, m.linear_num_value_heads, m.linear_key_head_dim, m.linear_value_head_dim) == (16, 64, 128, 128)
    assert (m.num_attention_heads, m.num_key_value_heads, m.head_dim, m.attn_output_gate, m.qk_norm) == (32, 2, 256, True, True)
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size, m.shared_expert_intermediate_size) == (512, 10, 1024, 1024)
    # The name's sizes: 397B total, 17B activated (the vision encoder aside).
    assert m.num_params == pytest.approx(397e9, rel=0.01)
    assert m.active_params() == pytest.approx(17e9, rel=0.03)


def test_qwen3_5_caches_kv_in_its_full_layers_only_and_a_state_a_request():
    m = load_model_config("qwen3.5-397b-a17b")
    # 15 full layers x K and V x 2 KV heads x 256 x 2 bytes; over 8 GPUs the 2 KV heads are replicated (1 a GPU).
    assert m.kv_bytes_per_token() == 15 * 2 * 2 * 256 * 2 == 30720
    assert m.kv_bytes_per_token(2, tp=8) == 15 * 2 * 1 * 256 * 2
    # Each of the 45 linear layers: the conv window (3 past inputs of q, k and v's 2*16*128 + 64*128
    # channels, bf16) and the recurrent state (64 heads of 128 x 128, float32), split over TP.
    conv, recurrent = (2 * 16 * 128 + 64 * 128) * 3 * 2, 64 * 128 * 128 * 4
    assert m.state_bytes_per_request() == 45 * (conv + recurrent)
    assert m.state_bytes_per_request(tp=4) == 45 * (conv + recurrent) // 4
    # A request's state is worth thousands of tokens of KV; a dense model holds none.
    assert m.state_bytes_per_request(4) > 3000 * m.kv_bytes_per_token(2, 4)
    assert load_model_config("qwen3-235b-a22b").state_bytes_per_request() == 0
