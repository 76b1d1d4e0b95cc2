"""ModelRunner: runs one ForwardPlan on the model and returns the sampled token ids.

It owns the model, the device KV cache, the attention backend and the future
map: in overlap mode the scheduler names the tokens of batch N by future
indices before they exist; batch N+1's input ids carry -index, resolved here on
the device from the tokens batch N stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.attention import AttentionBackend, TorchAttention, sdpa_backends
from engine.cuda_graph import DecodeGraphs
from engine.device import DeviceChoice
from engine.forward_batch import ForwardBatch, ids_tensor
from engine.kv_cache import KVCache
from engine.llama import LlamaForCausalLM
from engine.sampler import SamplingBatch, sample
from engine.support import BUILT, engine_refusal
from engine.weights import init_dummy_weights, load_weights
from scheduler.core.forward_plan import ForwardMode, ForwardPlan, synthetic_plan
from scheduler.core.future_indices import FUTURE_MAP_SIZE
from scheduler.model_config import ModelConfig

LOAD_FORMATS = ("auto", "dummy")


@dataclass(frozen=True)
class EngineConfig:
    load_format: str = "auto"  # auto: weights from the model folder; dummy: random (SGLang's name)
    seed: int = 0
    kv_tokens: int | None = None  # None: from device memory (CUDA) or kv_memory_gb (CPU)
    mem_fraction_static: float = 0.88  # CUDA: share of device memory for weights + KV
    kv_memory_gb: float = 1.0  # CPU: memory budget of the KV cache
    # CPU: torch intra-op threads; None keeps torch's default (one per core), which ran the
    # example trace's large padded decode batches 4x faster than one thread here.
    cpu_threads: int | None = None
    cuda_graph: bool = True  # CUDA, torch attention: decode batches replay graphs (SGLang's default; --disable-cuda-graph)


def _host_memory_available() -> int | None:
    """Bytes the host can still give (Linux's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_weights_fit(model_cfg: ModelConfig, choice: DeviceChoice) -> None:
    """ValueError, before any allocation, if the weights alone exceed the device's free memory:
    a bundled 30B mixture of experts on a laptop's CPU fails in one line, not by the OOM killer."""
    need = model_cfg.num_params * torch.finfo(choice.dtype).bits // 8
    if choice.device.type == "cuda":
        free: int | None = torch.cuda.mem_get_info(choice.device)[0]
    else:
        free = _host_memory_available()
    if free is not None and need > free:
        dtype = str(choice.dtype).removeprefix("torch.")
        raise ValueError(
            f"{model_cfg.name}'s weights take {need / 2**30:.1f} GiB in {dtype}, more than the {free / 2**30:.1f} GiB "
            f"free on {choice.device}"
        )


class ModelRunner:
    def __init__(self, model_cfg: ModelConfig, choice: DeviceChoice, cfg: EngineConfig, weights_folder: str | Path | None) -> None:
        refusal = engine_refusal(model_cfg)  # testbed/backends.py refuses these first, in one line
        if refusal:
            raise ValueError(f"{refusal}; the engine builds {BUILT}")
        check_weights_fit(model_cfg, choice)
        self.model_cfg, self.choice, self.cfg = model_cfg, choice, cfg
        self.device, self.dtype = choice.device, choice.dtype
        if self.device.type == "cpu" and cfg.cpu_threads is not None:
            torch.set_num_threads(cfg.cpu_threads)
        # Built on the meta device in the target dtype, then given storage: no throwaway
        # float32 initialization of billions of parameters.
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device("meta"):
                model = LlamaForCausalLM(model_cfg, self.device)
        finally:
            torch.set_default_dtype(previous)
        self.model = model.to_empty(device=self.device)
        if model_cfg.tie_word_embeddings:
            self.model.lm_head.weight = self.model.model.embed_tokens.weight
        if cfg.load_format == "dummy":
            init_dummy_weights(self.model, seed=cfg.seed)
        elif cfg.load_format == "auto":
            if weights_folder is None:
                raise ValueError("--load-format auto needs a model folder with weights; use --load-format dummy for a bundled config")
            load_weights(self.model, weights_folder)
        else:
            raise ValueError(f"--load-format {cfg.load_format}: choose one of {', '.join(LOAD_FORMATS)}")
        self.model.eval()
        self.future = torch.zeros(FUTURE_MAP_SIZE + 1, dtype=torch.int64, device=self.device)
        self.cache: KVCache | None = None
        self.attn: AttentionBackend | None = None
        self.graphs: DecodeGraphs | None = None
        self.num_forwards = 0
        self.last_logits: torch.Tensor | None = None  # of the latest forward, for tests

    def kv_tokens_that_fit(self) -> int:
        """KV pool size: --kv-tokens, else what the memory budget holds."""
        if self.cfg.kv_tokens is not None:
            return self.cfg.kv_tokens
        per_slot = KVCache.bytes_per_slot(self.model_cfg, self.dtype)
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = free - total * (1 - self.cfg.mem_fraction_static)
        else:
            budget = self.cfg.kv_memory_gb * (1 << 30)
        tokens = int(budget // per_slot)
        if tokens < 1:
            raise ValueError(f"no memory left for the KV cache ({budget / 2**30:.2f} GiB budget after the weights)")
        return tokens

    def init_cache(self, kv_tokens: int, num_req_rows: int) -> None:
        """The KV pool, the attention backend over it, and (CUDA) the decode graphs of batches
        up to num_req_rows - 2 requests (two rows spare, as the scheduler's request pool keeps)."""
        # The old pool goes first: a GPU pool sized from free memory leaves no room for two.
        self.cache = self.attn = self.graphs = None
        row_len = min(self.model_cfg.context_len, kv_tokens)
        self.cache = KVCache(self.model_cfg, kv_tokens, num_req_rows, row_len, self.dtype, self.device)
        cfg = self.model_cfg
        if self.choice.attention_backend == "flashinfer":
            from engine.flashinfer_attention import FlashInferAttention

            self.attn = FlashInferAttention(self.cache, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, self.dtype)
        else:
            self.attn = TorchAttention(self.cache, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
            if self.device.type == "cuda" and self.cfg.cuda_graph:
                self.graphs = DecodeGraphs(self.model, self.attn, self.cache, max_batch=max(1, num_req_rows - 2))

    def warm_up(self) -> None:
        """One small prefill and one decode before the first request, and every decode graph
        captured, as SGLang and vLLM do before they serve: CUDA's first forward pays for its
        library handles and kernel loads (hundreds of ms), which no request of a served trace
        waits for. It writes KV slots that the run's requests overwrite before reading them;
        the cache holds nothing else yet."""
        if self.device.type != "cuda" or self.cache is None:
            return
        tokens = min(16, self.cache.num_slots - 1, self.cache.req_to_token.shape[1] - 1)
        if tokens < 1:
            return
        self.forward(synthetic_plan(ForwardMode.EXTEND, [0], [tokens], with_rows=True))
        self.forward(synthetic_plan(ForwardMode.DECODE, [tokens], [1], with_rows=False))
        if self.graphs is not None:
            self.graphs.capture_all()
        self.num_forwards = 0  # sampling seeds count the run's own forwards
        torch.cuda.synchronize(self.device)

    def forward(self, plan: ForwardPlan, keep_logits: bool = False) -> torch.Tensor:
        """Run plan; return the sampled ids [B] (int64, on the device)."""
        cache, attn = self.cache, self.attn
        assert cache is not None and attn is not None, "init_cache first"
        with torch.inference_mode():
            cache.apply_row_writes(plan)
            input_ids = ids_tensor(plan.input_ids, self.device)
            if plan.mode is not ForwardMode.EXTEND:
                # Tokens still on the device (overlap) come as -future index: a decode's
                # input, also inside a mixed batch (decodes beside prefill chunks).
                input_ids = torch.where(input_ids < 0, self.future[(-input_ids).clamp(min=0)], input_ids)
            batch = ForwardBatch.from_plan(plan, input_ids, self.device)
            if plan.mode is ForwardMode.DECODE:
                cache.req_to_token[batch.req_pool_indices, batch.positions] = batch.out_cache_loc
            shape = self.graphs.shape_for(plan) if self.graphs is not None else None
            if shape is None:
                attn.prepare(batch)
                with sdpa_backends(self.device):  # eager shapes are new all the time: no cuDNN plans
                    hidden = self.model.last_hidden(batch, attn)
            else:
                hidden = self.graphs.run(shape, batch)
            logits = self.model.logits(hidden)
            # The step of a sampled token is its position: the same in overlap and normal mode.
            sampling = SamplingBatch.build(plan.sampling, plan.seq_lens, seed=self.cfg.seed, salt=self.num_forwards)
            next_ids = sample(logits, sampling)
            if plan.future_indices is not None:
                self.future[ids_tensor(plan.future_indices, self.device)] = next_ids
            self.num_forwards += 1
            self.last_logits = logits if keep_logits else None
        return next_ids
