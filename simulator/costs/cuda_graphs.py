"""Which forwards a serving engine replays from a CUDA graph, and which it runs eagerly.

Per-kernel timings (AIConfigurator's database) leave out what an eager forward costs beyond
its kernels: launching every kernel of every layer from Python. A CUDA graph replays them in
one launch. Which forwards get a graph is the engine's rule, not the GPU's:

- vLLM v1 (0.19): graphs for every batch of at most min(2 x max_num_seqs, 512) tokens
  (`max_cudagraph_capture_size`; FULL graphs for uniform decode batches, piecewise graphs for
  prefill and mixed ones); larger forwards run eagerly. `cudagraph_mode` FULL_DECODE_ONLY
  captures decode-only batches alone, NONE nothing.
- SGLang: graphs for decode batches up to `cuda_graph_max_bs` (its default follows the GPU's
  memory and TP: scheduler/sglang/server_defaults.py); extend and mixed batches run eagerly
  (piecewise prefill graphs are off by default).

A kernel profile's eager dispatch (simulator/profiles/eager_dispatch.py) sets the least time of
every forward the policy says runs eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.forward_plan import ForwardMode, ForwardPlan

VLLM_MAX_CAPTURE_TOKENS = 512
SGLANG_CUDA_GRAPH_MAX_BS = 160  # SGLang's default where the device memory is unknown (server_args 0.5.9)


@dataclass(frozen=True)
class CudaGraphPolicy:
    max_tokens: int  # forwards of at most this many new tokens can replay a graph
    decode_only: bool  # only decode batches are captured (SGLang)

    def captured(self, plan: ForwardPlan) -> bool:
        return self.captures(plan.mode, plan.num_tokens)

    def captures(self, mode: ForwardMode, num_tokens: int) -> bool:
        if self.decode_only and mode is not ForwardMode.DECODE:
            return False
        return num_tokens <= self.max_tokens


# vLLM's compilation config cudagraph_mode values. PIECEWISE graphs leave attention outside the
# graph, a few launches a layer: priced as captured, as FULL ones are.
VLLM_CUDAGRAPH_MODES = ("FULL_AND_PIECEWISE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "NONE")


def vllm_graphs(max_num_seqs: int, max_capture_size: int | None = None, mode: str | None = None) -> CudaGraphPolicy:
    """max_capture_size None: vLLM's default, min(2 x max_num_seqs, 512); mode None: FULL_AND_PIECEWISE."""
    size = min(2 * max_num_seqs, VLLM_MAX_CAPTURE_TOKENS) if max_capture_size is None else max_capture_size
    if mode == "NONE":
        size = 0
    return CudaGraphPolicy(size, decode_only=mode == "FULL_DECODE_ONLY")


def sglang_graphs(max_bs: int = SGLANG_CUDA_GRAPH_MAX_BS) -> CudaGraphPolicy:
    """max_bs: `--cuda-graph-max-bs`, whose default follows the device memory and TP
    (scheduler/sglang/server_defaults.py)."""
    return CudaGraphPolicy(max_bs, decode_only=True)
