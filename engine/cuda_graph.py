"""Decode forwards replayed from CUDA graphs, as SGLang's CudaGraphRunner does.

An eager forward launches every kernel of every layer from Python: about 1,600 for an 8B
Llama. On an H200 that took the host 23-25 ms a decode step at any batch size from 1 to 128,
against 5-13 ms of kernels (benchmarks/gpu_check.sh, 2026-11-26). A graph replays them all
in one launch.

A graph's tensors have fixed shapes, so a decode batch is padded twice:
- to the next captured batch size; a padding request writes its K/V to the scratch slot and
  reads one key, and its output is dropped;
- to the next captured context length, since the torch backend reads every request's KV
  padded to the longest (engine/attention.py); the padding keys are masked.
Graphs cover decode batches up to SGLang's cuda_graph_max_bs for the device's memory (256 on an
H100 or H200) and the lengths whose padded
KV fits a bound (below); anything else runs eagerly. The graph ends at the final norm: the
vocab-wide projection and sampling run eagerly after it, so no graph keeps a [batch, vocab]
output alive. Only the torch attention backend is captured (flashinfer's decode wrapper
needs its own graph-safe plan). A mixture of experts' block runs every expert densely in a
graph (engine/moe.py): its eager path sizes each expert's matmul by the routing, which a
graph cannot replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from engine.attention import TorchAttention
from engine.forward_batch import ForwardBatch
from engine.kv_cache import KVCache
from engine.llama import LlamaForCausalLM
from scheduler.core.forward_plan import ForwardMode, ForwardPlan, synthetic_plan
from scheduler.sglang.server_defaults import default_cuda_graph_max_bs

# SGLang captures batch sizes 1, 2, 4, 8 and then steps of 8 (16 up to 256 on large GPUs);
# powers of two keep the count of graphs (each a few tens of ms to capture) small.
CAPTURE_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SHORTEST_CONTEXT = 256  # the smallest padded context; then doubling, up to the request table's row
# The torch backend gathers each request's padded K and V per layer: batch x context keys.
# At 2^19 keys an 8B Llama's gather takes 2 GiB (K and V, bf16), inside the ~10-17 GB that the
# KV pool leaves free on an 80-141 GB GPU at mem_fraction_static 0.88.
MAX_PADDED_KEYS = 1 << 19
# Without a GPU (capture=False, the tests on a CPU) the batch sizes are those of an 80 GB one.
STAND_IN_MEMORY = 80 << 30


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    hidden: torch.Tensor  # [batch, hidden]: the graph's output, rewritten by each replay


class DecodeGraphs:
    """A graph per (padded batch, padded context), captured by capture_all before the first
    request (or else on first use), replayed after.

    With capture=False (a CPU, which has no graphs) every step runs the same padded forward
    eagerly: how the tests check the padding on a machine without a GPU."""

    def __init__(self, model: LlamaForCausalLM, attn: TorchAttention, cache: KVCache, max_batch: int, capture: bool = True) -> None:
        self.model, self.attn, self.cache, self.capture = model, attn, cache, capture
        device = cache.device
        memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else STAND_IN_MEMORY
        self.batch_sizes = [b for b in CAPTURE_BATCH_SIZES if b <= min(max_batch, default_cuda_graph_max_bs(memory))]
        row_len = cache.req_to_token.shape[1]
        self.contexts: list[int] = []
        context = SHORTEST_CONTEXT
        while context < row_len:
            self.contexts.append(context)
            context *= 2
        self.contexts.append(row_len)
        largest = self.batch_sizes[-1] if self.batch_sizes else 0
        # Inputs every graph reads, at fixed addresses; a batch is copied in before a replay.
        self.input_ids = torch.zeros(largest, dtype=torch.int64, device=device)
        self.positions = torch.zeros(largest, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.full((largest,), cache.pad_slot, dtype=torch.int64, device=device)
        self.req_pool_indices = torch.zeros(largest, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(largest, dtype=torch.int64, device=device)
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        # One stream for every capture's warm-up run: the caching allocator keeps a stream's
        # freed blocks for that stream, so a new stream per capture kept each one's memory.
        self.warm_up_stream = torch.cuda.Stream(device) if capture else None
        self.too_large: set[tuple[int, int]] = set()  # their warm-up ran out of memory: eager
        self.replays = 0

    def shapes(self) -> list[tuple[int, int]]:
        """Every (batch, context) that shape_for can return, largest first."""
        pairs = [(b, c) for b in self.batch_sizes for c in self.contexts if b * c <= MAX_PADDED_KEYS]
        return sorted(pairs, key=lambda shape: shape[0] * shape[1], reverse=True)

    def capture_all(self) -> None:
        """Capture every graph before the first request, as SGLang's CudaGraphRunner does at
        start: a capture on first use stalls the step that meets the shape by a warm-up forward
        and a capture (tens of ms). Largest first: the smaller graphs then reuse its pool's blocks."""
        if not self.capture:
            return
        plan = synthetic_plan(ForwardMode.DECODE, [1], [1], with_rows=False)
        with torch.inference_mode():  # as forwards run: no autograd graph holding each layer's tensors
            for shape in self.shapes():
                if shape not in self.graphs and shape not in self.too_large:
                    self._capture(shape, plan)

    def shape_for(self, plan: ForwardPlan) -> tuple[int, int] | None:
        """The (batch, context) graph that runs plan, or None where it runs eagerly."""
        if plan.mode is not ForwardMode.DECODE:
            return None
        batch = next((b for b in self.batch_sizes if b >= plan.batch_size), None)
        context = next((c for c in self.contexts if c >= plan.max_seq_len), None)
        if batch is None or context is None or batch * context > MAX_PADDED_KEYS or (batch, context) in self.too_large:
            return None
        return batch, context

    def run(self, shape: tuple[int, int], batch: ForwardBatch) -> torch.Tensor:
        """The last hidden states [B, hidden] of batch, from the graph of shape."""
        size, n = shape, batch.batch_size
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.out_cache_loc[:n].copy_(batch.out_cache_loc)
        self.req_pool_indices[:n].copy_(batch.req_pool_indices)
        self.seq_lens[:n].copy_(batch.seq_lens)
        padded = size[0]
        if n < padded:  # padding requests: position 0, one key, writes to the scratch slot
            self.input_ids[n:padded].zero_()
            self.positions[n:padded].zero_()
            self.out_cache_loc[n:padded].fill_(self.cache.pad_slot)
            self.req_pool_indices[n:padded].zero_()
            self.seq_lens[n:padded].fill_(1)
        self.replays += 1
        graph = self.graphs.get(shape) or (self._capture(shape, batch.plan) if self.capture else None)
        if graph is None:  # no graphs (a CPU), or too large for the memory left: the padded forward, eagerly
            return self._body(shape, batch.plan)()[:n]
        graph.graph.replay()
        return graph.hidden[:n]

    def _body(self, shape: tuple[int, int], plan: ForwardPlan) -> Callable[[], torch.Tensor]:
        """The padded forward of shape over the static inputs: what a graph captures."""
        padded, context = shape
        static = ForwardBatch(
            plan=plan,
            mode=ForwardMode.DECODE,
            input_ids=self.input_ids[:padded],
            positions=self.positions[:padded],
            out_cache_loc=self.out_cache_loc[:padded],
            req_pool_indices=self.req_pool_indices[:padded],
            seq_lens=self.seq_lens[:padded],
            last_token_index=torch.arange(padded, device=self.cache.device),
            graph_safe=True,
        )

        def body() -> torch.Tensor:
            self.attn.batch = static
            self.attn.prepare_decode(static.req_pool_indices, static.seq_lens, context)
            return self.model.last_hidden(static, self.attn)

        return body

    def _capture(self, shape: tuple[int, int], plan: ForwardPlan) -> _Graph | None:
        """The graph of shape, or None (and shape runs eagerly from now on) where its warm-up
        run finds too little GPU memory beside the KV pool and the graphs already captured."""
        body = self._body(shape, plan)
        # A warm-up run on a side stream first, as torch's graph docs ask: it loads the kernels
        # and lets the allocator settle before capture. It rewrites the batch's own K/V slots
        # with the same values.
        device, stream = self.cache.device, self.warm_up_stream
        stream.wait_stream(torch.cuda.current_stream(device))
        try:
            with torch.cuda.stream(stream):
                body()
        except torch.OutOfMemoryError:
            self.too_large.add(shape)
            return None
        finally:
            torch.cuda.current_stream(device).wait_stream(stream)
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()  # the warm-up's blocks back, for the graph's pool to take
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden = body()
        captured = _Graph(graph, hidden)
        self.graphs[shape] = captured
        return captured
