"""The database's MoE table that prices a checkpoint whose own format quantizes the routed experts only.

gpt-oss's checkpoint stores its routed experts in MXFP4 (4-bit e2m1 weights, one e8m0 scale per 32) and
keeps attention, the router, the embedding and the LM head in bf16 (its quantization_config's
modules_to_not_convert). vLLM serves it so without --quantization: its MXFP4 MoE oracle
(fused_moe/oracle/mxfp4.py) takes, by default, FlashInfer's TRT-LLM MXFP4 x bf16 kernel on Blackwell and
OpenAI's triton MXFP4 kernel on Hopper, both with bf16 activations; the other GEMMs are bf16. The database
measured those MoE kernels as MoEQuantMode `w4a16_mxfp4` (kernel_source
vllm_gptossmxfp4moe_flashinfer_trtllm_mxfp4_bf16_... on B200, vllm_gptossmxfp4moe_triton_... on H100 and
H200, at gpt-oss's shapes), the mode AIConfigurator's SDK gives an mxfp4 checkpoint's experts too
(sdk/models/helpers.py: quant_method mxfp4 -> GEMMs bfloat16, MoE w4a16_mxfp4).
"""

from __future__ import annotations

from simulator.costs.precision import MXFP4

# A checkpoint format -> the MoEQuantMode of the database's rows of its experts' kernel (a format not
# named here is its own mode: fp8, fp8_block, nvfp4).
MOE_QUANT_MODES = {MXFP4: "w4a16_mxfp4"}


def expert_quant_mode(weights: str) -> str:
    """The database's MoE quant mode that prices experts stored in `weights` (a checkpoint's format)."""
    return MOE_QUANT_MODES.get(weights, weights)
