"""Weights and KV-cache precision: `--quantization` and `--kv-cache-dtype`, as SGLang and vLLM take them.

    --quantization fp8         the linear layers' weights in fp8 (1 byte a weight), as SGLang's and
                               vLLM's `--quantization fp8` quantize a bf16 checkpoint when it loads:
                               one scale per weight matrix (per tensor), activations quantized to fp8
                               on the fly (dynamic), the GEMMs on fp8 tensor cores. The embedding and
                               the LM head stay in the model's dtype: both engines give fp8 methods to
                               linear layers only (`Fp8Config.get_quant_method`: `LinearBase`; the
                               vocabulary-parallel embedding and LM head are not), and so do the
                               norms and biases. Unset: the model's dtype.
    --kv-cache-dtype auto      the KV cache in the model's dtype (default); bf16: bfloat16; fp8:
                               fp8 (e4m3, SGLang's `fp8_e4m3`, vLLM's `fp8`), 1 byte an element, so
                               the same memory holds twice the tokens.

A model's dtype is its config's `torch_dtype`, served as the engines' `--dtype auto` serves it: a
float16 checkpoint in float16, anything else in bfloat16 (a float32 config, as tiny-llama's, in 16
bits too: the simulator prices every 16-bit type at 2 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

FP8 = "fp8"
BF16 = "bfloat16"
QUANTIZATIONS = (FP8,)  # --quantization's values (unset: none)
KV_CACHE_DTYPES = ("auto", "bf16", FP8)  # --kv-cache-dtype's values
# Bytes of one element: fp8 (e4m3) is 1, the 16-bit types 2. fp8's per-tensor scales (one float a
# weight matrix, one a layer for K and V) are left out: a few KB against GBs.
BYTES = {BF16: 2, "float16": 2, FP8: 1}


def served_dtype(torch_dtype: str) -> str:
    """The 16-bit dtype the engines serve a checkpoint in with --dtype auto (float16 stays float16)."""
    return "float16" if torch_dtype == "float16" else BF16


@dataclass(frozen=True)
class Precision:
    """The dtype of the linear layers' weights and of the KV cache (bfloat16, float16 or fp8)."""

    weights: str = BF16
    kv_cache: str = BF16

    @classmethod
    def resolve(cls, torch_dtype: str, quantization: str | None = None, kv_cache_dtype: str = "auto") -> "Precision":
        """The precision a replay asks for: its model's dtype, `--quantization` and `--kv-cache-dtype`.
        An unknown value raises ValueError (the options' parser refuses it first)."""
        if quantization not in (None, *QUANTIZATIONS):
            raise ValueError(f"--quantization {quantization}: choose {' or '.join(QUANTIZATIONS)} (or leave it unset)")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype {kv_cache_dtype}: choose one of {', '.join(KV_CACHE_DTYPES)}")
        model = served_dtype(torch_dtype)
        kv = {"auto": model, "bf16": BF16, FP8: FP8}[kv_cache_dtype]
        return cls(FP8 if quantization == FP8 else model, kv)

    @property
    def fp8_weights(self) -> bool:
        return self.weights == FP8

    @property
    def fp8_kv(self) -> bool:
        return self.kv_cache == FP8

    @property
    def linear_weight_bytes(self) -> int:
        return BYTES.get(self.weights, 2)

    @property
    def kv_bytes(self) -> int:
        return BYTES.get(self.kv_cache, 2)

    def same_bytes(self, other: "Precision") -> bool:
        """The same costs and KV pool: fp8 or not, for weights and KV (bfloat16 and float16 both 2 bytes)."""
        return (self.fp8_weights, self.fp8_kv) == (other.fp8_weights, other.fp8_kv)

    def describe(self) -> str:
        return f"{self.weights} weights and {self.kv_cache} KV cache"

    def to_dict(self) -> dict[str, str]:
        return {"weights": self.weights, "kv_cache": self.kv_cache}
