"""Weights and KV-cache precision: `--quantization` and `--kv-cache-dtype`, as SGLang and vLLM take them.

    --quantization fp8         the linear layers' weights in fp8 (1 byte a weight), as SGLang's and
                               vLLM's `--quantization fp8` quantize a bf16 checkpoint when it loads:
                               one scale per weight matrix (per tensor), activations quantized to fp8
                               on the fly (dynamic), the GEMMs on fp8 tensor cores. The embedding and
                               the LM head stay in the model's dtype: both engines give fp8 methods to
                               linear layers only (`Fp8Config.get_quant_method`: `LinearBase`; the
                               vocabulary-parallel embedding and LM head are not), and so do the
                               norms and biases. Unset: the model's dtype.
    --quantization fp8_block   the linear layers' weights in fp8 with one scale per 128x128 block (DeepSeek-style,
                               as block-quantized FP8 checkpoints carry them: `weight_block_size` [128, 128]),
                               activations quantized per 128-wide group: the database's `fp8_block` GEMMs
                               (SGLang's and vLLM's block-scaled fp8 kernels). 1 byte a weight (the block
                               scales, 4 bytes per 16,384 weights, are left out).
    --quantization nvfp4       the linear layers' weights in NVFP4 (4-bit e2m1 with one fp8 scale per 16
                               weights, as NVIDIA's ModelOpt FP4 checkpoints carry them: vLLM's and SGLang's
                               `modelopt_fp4`): the database's `nvfp4` GEMMs, on the fp4 tensor cores of
                               Blackwell (B200, B300, GB200). 0.5625 bytes a weight (half a byte plus its
                               share of a scale). A GPU without fp4 tensor cores has no such GEMMs in the
                               database, and a kernel profile refuses it.
    --kv-cache-dtype auto      the KV cache in the model's dtype (default); bf16: bfloat16; fp8:
                               fp8 (e4m3, SGLang's `fp8_e4m3`, vLLM's `fp8`), 1 byte an element, so
                               the same memory holds twice the tokens.

A model's dtype is its config's `torch_dtype`, served as the engines' `--dtype auto` serves it: a
float16 checkpoint in float16, anything else in bfloat16 (a float32 config, as tiny-llama's, in 16
bits too: the simulator prices every 16-bit type at 2 bytes).

A checkpoint stored quantized is served in its own format when --quantization is unset, as both
engines load it (ModelConfig.checkpoint_quantization, from its config's quantization_config):
DeepSeek-V3/R1's block-scaled fp8 (fp8_block), and gpt-oss's MXFP4 experts (`mxfp4`: 4-bit e2m1
with one 8-bit scale per 32 weights, 0.53125 bytes a weight, the routed experts only, attention and
router in bf16 as its modules_to_not_convert says; GEMMs on fp4 tensor cores where the GPU has them,
else weight-only in bf16, as the engines' MXFP4 MoE kernels run on Hopper). mxfp4 is a checkpoint's
format only, not a --quantization choice. The bundled dense configs are 16-bit checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

FP8 = "fp8"
FP8_BLOCK = "fp8_block"
NVFP4 = "nvfp4"
MXFP4 = "mxfp4"  # a checkpoint's format (gpt-oss's experts), not a --quantization choice
BF16 = "bfloat16"
# --quantization's values (unset: none). Each names the database's GEMM table of that format too.
QUANTIZATIONS = (FP8, FP8_BLOCK, NVFP4)
KV_CACHE_DTYPES = ("auto", "bf16", FP8)  # --kv-cache-dtype's values
# Bytes of one element: fp8 (e4m3) is 1, the 16-bit types 2. fp8's per-tensor scales (one float a
# weight matrix, one a layer for K and V) are left out: a few KB against GBs.
BYTES = {BF16: 2, "float16": 2, FP8: 1, FP8_BLOCK: 1, NVFP4: 0.5625, MXFP4: 0.53125}
# Weight formats a checkpoint may be stored in (ModelConfig.checkpoint_quantization).
CHECKPOINT_FORMATS = (*QUANTIZATIONS, MXFP4)


def served_dtype(torch_dtype: str) -> str:
    """The 16-bit dtype the engines serve a checkpoint in with --dtype auto (float16 stays float16)."""
    return "float16" if torch_dtype == "float16" else BF16


@dataclass(frozen=True)
class Precision:
    """The dtype of the linear layers' weights and of the KV cache (bfloat16, float16 or fp8)."""

    weights: str = BF16
    kv_cache: str = BF16
    # The weights' format covers the routed experts only (a checkpoint such as gpt-oss's), not every linear layer.
    experts_only: bool = False

    @classmethod
    def resolve(
        cls,
        torch_dtype: str,
        quantization: str | None = None,
        kv_cache_dtype: str = "auto",
        checkpoint: str | None = None,
        checkpoint_experts_only: bool = False,
    ) -> "Precision":
        """The precision a replay asks for: its model's dtype, `--quantization` and `--kv-cache-dtype`;
        unset --quantization, the checkpoint's own format (`checkpoint`, ModelConfig.checkpoint_quantization:
        None for 16-bit weights) where given. An unknown value raises ValueError (the options' parser refuses it first)."""
        if quantization not in (None, *QUANTIZATIONS):
            raise ValueError(f"--quantization {quantization}: choose one of {', '.join(QUANTIZATIONS)} (or leave it unset)")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype {kv_cache_dtype}: choose one of {', '.join(KV_CACHE_DTYPES)}")
        model = served_dtype(torch_dtype)
        kv = {"auto": model, "bf16": BF16, FP8: FP8}[kv_cache_dtype]
        if quantization is None and checkpoint in CHECKPOINT_FORMATS:
            return cls(checkpoint, kv, experts_only=checkpoint_experts_only)
        return cls(quantization or model, kv)

    @property
    def quantized_weights(self) -> bool:
        """The linear layers' weights in one of --quantization's formats or a checkpoint's (not the model's 16-bit dtype)."""
        return self.weights in CHECKPOINT_FORMATS

    @property
    def fp8_weights(self) -> bool:
        """fp8 weights, per tensor or per block: GEMMs on the fp8 tensor cores."""
        return self.weights in (FP8, FP8_BLOCK)

    @property
    def fp8_kv(self) -> bool:
        return self.kv_cache == FP8

    @property
    def linear_weight_bytes(self) -> float:
        return BYTES.get(self.weights, 2)

    @property
    def kv_bytes(self) -> int:
        return BYTES.get(self.kv_cache, 2)

    def same_bytes(self, other: "Precision") -> bool:
        """The same costs and KV pool: the same weight format (bfloat16 and float16 both 2 bytes, the same
        GEMMs) and fp8 KV or not."""

        def weights(p: "Precision") -> str:
            return p.weights if p.quantized_weights else BF16

        return (weights(self), self.fp8_kv) == (weights(other), other.fp8_kv)

    def describe(self) -> str:
        return f"{self.weights}{' expert' if self.experts_only else ''} weights and {self.kv_cache} KV cache"

    def to_dict(self) -> dict[str, str | bool]:
        return {"weights": self.weights, "kv_cache": self.kv_cache} | ({"experts_only": True} if self.experts_only else {})
