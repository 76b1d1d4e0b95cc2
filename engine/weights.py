"""Model weights: stream a Hugging Face safetensors folder, or draw dummy ones.

The model's parameter names are the checkpoint's names (the Llama family, and the
experts of Qwen3-MoE and Mixtral one by one, as checkpoints hold them), so loading
is a name-by-name copy. Tensors are read one at a time with
`safe_open`, never as a whole state dict, so peak host memory stays at one
tensor whatever the model size.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

INDEX_FILE = "model.safetensors.index.json"

# Checkpoint keys a model may lack without harm: rotary tables that old
# checkpoints saved (the model recomputes them).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.original_inv_freq")

# Dummy weights: vLLM's `--load-format dummy` range.
DUMMY_LOW, DUMMY_HIGH = -1e-3, 1e-3
# Dummy weights are drawn in chunks of at most this many elements, so a large
# embedding never needs a second full-size fp32 copy on the host.
DUMMY_CHUNK = 1 << 24


class WeightLoadError(ValueError):
    """The checkpoint does not fit the model."""


def safetensors_files(folder: Path) -> list[Path]:
    """The shard files of a folder: those the index names, else every *.safetensors."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
        for f in files:
            if not f.is_file():
                raise WeightLoadError(f"{index} names {f.name}, which is missing from {folder}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"{folder} has no *.safetensors weights; use --load-format dummy")
    return files


def _param_aliases(model: nn.Module) -> dict[str, nn.Parameter]:
    """Every name of every parameter, tied ones included (lm_head -> embed_tokens)."""
    return dict(model.named_parameters(remove_duplicate=False))


def _canonical_names(params: dict[str, nn.Parameter]) -> dict[str, str]:
    """Map each name to one name per distinct parameter, preferring a non-lm_head
    alias, so a tied lm_head counts as loaded once embed_tokens is."""
    by_id: dict[int, list[str]] = {}
    for name, p in params.items():
        by_id.setdefault(id(p), []).append(name)
    canon: dict[str, str] = {}
    for names in by_id.values():
        head = sorted(names, key=lambda n: (n.startswith("lm_head."), n))[0]
        canon.update({n: head for n in names})
    return canon


def _checkpoint_keys(files: list[Path]) -> Iterator[tuple[Path, str, safe_open]]:
    """(file, key, open handle) for every tensor; the tensor is read only on demand."""
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():
                yield path, key, f


def load_weights(model: nn.Module, folder: str | Path) -> None:
    """Copy every tensor of the safetensors checkpoint in `folder` into `model`.

    Raises WeightLoadError on an unknown key, a shape mismatch or a parameter
    the checkpoint lacks (a tied lm_head excepted)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise WeightLoadError(f"{folder} is not a folder")
    params = _param_aliases(model)
    canon = _canonical_names(params)
    loaded: set[str] = set()  # canonical names
    with torch.no_grad():
        for path, key, f in _checkpoint_keys(safetensors_files(folder)):
            param = params.get(key)
            if param is None:
                if key.endswith(IGNORED_SUFFIXES):
                    continue
                raise WeightLoadError(f"checkpoint key {key!r} in {path} has no parameter in the model")
            if canon[key] != key and canon[key] in loaded:
                continue  # a tied alias (lm_head) of a loaded parameter: same storage
            tensor = f.get_tensor(key)
            if tensor.shape != param.shape:
                raise WeightLoadError(f"shape mismatch for {key!r} in {path}: checkpoint {tuple(tensor.shape)}, model {tuple(param.shape)}")
            param.data.copy_(tensor)  # casts dtype, moves to the param's device
            loaded.add(canon[key])
    missing = sorted(set(canon.values()) - loaded)
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise WeightLoadError(f"{folder} lacks weights for {len(missing)} parameter(s): {', '.join(missing[:5])}{more}")


def _is_norm_weight(name: str) -> bool:
    """RMSNorm scales (input_layernorm, q_norm, model.norm, ...) start at 1."""
    module, _, leaf = name.rpartition(".")
    return leaf == "weight" and module.rpartition(".")[2].endswith("norm")


def _name_seed(seed: int, name: str) -> int:
    """A generator seed per (seed, parameter name): the draw for a parameter does
    not depend on the model's parameter order, so two implementations with the
    same names (ours and transformers') get the same dummy weights."""
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _uniform_chunks(n: int, gen: torch.Generator) -> Iterator[torch.Tensor]:
    for start in range(0, n, DUMMY_CHUNK):
        size = min(DUMMY_CHUNK, n - start)
        yield torch.empty(size, dtype=torch.float32, device=gen.device).uniform_(DUMMY_LOW, DUMMY_HIGH, generator=gen)


def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Deterministic random weights, as `--load-format dummy` does for benchmarks.

    Uniform in [-1e-3, 1e-3] (norm scales 1.0, so activations stay sane), drawn
    from a seeded generator per parameter on the parameter's device, then copied in
    place: the same values on every run of a device type. CUDA draws on the GPU, not
    the CPU: an 8B model's draw on the CPU took ~40 s of every engine start on an H100
    machine (and calibrate starts three)."""
    params = _param_aliases(model)
    canon = _canonical_names(params)
    with torch.no_grad():
        for name in sorted(set(canon.values())):
            param = params[name]
            if not param.is_floating_point():
                continue
            if _is_norm_weight(name):
                param.data.fill_(1.0)
                continue
            gen = torch.Generator(device=param.device).manual_seed(_name_seed(seed, name))
            # Fill a flat view chunk by chunk (params are contiguous; the rare
            # non-contiguous one goes through a full-size staging copy).
            contiguous = param.data.is_contiguous()
            target = param.data.view(-1) if contiguous else torch.empty(param.numel())
            offset = 0
            for chunk in _uniform_chunks(param.numel(), gen):
                target[offset : offset + chunk.numel()].copy_(chunk)
                offset += chunk.numel()
            if not contiguous:
                param.data.copy_(target.view(param.shape))
