"""SGLang's own scheduler, driven step by step on CPU tensors: the oracle.

The Scheduler is built with object.__new__ and the attributes its scheduling methods read;
everything else (metrics, IPC, streaming, disaggregation, LoRA, grammar) is a no-op
stand-in. Its real SchedulePolicy, PrefillAdder, ScheduleBatch, radix cache (SGLang's
UnifiedRadixCache, also in its disabled form for --disable-radix-cache), allocators and
get_next_batch_to_run / update_running_batch / process_batch_result run unchanged. Only
the model worker is out of reach: run_batch is replaced by a function that "samples" the
scenario's tokens (conformance.scenario.sampled_token) and hands them to SGLang's own
result processing. The loop below is SGLang's event_loop_normal / event_loop_overlap with
the network and the device taken out.

Runs only in the oracle environment (make conformance builds it): it imports sglang and torch.
"""

from __future__ import annotations

import logging
import random
import warnings
from array import array
from collections import deque
from types import SimpleNamespace

from conformance import stubs

stubs.install()
# SGLang warns on import about every GPU kernel a CPU lacks; none is used here.
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor  # noqa: E402
from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.runtime_context import get_context  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from conformance.decision import RunResult, StepDecision  # noqa: E402
from conformance.scenario import EOS_TOKEN_ID, Scenario, ScenarioRequest, sampled_token  # noqa: E402
from conformance.stand_ins import ModelConfig, NoBeams, NoDllm, NoGrammar, Null, Passthrough, metrics_stub, null_call  # noqa: E402

logging.getLogger("sglang").setLevel(logging.ERROR)

SGLANG_VERSION = "0.5.23"


def server_args_for(sc: Scenario) -> dict:
    """The ServerArgs fields of a scenario, as SGLang names them."""
    chunk = sc.chunked_prefill_size if sc.chunked_prefill_size is not None else -1
    return dict(
        device="cpu",
        page_size=sc.page_size,
        chunked_prefill_size=chunk,
        max_prefill_tokens=sc.max_prefill_tokens,
        schedule_policy="fcfs" if sc.policy == "priority" else sc.policy,
        enable_priority_scheduling=sc.enable_priority_scheduling or sc.policy == "priority",
        priority_scheduling_preemption_threshold=sc.priority_preemption_threshold,
        schedule_conservativeness=sc.schedule_conservativeness,
        disable_radix_cache=sc.disable_radix_cache,
        enable_mixed_chunk=sc.enable_mixed_chunk,
        disable_overlap_schedule=not sc.overlap,
    )


