"""Weight loading: HF safetensors folders load exactly; mismatches fail clearly; dummy init is seeded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from engine_helpers import TINY
from safetensors.torch import save_file

from engine.weights import WeightLoadError, init_dummy_weights, load_weights

if TYPE_CHECKING:  # transformers' model classes, imported where a test builds one (as engine_helpers does):
    # at the top, collecting this file took 2 s and 140 MB in every xdist worker
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM


def tiny_llama(seed: int, tied: bool = False) -> LlamaForCausalLM:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=tied)).eval()


def tiny_qwen2(seed: int) -> Qwen2ForCausalLM:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=False)).eval()


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}


def assert_same(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    got = state(model)
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


def assert_differs(model: torch.nn.Module, other: dict[str, torch.Tensor]) -> None:
    got = state(model)
    assert any(not torch.equal(got[n], t) for n, t in other.items() if n.endswith("proj.weight"))


def save(model: torch.nn.Module, folder: Path, **kwargs) -> Path:
    model.save_pretrained(folder, **kwargs)
    return folder


@pytest.mark.parametrize("tied", [False, True])
def test_single_file_roundtrip(tmp_path, tied):
    src = tiny_llama(0, tied)
    save(src, tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    dst = tiny_llama(1, tied)
    assert_differs(dst, state(src))
    load_weights(dst, tmp_path)
    assert_same(dst, state(src))
    if tied:
        assert dst.lm_head.weight is dst.model.embed_tokens.weight


@pytest.mark.parametrize("tied", [False, True])
def test_sharded_roundtrip(tmp_path, tied):
    src = tiny_llama(0, tied)
    save(src, tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    dst = tiny_llama(1, tied)
    load_weights(dst, str(tmp_path))  # str paths work too
    assert_same(dst, state(src))


def test_qwen2_biases_load(tmp_path):
    src = tiny_qwen2(0)
    assert src.model.layers[0].self_attn.q_proj.bias is not None
    save(src, tmp_path)
    dst = tiny_qwen2(1)
    load_weights(dst, tmp_path)
    assert_same(dst, state(src))


def test_tied_lm_head_in_checkpoint_is_ignored(tmp_path):
    """Some tied checkpoints still carry lm_head.weight: harmless for a tied model."""
    src = tiny_llama(0, tied=True)
    tensors = {n: t.contiguous() for n, t in state(src).items()}  # includes lm_head.weight
    assert "lm_head.weight" in tensors
    save_file(tensors, str(tmp_path / "model.safetensors"))
    dst = tiny_llama(1, tied=True)
    load_weights(dst, tmp_path)
    assert_same(dst, state(src))


def test_casts_to_param_dtype(tmp_path):
    src = tiny_llama(0).to(torch.bfloat16)
    save(src, tmp_path)
    dst = tiny_llama(1)  # float32
    load_weights(dst, tmp_path)
    for name, p in dst.named_parameters():
        assert p.dtype == torch.float32
        assert torch.equal(p, state(src)[name].float()), name


def test_rotary_inv_freq_key_ignored(tmp_path):
    src = tiny_llama(0)
    tensors = {n: t.contiguous() for n, t in state(src).items()}
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    dst = tiny_llama(1)
    load_weights(dst, tmp_path)
    assert_same(dst, state(src))


def test_missing_key_raises(tmp_path):
    tensors = {n: t.contiguous() for n, t in state(tiny_llama(0)).items()}
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightLoadError, match=r"model\.layers\.1\.mlp\.up_proj\.weight") as err:
        load_weights(tiny_llama(1), tmp_path)
    assert str(tmp_path) in str(err.value)


def test_untied_model_needs_lm_head(tmp_path):
    save(tiny_llama(0, tied=True), tmp_path)  # checkpoint omits lm_head.weight
    with pytest.raises(WeightLoadError, match=r"lm_head\.weight"):
        load_weights(tiny_llama(1, tied=False), tmp_path)


def test_unknown_key_raises(tmp_path):
    tensors = {n: t.contiguous() for n, t in state(tiny_llama(0)).items()}
    tensors["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(4, 4)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightLoadError, match=r"extra_proj\.weight.*no parameter") as err:
        load_weights(tiny_llama(1), tmp_path)
    assert str(tmp_path) in str(err.value)


def test_shape_mismatch_raises(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    save(tiny_llama(0), tmp_path)
    cfg = LlamaConfig(**{**TINY, "intermediate_size": 96})
    with pytest.raises(WeightLoadError, match=r"shape mismatch for 'model\.layers\.0\.mlp\.\w+_proj\.weight'"):
        load_weights(LlamaForCausalLM(cfg), tmp_path)


def test_no_safetensors_raises(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(WeightLoadError, match=r"no \*\.safetensors weights; use --load-format dummy"):
        load_weights(tiny_llama(0), tmp_path)


def test_not_a_folder_raises(tmp_path):
    with pytest.raises(WeightLoadError, match="not a folder"):
        load_weights(tiny_llama(0), tmp_path / "nope")


def test_index_naming_missing_shard_raises(tmp_path):
    save(tiny_llama(0), tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[0]
    (tmp_path / victim).unlink()
    with pytest.raises(WeightLoadError, match=victim):
        load_weights(tiny_llama(1), tmp_path)


def test_dummy_is_deterministic_and_seeded():
    a, b, c = tiny_llama(0), tiny_llama(1), tiny_llama(2)
    init_dummy_weights(a, seed=7)
    init_dummy_weights(b, seed=7)
    init_dummy_weights(c, seed=8)
    assert_same(b, state(a))
    assert_differs(c, state(a))


def test_dummy_values_and_norms():
    model = tiny_qwen2(0)
    init_dummy_weights(model, seed=0)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.all(p == 1.0), name
        else:
            assert p.abs().max() <= 1e-3, name
            assert p.std() > 1e-4, name  # really random, not constant


def test_dummy_independent_of_parameter_order_and_tying():
    """The draw is keyed by parameter name: a tied model gets the same values
    as an untied one for every shared name."""
    untied, tied = tiny_llama(0, tied=False), tiny_llama(1, tied=True)
    init_dummy_weights(untied, seed=3)
    init_dummy_weights(tied, seed=3)
    expected = state(untied)
    for name, p in tied.named_parameters():
        assert torch.equal(p, expected[name]), name
    assert tied.lm_head.weight is tied.model.embed_tokens.weight


def test_dummy_forward_is_finite():
    model = tiny_llama(0)
    init_dummy_weights(model, seed=0)
    with torch.no_grad():
        logits = model(torch.arange(16).unsqueeze(0)).logits
    assert torch.isfinite(logits).all()
