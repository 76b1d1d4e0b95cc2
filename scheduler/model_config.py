"""Model architecture parsed from a Hugging Face ``config.json``.

The scheduler needs the model only for sizes (context length, KV bytes per
token); the simulator needs it for FLOPs and bytes; the real engine (engine/llama.py)
builds the network from it and may read anything else from ``raw``.

Configs of common models ship in ``scheduler/configs/`` as the published
``config.json`` files, so a dummy-weight run or a simulation needs no download.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

CONFIGS_DIR = Path(__file__).parent / "configs"

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
)

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}


class ModelConfigError(ValueError):
    """A config that cannot be found, parsed, or is of an unsupported architecture."""


@dataclass(frozen=True)
class ModelConfig:
    name: str
    architecture: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None = field(default=None, hash=False, compare=False)
    torch_dtype: str = "bfloat16"
    eos_token_id: tuple[int, ...] = ()
    bos_token_id: int | None = None
    # q/k/v projections carry a bias (always for Qwen2; the config's flag otherwise,
    # which in HF Llama/Mistral/Qwen3 also puts a bias on o_proj).
    attention_bias: bool = False
    # RMSNorm on each head of q and k before RoPE (Qwen3).
    qk_norm: bool = False
    # Sliding-window attention if the config enables it, else None (no model we ship uses it).
    sliding_window: int | None = None
    raw: dict = field(default_factory=dict, hash=False, compare=False, repr=False)
    # The local folder it was read from (weights, tokenizer), None for a bundled config.
    folder: str | None = field(default=None, hash=False, compare=False)

    # ----------------------------------------------------------------- parsing
    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], name: str | None = None) -> "ModelConfig":
        """Parse a config.json dict; raise ModelConfigError if unsupported or incomplete."""
        archs = cfg.get("architectures") or []
        if not archs:
            raise ModelConfigError(
                f"config of {name or 'model'!r} has no 'architectures' entry; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelConfigError(
                f"unsupported architecture {arch!r} (model {name or cfg.get('_name_or_path', '?')!r}); "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )

        def need(key: str) -> Any:
            if cfg.get(key) is None:
                raise ModelConfigError(f"config of {name!r} ({arch}) is missing {key!r}")
            return cfg[key]

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = cfg.get("head_dim")
        if head_dim is None:
            if hidden % heads:
                raise ModelConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
            head_dim = hidden // heads
        if heads % kv_heads:
            raise ModelConfigError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")

        eos = cfg.get("eos_token_id")
        eos_ids = tuple(int(e) for e in eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))

        # transformers 5 writes rope_parameters (rope_type, rope_theta, scaling keys) instead
        # of rope_theta and rope_scaling.
        rope_params = cfg.get("rope_parameters") or {}
        rope_theta = float(cfg.get("rope_theta") or rope_params.get("rope_theta") or 10000.0)
        rope_scaling = cfg.get("rope_scaling")
        if not rope_scaling and rope_params.get("rope_type", "default") != "default":
            rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        rope_scaling = dict(rope_scaling) if rope_scaling else None

        sliding = cfg.get("sliding_window")
        # Qwen2 configs carry a sliding_window value but switch it off with use_sliding_window.
        if cfg.get("use_sliding_window") is False:
            sliding = None

        return cls(
            name=name or str(cfg.get("_name_or_path") or arch),
            architecture=arch,
            hidden_size=hidden,
            num_hidden_layers=int(need("num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=int(head_dim),
            intermediate_size=int(need("intermediate_size")),
            vocab_size=int(need("vocab_size")),
            max_position_embeddings=int(need("max_position_embeddings")),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            # Newer transformers write "dtype" instead of "torch_dtype".
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
            eos_token_id=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
            attention_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            sliding_window=int(sliding) if sliding else None,
            raw=dict(cfg),
        )

    # ------------------------------------------------------------------- sizes
    @property
    def context_len(self) -> int:
        return self.max_position_embeddings

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of the checkpoint's dtype."""
        return _DTYPE_BYTES.get(self.torch_dtype, 2)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Total parameters: embedding + layers + final norm + lm_head (unless tied)."""
        return self.params_per_gpu(1)

    def kv_bytes_per_token(self, dtype_bytes: int = 2, tp: int = 1) -> int:
        """K and V of one token across all layers (on one of `tp` GPUs)."""
        return 2 * self.num_hidden_layers * self.kv_heads_per_gpu(tp) * self.head_dim * dtype_bytes

    def weight_bytes(self, dtype_bytes: int = 2, tp: int = 1, linear_bytes: int | None = None) -> int:
        """Weights (on one of `tp` GPUs). linear_bytes: bytes per weight of the decoder layers' matmul
        weights when they are quantized (fp8: 1), the rest (embedding, LM head, norms, biases) at
        dtype_bytes; None: every weight at dtype_bytes."""
        total = self.params_per_gpu(tp) * dtype_bytes
        if linear_bytes is not None:
            total -= self.num_hidden_layers * self.layer_matmul_params(tp) * (dtype_bytes - linear_bytes)
        return total

    # ------------------------------------------------------ tensor parallelism
    # As SGLang and vLLM split a Llama-family model over `tp` GPUs: attention heads, the MLP's
    # intermediate columns and the vocabulary are divided; KV heads are divided, or replicated
    # when there are more GPUs than KV heads; norms are replicated. TP 1 is the whole model.

    def check_tp(self, tp: int) -> None:
        """Raise ModelConfigError unless the model splits over `tp` GPUs."""
        heads, kv = self.num_attention_heads, self.num_key_value_heads
        if tp < 1:
            raise ModelConfigError(f"--tp must be >= 1, got {tp}")
        if heads % tp:
            raise ModelConfigError(f"--tp {tp} does not divide {self.name}'s {heads} attention heads")
        if kv % tp and tp % kv:
            raise ModelConfigError(
                f"--tp {tp}: {self.name}'s {kv} KV heads neither split evenly over {tp} GPUs "
                f"nor replicate evenly (TP must divide them or be a multiple of them)"
            )
        if self.intermediate_size % tp:
            raise ModelConfigError(f"--tp {tp} does not divide {self.name}'s intermediate size {self.intermediate_size}")

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        return max(1, self.num_key_value_heads // tp)

    def layer_matmul_params(self, tp: int = 1) -> int:
        """Matmul weights of one layer on one of `tp` GPUs."""
        h, q, kv = self.hidden_size, self.q_size // tp, self.kv_heads_per_gpu(tp) * self.head_dim
        return h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size // tp

    def layer_params(self, tp: int = 1) -> int:
        """Parameters of one decoder layer on one of `tp` GPUs: attention, SwiGLU MLP, two RMSNorms."""
        h, q, kv = self.hidden_size, self.q_size // tp, self.kv_heads_per_gpu(tp) * self.head_dim
        n = self.layer_matmul_params(tp) + 2 * h
        if self.attention_bias:
            n += q + 2 * kv
            if self.architecture != "Qwen2ForCausalLM":
                n += h  # o_proj bias
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    def params_per_gpu(self, tp: int = 1) -> int:
        """Parameters on one of `tp` GPUs: vocabulary-parallel embedding and lm_head, the layers' shards, final norm."""
        vocab_shard = -(-self.embedding_params // tp)
        n = vocab_shard + self.num_hidden_layers * self.layer_params(tp) + self.hidden_size
        if not self.tie_word_embeddings:
            n += vocab_shard
        return n


# --------------------------------------------------------------------- loading
def bundled_model_names() -> list[str]:
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.json"))


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path} is not valid JSON: {e}") from e


def load_model_config(name_or_path: str | Path) -> ModelConfig:
    """A bundled name (case-insensitive), a folder with config.json, or a config.json path."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise ModelConfigError(f"model folder {str(path)!r} has no config.json")
        return replace(ModelConfig.from_hf_config(_read_json(cfg_path), name=path.resolve().name), folder=str(path.resolve()))
    if path.is_file():
        # A config.json names its model by its folder; any other file by its stem.
        name = path.resolve().parent.name if path.name == "config.json" else path.stem
        folder = str(path.resolve().parent) if path.name == "config.json" else None
        return replace(ModelConfig.from_hf_config(_read_json(path), name=name), folder=folder)

    key = str(name_or_path).lower()
    if key in bundled_model_names():
        return ModelConfig.from_hf_config(_read_json(CONFIGS_DIR / f"{key}.json"), name=key)
    raise ModelConfigError(
        f"unknown model {str(name_or_path)!r}: not a bundled config, a folder, or a file; bundled: {', '.join(bundled_model_names())}"
    )