class OracleScheduler:
    """SGLang's Scheduler for one scenario, and its event loop on a logical clock."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self._override = get_context().override_server_args(**server_args_for(sc))
        self._override.install()
        self.s = self._build_scheduler()
        self.reqs: dict[str, Req] = {}

    def close(self) -> None:
        self._override.restore()

    # -- construction --------------------------------------------------------------------
    def _build_scheduler(self) -> Scheduler:
        sc = self.sc
        s = object.__new__(Scheduler)
        max_running = _max_running(sc)
        s.device = "cpu"
        s.page_size = sc.page_size
        s.max_running_requests = max_running
        s.max_total_num_tokens = sc.kv_tokens
        s.max_req_len = min(sc.context_len - 1, sc.kv_tokens - 1)
        s.max_req_input_len = s.max_req_len - 5
        s.max_prefill_tokens = sc.max_prefill_tokens
        s.max_new_tokens_limit = None
        s.kv_shard_widening = 1
        s.sliding_window_size = None
        s.truncation_align_size = None
        get_context().override("scheduler.pp_max_micro_batch_size_default", pp_max_micro_batch_size=max_running)
        s.req_to_token_pool = ReqToTokenPool(
            size=max_running + 1, max_context_len=sc.context_len + 4, device="cpu", enable_memory_saver=False
        )
        if sc.page_size == 1:
            alloc = TokenToKVPoolAllocator(sc.kv_tokens, torch.float16, "cpu", None, need_sort=False)
        else:
            alloc = PagedTokenToKVPoolAllocator(sc.kv_tokens, sc.page_size, torch.float16, "cpu", None, need_sort=False)
        s.token_to_kv_pool_allocator = alloc
        params = CacheInitParams(
            disable=sc.disable_radix_cache,
            req_to_token_pool=s.req_to_token_pool,
            token_to_kv_pool_allocator=alloc,
            page_size=sc.page_size,
            chunked_prefill_size=sc.chunked_prefill_size,
        )
        params.tree_components = (ComponentType.FULL,)
        s.tree_cache = UnifiedRadixCache(params)
        s.model_config = ModelConfig(
            vocab_size=32000, is_encoder_decoder=False, is_multimodal=False, context_len=sc.context_len, num_key_value_heads=1
        )
        s.spec_algorithm = SpeculativeAlgorithm.NONE
        s.enable_overlap = sc.overlap
        s.is_generation = True
        s.disaggregation_mode = DisaggregationMode.NULL
        s.dllm_config = None
        s.dllm_manager = NoDllm()
        s.enable_hisparse = False
        s.hisparse_coordinator = None
        s.enable_hierarchical_cache = False
        s.enable_hicache_storage = False
        s.enable_lmcache = False
        s.enable_unified_cache_external_linker = False
        s.enable_lora = False
        s.lora_drainer = None
        s.enable_fpm = False
        s.is_hybrid_swa = False
        s.require_mlp_sync = False
        s.decode_offload_manager = None
        s.min_free_slots_delayer = None
        s.dynamic_chunk_sizer = None
        s.prefill_delayer = None
        s.max_prefill_bs = 0
        s.prefill_decode_interval = 0
        s._prefill_decode_interval_remaining = 0
        s.prefill_decode_interval_min_bs = 0
        s.processed_tokens_counter = 0
        s.forward_ct = 0
        s._sched_idled = False
        s._pending_chunked_abort_req = None
        s.scheduler_stage_metrics = None
        s.schedule_low_priority_values_first = False
        s.abort_on_priority_when_disabled = False
        s.max_queued_requests = None
        s.chunked_prefill_size = sc.chunked_prefill_size if sc.chunked_prefill_size and sc.chunked_prefill_size > 0 else None
        s.chunked_req = None
        s.is_mixed_chunk = s.chunked_prefill_size is not None and sc.enable_mixed_chunk
        s.enable_priority_scheduling = sc.enable_priority_scheduling or sc.policy == "priority"
        s.enable_priority_preemption = s.enable_priority_scheduling
        s.priority_scheduling_preemption_threshold = sc.priority_preemption_threshold
        s.schedule_policy = "fcfs" if sc.policy == "priority" else sc.policy
        s.policy = SchedulePolicy(s.schedule_policy, s.tree_cache, False, s.enable_priority_scheduling, False)
        s.new_token_ratio_tracker = NewTokenRatioTracker.from_config()
        s.waiting_queue = []
        s.running_batch = ScheduleBatch(reqs=[], batch_is_full=False)
        s.last_batch = None
        s.cur_batch_for_debug = None
        s.result_queue = deque()
        s.enable_skip_finishing_decode = sc.overlap  # event_loop_overlap sets it
        s._engine_paused = False
        for name in (
            "metrics_reporter",
            "metrics_collector",
            "grammar_manager",
            "output_streamer",
            "load_inquirer",
            "load_publisher",
            "pool_stats_observer",
            "ipc_channels",
            "future_map",
            "tp_worker",
            "model_worker",
            "draft_worker",
            "ngram_embedding_manager",
            "dp_attn_adapter",
            "beam_coordinator",
            "rust_server",
            "logprob_result_processor",
            "invariant_checker",
            "load_snapshot_writer",
        ):
            setattr(s, name, Null())
        s.metrics_reporter = metrics_stub()
        s.dp_attn_adapter = Passthrough()
        s.ngram_embedding_manager = Passthrough()
        s.grammar_manager = NoGrammar()
        s.beam_coordinator = NoBeams()
        s.tp_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=None, prefill_aware_swa=False))
        s.publish_load_snapshot = null_call
        s.enable_overlap_mlx = False
        s.batch_result_processor = SchedulerBatchResultProcessor(
            is_generation=True,
            disaggregation_mode=s.disaggregation_mode,
            enable_overlap=s.enable_overlap,
            enable_overlap_mlx=False,
            model_config=s.model_config,
            token_to_kv_pool_allocator=alloc,
            tree_cache=s.tree_cache,
            hisparse_coordinator=None,
            req_to_token_pool=s.req_to_token_pool,
            decode_offload_manager=None,
            metrics_collector=Null(),
            metrics_reporter=metrics_stub(),
            draft_worker=Null(),
            model_worker=Null(),
            logprob_result_processor=Null(),
            output_streamer=Null(),
            beam_coordinator=s.beam_coordinator,
            abort_request=null_call,
        )
        s.maybe_send_health_check_signal = null_call
        s._record_step_counters = null_call  # step metrics
        return s

    # -- arrivals ------------------------------------------------------------------------
    def add_request(self, r: ScenarioRequest) -> bool:
        """SGLang's handle_generate_request, as far as scheduling goes. False: rejected at arrival."""
        s = self.s
        params = SamplingParams(max_new_tokens=r.max_new_tokens, ignore_eos=r.ignore_eos, temperature=0.0)
        params.normalize(None)
        req = Req(
            r.rid,
            "",
            array("q", r.prompt),
            params,
            eos_token_ids={EOS_TOKEN_ID},
            priority=r.priority if s.enable_priority_scheduling else None,
            vocab_size=32000,
        )
        req.scenario_request = r
        self.reqs[r.rid] = req
        s.init_req_max_new_tokens(req)
        if len(req.origin_input_ids) >= s.max_req_input_len or req.to_finish is not None:
            return False
        s._add_request_to_queue(req)
        return True

    # -- the loop --------------------------------------------------------------------------
    def run(self, max_steps: int = 100_000) -> RunResult:
        """SGLang's event_loop_normal / event_loop_overlap on a logical clock: a launched batch
        advances it by one; with nothing to run it jumps to the next arrival."""
        s, sc = self.s, self.sc
        random.seed(0)  # the random policy shuffles with the module's generator; ours is Random(seed=0)
        pending = deque(sorted(sc.requests, key=lambda r: r.arrival_step))
        steps: list[StepDecision] = []
        rejected: list[str] = []
        clock = 0
        error = None
        while len(steps) < max_steps:
            while pending and pending[0].arrival_step <= clock:
                r = pending.popleft()
                if not self.add_request(r):
                    rejected.append(r.rid)
            _RETRACTED.clear()
            plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
            s.running_batch = plan.running_batch
            batch = plan.batch_to_run
            processed = False
            if sc.overlap:
                disable_overlap = s.is_disable_overlap_for_batch(batch, last_batch=s.last_batch)
                if disable_overlap:
                    self._pop_and_process()
                    processed = True
                if batch:
                    steps.append(self.record(batch, list(_RETRACTED)))
                    result = self.run_batch(batch)
                    s.result_queue.append((batch.copy(), result))
                if s.last_batch:
                    if not disable_overlap:
                        self._pop_and_process()
                        processed = True
                elif batch is None:
                    self.on_idle()
            else:
                if batch:
                    steps.append(self.record(batch, list(_RETRACTED)))
                    result = self.run_batch(batch)
                    s.process_batch_result(batch, result)
                else:
                    self.on_idle()
            s.last_batch = batch
            if batch:
                clock += 1
                continue
            if processed:
                continue  # the next look sees that result
            # Nothing ran and nothing was processed: SGLang's loop would spin through this
            # same state (on_idle each time) until a request arrives.
            if not pending:
                if not s.is_fully_idle():
                    error = f"stuck: {len(s.waiting_queue)} waiting, {s.running_batch.batch_size()} running, nothing runs"
                break
            self.on_idle()
            clock = max(clock, pending[0].arrival_step)
        outputs = {rid: len(r.output_ids) for rid, r in self.reqs.items()}
        return RunResult(steps, rejected, outputs, error)

    def _pop_and_process(self) -> None:
        batch, result = self.s.result_queue.popleft()
        self.s.process_batch_result(batch, result)

    def on_idle(self) -> None:
        """The part of Scheduler.on_idle that scheduling sees: the token ratio starts over
        when fully idle (the rest is health checks, metrics and sleeping)."""
        if self.s.is_fully_idle():
            self.s.new_token_ratio_tracker.reset()

    # -- one forward, without a model ------------------------------------------------------
    def run_batch(self, batch: ScheduleBatch) -> GenerationBatchResult:
        """What SGLang's run_batch leaves for result processing, with the scenario's tokens."""
        s = self.s
        s.forward_ct += 1
        batch.forward_iter = s.forward_ct
        if batch.extend_num_tokens:
            s.processed_tokens_counter += batch.extend_num_tokens
        seq_lens = batch.seq_lens_cpu.tolist()
        tokens = []
        for req, seq_len in zip(batch.reqs, seq_lens):
            # The token this forward samples is the one after position seq_len - 1.
            tokens.append(sampled_token(req.scenario_request, seq_len - len(req.origin_input_ids)))
        result = GenerationBatchResult(next_token_ids=torch.tensor(tokens, dtype=torch.int64), can_run_cuda_graph=False)
        batch.input_ids = None
        return result

    def record(self, batch: ScheduleBatch, retracted: list[str]) -> StepDecision:
        s = self.s
        mode = batch.forward_mode
        if mode.is_decode():
            lens = [1] * batch.batch_size()
            name = "decode"
        else:
            lens = list(batch.extend_lens)
            name = "mixed" if mode.is_mixed() else "extend"
        alloc, cache = s.token_to_kv_pool_allocator, s.tree_cache
        kv_used = alloc.size - alloc.available_size() - cache.evictable_size()
        return StepDecision(
            mode=name,
            reqs=[(r.rid, n) for r, n in zip(batch.reqs, lens)],
            retracted=sorted(retracted),
            new_token_ratio=round(s.new_token_ratio_tracker.current, 9),
            kv_used=kv_used,
            kv_cached=cache.evictable_size(),
            num_waiting=len(s.waiting_queue),
        )


def _max_running(sc: Scenario) -> int:
    """SGLang's KVCacheConfigurator.resolve_max_num_reqs."""
    estimated = max(min(int(sc.kv_tokens / sc.context_len * 512), 4096), 2048)
    return min(sc.max_running_requests or estimated, sc.kv_tokens // 2)


_RETRACTED: list[str] = []  # rids whose reset_for_retract ran since the last look
_reset_for_retract = Req.reset_for_retract


def _logged_reset_for_retract(self: Req) -> None:
    _RETRACTED.append(self.rid)
    _reset_for_retract(self)


Req.reset_for_retract = _logged_reset_for_retract


def run_sglang(sc: Scenario) -> RunResult:
    """One scenario through SGLang's scheduler."""
    oracle = OracleScheduler(sc)
    try:
        return oracle.run()
    finally:
        oracle.close()
