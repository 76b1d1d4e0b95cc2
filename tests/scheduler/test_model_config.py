"""ModelConfig: bundled configs parse to the published model sizes; loading errors are clear."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.model_config import (
    DENSE_ARCHITECTURES,
    SUPPORTED_ARCHITECTURES,
    ModelConfig,
    ModelConfigError,
    bundled_model_names,
    load_model_config,
)

# Published parameter counts (model cards / safetensors metadata), embeddings included.
PUBLISHED_PARAMS = {
    "llama-3.1-8b": 8.03e9,
    "llama-3-8b": 8.03e9,
    "llama-3.2-1b": 1.24e9,
    "qwen2.5-0.5b": 0.494e9,
    "qwen2.5-7b": 7.61e9,
    "qwen3-0.6b": 0.6e9,
    "mistral-7b": 7.25e9,
    "llama-3.1-70b": 70.6e9,
    "llama-2-7b": 6.74e9,
    "llama-2-70b": 69.0e9,
    "qwen3-8b": 8.19e9,
    "qwen3-14b": 14.8e9,
    "qwen3-32b": 32.8e9,
    "qwen2.5-72b": 72.7e9,
    "mistral-small-24b": 23.6e9,
}


def test_bundled_names():
    names = bundled_model_names()
    assert set(PUBLISHED_PARAMS) | {"tiny-llama"} <= set(names)
    assert names == sorted(names)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_param_counts_match_published(name):
    cfg = load_model_config(name)
    assert cfg.name == name
    assert cfg.architecture in SUPPORTED_ARCHITECTURES
    assert cfg.num_params == pytest.approx(PUBLISHED_PARAMS[name], rel=0.03)
    assert cfg.weight_bytes() == 2 * cfg.num_params
    assert cfg.weight_bytes(dtype_bytes=1) == cfg.num_params


def test_every_bundled_config_loads():
    for name in bundled_model_names():
        cfg = load_model_config(name)
        assert cfg.num_attention_heads % cfg.num_key_value_heads == 0
        assert cfg.context_len == cfg.max_position_embeddings > 0
        assert cfg.raw["architectures"][0] == cfg.architecture
        assert all(isinstance(e, int) for e in cfg.eos_token_id)
        if cfg.architecture in DENSE_ARCHITECTURES:  # what the real engine runs stops at an EOS id
            assert cfg.eos_token_id, name


def test_llama_3_1_8b_fields():
    cfg = load_model_config("llama-3.1-8b")
    assert cfg.architecture == "LlamaForCausalLM"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (4096, 32, 32)
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size) == (8, 128, 14336)
    assert cfg.vocab_size == 128256
    assert cfg.context_len == 131072
    assert cfg.rope_theta == 500000.0
    assert cfg.rope_scaling["rope_type"] == "llama3" and cfg.rope_scaling["factor"] == 8.0
    assert cfg.eos_token_id == (128001, 128008, 128009)
    assert not cfg.tie_word_embeddings and not cfg.attention_bias and not cfg.qk_norm
    assert cfg.kv_bytes_per_token() == 131072
    assert cfg.kv_bytes_per_token(dtype_bytes=1) == 65536


def test_kv_bytes_per_token():
    # 2 (K and V) * layers * kv_heads * head_dim * 2 bytes
    assert load_model_config("qwen2.5-7b").kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2
    assert load_model_config("qwen2.5-0.5b").kv_bytes_per_token() == 2 * 24 * 2 * 64 * 2
    assert load_model_config("llama-3.2-1b").kv_bytes_per_token() == 2 * 16 * 8 * 64 * 2
    assert load_model_config("tiny-llama").kv_bytes_per_token() == 2 * 2 * 2 * 16 * 2


def test_qwen_specifics():
    q2 = load_model_config("qwen2.5-0.5b")
    assert q2.attention_bias and not q2.qk_norm
    assert q2.tie_word_embeddings
    assert q2.sliding_window is None  # use_sliding_window is false
    q3 = load_model_config("qwen3-0.6b")
    assert q3.qk_norm and not q3.attention_bias
    # Qwen3 sets head_dim explicitly, larger than hidden / heads.
    assert q3.head_dim == 128 and q3.hidden_size // q3.num_attention_heads == 64
    assert q3.q_size == 2048


def test_tiny_llama():
    cfg = load_model_config("tiny-llama")
    assert cfg.architecture == "LlamaForCausalLM"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (64, 2, 4)
    assert (cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size) == (2, 128, 512)
    assert cfg.context_len == 4096 and cfg.head_dim == 16


def test_name_is_case_insensitive():
    assert load_model_config("Llama-3.1-8B") == load_model_config("llama-3.1-8b")
    assert load_model_config("QWEN2.5-0.5B").name == "qwen2.5-0.5b"


def test_config_is_hashable_and_keeps_raw():
    cfg = load_model_config("llama-3.1-8b")
    assert hash(cfg) == hash(load_model_config("llama-3.1-8b"))
    assert cfg.raw["rope_scaling"]["rope_type"] == "llama3"


def test_load_from_folder_and_file(tmp_path):
    raw = json.loads(json.dumps(load_model_config("qwen2.5-0.5b").raw))
    folder = tmp_path / "My-Qwen"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(raw))
    from_folder = load_model_config(str(folder))
    from_file = load_model_config(folder / "config.json")
    assert from_folder.name == from_file.name == "My-Qwen"
    assert from_folder == from_file
    assert from_folder.num_params == load_model_config("qwen2.5-0.5b").num_params


def test_folder_without_config_json(tmp_path):
    folder = tmp_path / "weights-only"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelConfigError, match="has no config.json"):
        load_model_config(folder)


def test_unsupported_architecture(tmp_path):
    raw = dict(load_model_config("llama-3.2-1b").raw, architectures=["GPT2LMHeadModel"])
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelConfigError) as e:
        load_model_config(tmp_path)
    msg = str(e.value)
    assert "GPT2LMHeadModel" in msg
    for arch in SUPPORTED_ARCHITECTURES:
        assert arch in msg
    assert isinstance(e.value, ValueError)


def test_unknown_name_lists_bundled():
    with pytest.raises(ModelConfigError) as e:
        load_model_config("llama-9-400b")
    assert "llama-9-400b" in str(e.value)
    for name in bundled_model_names():
        assert name in str(e.value)


def test_missing_key_and_bad_json(tmp_path):
    raw = dict(load_model_config("tiny-llama").raw)
    del raw["hidden_size"]
    with pytest.raises(ModelConfigError, match="hidden_size"):
        ModelConfig.from_hf_config(raw, name="broken")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="not valid JSON"):
        load_model_config(tmp_path)


def test_defaults_for_optional_keys():
    raw = dict(load_model_config("tiny-llama").raw)
    del raw["num_key_value_heads"]
    cfg = ModelConfig.from_hf_config(raw)
    assert cfg.num_key_value_heads == cfg.num_attention_heads == 4
    assert cfg.name == "LlamaForCausalLM"  # no name given and no _name_or_path


def test_scheduler_module_imports_no_heavy_deps():
    # scheduler/ must stay importable without torch, simpy or numpy.
    code = "import sys, scheduler.model_config; bad = {'torch', 'simpy', 'numpy'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
