"""vLLM 0.19.0's own v1 Scheduler (and AsyncScheduler), driven step by step on CPU: the oracle.

The scheduler is built as vLLM's EngineCore builds it (VllmConfig by hand over a model folder
that holds only a config.json, the KV cache config from get_kv_cache_configs with
num_gpu_blocks_override, the request block hasher), and runs unchanged. Only the model
executor is out of reach: each forward "samples" the scenario's tokens
(conformance.scenario.sampled_token) for exactly the requests vLLM's model runner samples
(those not left mid-prefill: `not request.is_prefill_chunk`). The loop below is EngineCore's
`step` (no async scheduling) or `step_with_batch_queue` (async scheduling, batch queue of 2)
on a logical clock: a forward with scheduled tokens advances it by one, an idle engine jumps to
the next arrival; a forward in flight is never done before the loop blocks on it.

Runs only in the vLLM oracle environment (conformance/vllm_recipe.sh builds it).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys
import warnings
from collections import deque

# vLLM's caches and the model folder live in the oracle's venv (sys.prefix): nothing in the tree.
WORK = os.environ.get("VLLM_CONFORMANCE_WORK") or os.path.join(sys.prefix, "conformance-work")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(WORK, "cache"))
os.environ.setdefault("VLLM_CONFIG_ROOT", os.path.join(WORK, "config"))
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "CRITICAL")  # vLLM logs an ERROR about Triton on import
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    generate_scheduler_kv_cache_config,
    get_kv_cache_configs,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from conformance.scenario import EOS_TOKEN_ID, ScenarioRequest, sampled_token  # noqa: E402
from conformance.vllm_scenario import VllmRun, VllmScenario, VllmStep, rejected_at_arrival  # noqa: E402

logging.getLogger("vllm").setLevel(logging.ERROR)

VLLM_VERSION = vllm.__version__
MODEL_DIR = os.path.join(WORK, "tiny-llama")
MAX_POSITIONS = 65536
BATCH_QUEUE_SIZE = 2  # EngineCore's batch queue under async scheduling (max_concurrent_batches)

_MODEL_CONFIGS: dict[int, ModelConfig] = {}
_HASHER_FN = None


def _model_config(max_model_len: int) -> ModelConfig:
    """The first ModelConfig inspects the model class in a subprocess (seconds, then cached
    under VLLM_CACHE_ROOT); each max_model_len is built once and deep-copied."""
    if max_model_len not in _MODEL_CONFIGS:
        os.makedirs(MODEL_DIR, exist_ok=True)
        path = os.path.join(MODEL_DIR, "config.json")
        if not os.path.exists(path):
            with open(path + ".tmp", "w") as f:
                json.dump(
                    {
                        "architectures": ["LlamaForCausalLM"],
                        "model_type": "llama",
                        "hidden_size": 256,
                        "intermediate_size": 512,
                        "num_attention_heads": 4,
                        "num_key_value_heads": 2,
                        "num_hidden_layers": 2,
                        "vocab_size": 32000,
                        "max_position_embeddings": MAX_POSITIONS,
                        "rms_norm_eps": 1e-5,
                        "rope_theta": 10000.0,
                        "torch_dtype": "float16",
                        "bos_token_id": 1,
                        "eos_token_id": EOS_TOKEN_ID,
                        "tie_word_embeddings": False,
                    },
                    f,
                )
            os.replace(path + ".tmp", path)
        _MODEL_CONFIGS[max_model_len] = ModelConfig(
            model=MODEL_DIR, tokenizer=MODEL_DIR, skip_tokenizer_init=True, dtype="float16", max_model_len=max_model_len, seed=0
        )
    return copy.deepcopy(_MODEL_CONFIGS[max_model_len])


def build_scheduler(sc: VllmScenario) -> Scheduler:
    """vLLM's scheduler for a scenario: EngineCore._initialize_kv_caches without a worker."""
    mc = _model_config(sc.context_len)
    sched_cfg = SchedulerConfig(
        max_num_seqs=sc.max_num_seqs,
        max_num_batched_tokens=sc.max_num_batched_tokens,
        max_model_len=sc.context_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        async_scheduling=sc.async_scheduling,
        policy=sc.policy,
    )
    # vLLM sets one block aside (the null block): it gets one more, so that both pools hold
    # kv_tokens // block_size usable blocks.
    num_blocks = sc.num_blocks + 1
    cache_cfg = CacheConfig(block_size=sc.block_size, enable_prefix_caching=sc.enable_prefix_caching, num_gpu_blocks_override=num_blocks)
    vc = VllmConfig(model_config=mc, scheduler_config=sched_cfg, cache_config=cache_cfg, device_config=DeviceConfig(device="cpu"))
    hf = mc.hf_text_config
    spec = {
        f"model.layers.{i}.self_attn.attn": FullAttentionSpec(
            block_size=sc.block_size,
            num_kv_heads=hf.num_key_value_heads,
            head_size=hf.hidden_size // hf.num_attention_heads,
            dtype=torch.float16,
        )
        for i in range(hf.num_hidden_layers)
    }
    page = next(iter(spec.values())).page_size_bytes * len(spec)
    # The memory check wants room for one max_model_len request; the override then sets the pool.
    blocks_for_memory = max(num_blocks, -(-sc.context_len // sc.block_size)) + 8
    kv_cfg = generate_scheduler_kv_cache_config(get_kv_cache_configs(vc, [spec], [page * blocks_for_memory]))
    assert kv_cfg.num_blocks == num_blocks, (kv_cfg.num_blocks, num_blocks)
    vc.cache_config.num_gpu_blocks = kv_cfg.num_blocks
    cls = AsyncScheduler if sc.async_scheduling else Scheduler
    sched = cls(
        vllm_config=vc,
        kv_cache_config=kv_cfg,
        structured_output_manager=StructuredOutputManager(vc),
        block_size=sc.block_size,
        log_stats=False,
    )
    assert sched.policy.value == sc.policy, sched.policy
    assert bool(getattr(sched.scheduler_config, "async_scheduling", False)) == sc.async_scheduling
    return sched


def _block_hasher(block_size: int):
    global _HASHER_FN
    if _HASHER_FN is None:
        _HASHER_FN = get_hash_fn_by_name(CacheConfig().prefix_caching_hash_algo)
        init_none_hash(_HASHER_FN)
    return get_request_block_hasher(block_size, _HASHER_FN)


def make_request(sc: VllmScenario, r: ScenarioRequest, index: int, hasher) -> Request:
    """What vLLM's input processor hands the engine core: greedy, EOS from the generation config.
    Arrival times are the step plus a hair per arrival index: a real server's clock never ties,
    and ours breaks ties by arrival index."""
    sp = SamplingParams(max_tokens=r.max_new_tokens, ignore_eos=r.ignore_eos, temperature=0.0)
    sp.update_from_generation_config({}, eos_token_id=EOS_TOKEN_ID)
    return Request(
        request_id=r.rid,
        prompt_token_ids=list(r.prompt),
        sampling_params=sp,
        pooling_params=None,
        arrival_time=r.arrival_step + index * 1e-6,
        priority=r.priority if sc.policy == "priority" else 0,
        block_hasher=hasher,
    )


class VllmOracle:
    """vLLM's scheduler for one scenario, and EngineCore's loop on a logical clock."""

    def __init__(self, sc: VllmScenario) -> None:
        self.sc = sc
        self.s = build_scheduler(sc)
        self.hasher = _block_hasher(sc.block_size) if sc.enable_prefix_caching else None
        self.by_rid = {r.rid: r for r in sc.requests}
        self.reqs: dict[str, Request] = {}
        self.preempted: list[str] = []  # since the last forward, in order
        self.finished: list[str] = []  # since the last forward
        preempt = self.s._preempt_request

        def logged_preempt(request, timestamp):  # the order; SchedulerOutput keeps a set
            self.preempted.append(request.request_id)
            preempt(request, timestamp)

        self.s._preempt_request = logged_preempt
        self.evicted = 0
        pool = self.s.kv_cache_manager.block_pool
        maybe_evict = pool._maybe_evict_cached_block

        def counted_evict(block):
            evicted = maybe_evict(block)
            self.evicted += bool(evicted)
            return evicted

        pool._maybe_evict_cached_block = counted_evict

    # -- one forward, without a model --------------------------------------------------------
    def model_output(self, so) -> ModelRunnerOutput:
        """What GPUModelRunner returns for this schedule: a sampled token for every request
        the forward reaches the end of (vLLM's is_prefill_chunk, set by schedule()), none for a
        prefill chunk short of it. The token is the one after position num_computed_tokens - 1."""
        if so.total_num_scheduled_tokens == 0:
            return EMPTY_MODEL_RUNNER_OUTPUT
        req_ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            req = self.s.requests[rid]
            if req.is_prefill_chunk:
                sampled.append([])
            else:
                sampled.append([sampled_token(self.by_rid[rid], req.num_computed_tokens - req.num_prompt_tokens)])
        return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)}, sampled_token_ids=sampled)

    def update(self, so, mro) -> None:
        for eco in self.s.update_from_output(so, mro).values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    self.finished.append(o.request_id)

    def record(self, so) -> VllmStep:
        s = self.s
        hits = sum(d.num_computed_tokens for d in so.scheduled_new_reqs)
        cached = so.scheduled_cached_reqs
        hits += sum(n for rid, n in zip(cached.req_ids, cached.num_computed_tokens) if rid in cached.resumed_req_ids)
        step = VllmStep(
            reqs=list(so.num_scheduled_tokens.items()),
            preempted=list(self.preempted),
            finished=sorted(self.finished),
            free_blocks=s.kv_cache_manager.block_pool.get_num_free_blocks(),
            cache_hit_tokens=hits,
            num_running=len(s.running),
            num_waiting=len(s.waiting) + len(s.skipped_waiting),
            evicted=self.evicted,
        )
        self.preempted.clear()
        self.finished.clear()
        return step

    # -- EngineCore's loop ----------------------------------------------------------------------
    def run(self, max_steps: int = 20_000) -> VllmRun:
        s, sc = self.s, self.sc
        order = sc.arrival_order()
        pending = deque((pos, sc.requests[i]) for pos, i in enumerate(order))
        rejected: list[str] = []
        steps: list[VllmStep] = []
        queue: deque = deque()  # async: (scheduler output, model output), newest first
        clock = 0
        error = None
        idle_spins = 0
        while len(steps) < max_steps:
            while pending and pending[0][1].arrival_step <= clock:
                pos, r = pending.popleft()
                if rejected_at_arrival(sc, r):
                    rejected.append(r.rid)
                    continue
                req = make_request(sc, r, pos, self.hasher)
                self.reqs[r.rid] = req
                s.add_request(req)
            launched = progressed = False
            if s.has_requests():
                n_pre = len(self.preempted)
                so = s.schedule()
                mro = self.model_output(so)
                launched = so.total_num_scheduled_tokens > 0
                progressed = len(self.preempted) > n_pre
                if launched:
                    steps.append(self.record(so))
                    clock += 1
                if not sc.async_scheduling:
                    self.update(so, mro)  # EngineCore.step
                else:  # EngineCore.step_with_batch_queue
                    queue.appendleft((so, mro))
                    if launched and len(queue) < BATCH_QUEUE_SIZE:
                        continue  # nothing blocks: the forward runs while the next is scheduled
                    old_so, old_mro = queue.pop()
                    self.update(old_so, old_mro)
                    progressed |= old_so.total_num_scheduled_tokens > 0
            elif queue:
                old_so, old_mro = queue.pop()
                self.update(old_so, old_mro)
                progressed = old_so.total_num_scheduled_tokens > 0
            if launched or progressed:
                idle_spins = 0
                continue
            # Nothing ran, nothing in flight changed: vLLM would spin in this state until a
            # request arrives.
            idle_spins += 1
            if pending:
                clock = max(clock, pending[0][1].arrival_step)
                continue
            if s.has_requests() or queue:
                if idle_spins < 3:
                    continue
                error = f"stuck: {len(s.waiting) + len(s.skipped_waiting)} waiting, {len(s.running)} running, nothing runs"
            break
        outputs = {rid: len(r.output_token_ids) for rid, r in self.reqs.items()}
        return VllmRun(steps, rejected, outputs, error)


def run_vllm(sc: VllmScenario, max_steps: int = 20_000) -> VllmRun:
    """One scenario through vLLM's scheduler."""
    return VllmOracle(sc).run(max_steps)
