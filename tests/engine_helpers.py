"""Shared helpers of the real-engine tests: tiny random Hugging Face checkpoints, a runner
over them, a hand-driven scheduler that records every forward's logits, and transformers
references (logits of a whole sequence, greedy generation).

Nothing here is mocked: the checkpoints are written by transformers' save_pretrained
(safetensors), read back by the engine's loader, and compared with transformers' own
forward on the very same weights.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.device import choose_device
from engine.model_runner import EngineConfig, ModelRunner
from scheduler.core.forward_plan import ForwardMode, ForwardPlan
from scheduler.core.protocol import SchedulerCore
from scheduler.core.req import Req
from scheduler.core.sampling import SamplingParams
from scheduler.model_config import load_model_config
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.scheduler import Scheduler
from scheduler.vllm.config import VllmSchedulerConfig

TINY = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=512,
    max_position_embeddings=512,
    # A wide random init: logits spread over several units, so greedy argmaxes are
    # far apart (float noise cannot flip them) and a wrong engine shows at once.
    initializer_range=0.2,
    rms_norm_eps=1e-6,
    dtype="float32",
)

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

ARCHS = ("llama", "llama3-rope", "qwen2", "qwen3", "mistral")

# The engine tests run on the CPU; benchmarks/gpu_check.sh runs them on CUDA too
# (TESTBED_TEST_DEVICE=cuda, TESTBED_TEST_ATTENTION=torch|flashinfer), float32 either way.
TEST_DEVICE = os.environ.get("TESTBED_TEST_DEVICE", "cpu")
TEST_ATTENTION = os.environ.get("TESTBED_TEST_ATTENTION", "torch")
ATOL = float(os.environ.get("TESTBED_TEST_ATOL", "1e-4"))
RTOL = ATOL


def hf_config(arch: str, **overrides):
    """The transformers config of a tiny model of `arch`."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    kw = dict(TINY) | overrides
    if arch == "llama":
        return LlamaConfig(**kw, tie_word_embeddings=False)
    if arch == "llama3-rope":
        # transformers 5 keeps RoPE settings in rope_parameters (rope_theta included).
        return LlamaConfig(**kw, tie_word_embeddings=False, rope_parameters=LLAMA3_ROPE | {"rope_theta": 10000.0})
    if arch == "qwen2":
        # q/k/v biases, tied embeddings.
        return Qwen2Config(**kw, tie_word_embeddings=True, use_sliding_window=False)
    if arch == "qwen3":
        # Per-head q/k RMSNorm, head_dim 32 != hidden / heads = 16.
        return Qwen3Config(**kw, head_dim=32, tie_word_embeddings=False, use_sliding_window=False)
    if arch == "mistral":
        return MistralConfig(**kw, tie_word_embeddings=False, sliding_window=None)
    raise ValueError(arch)


def make_hf_model(arch: str, seed: int = 0, **overrides):
    """A tiny random transformers model of `arch`, float32, eval mode.

    Biases and norm scales (which transformers initializes to 0 and 1) are drawn at
    random too, so that a loader that skipped them, or a model that ignored them, fails."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = hf_config(arch, **overrides)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
            elif "norm" in name:
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.1)
    return model


def save_hf_model(arch: str, folder: Path, seed: int = 0, **overrides):
    model = make_hf_model(arch, seed, **overrides)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def make_runner(folder: Path) -> ModelRunner:
    cfg = load_model_config(folder)
    return ModelRunner(cfg, choose_device(TEST_DEVICE, "float32", TEST_ATTENTION), EngineConfig(load_format="auto"), folder)


def scheduler_config(runner: ModelRunner, kv_tokens: int = 2048, overlap: bool = False, **kw) -> SchedulerConfig:
    """A scheduler config for `runner`, with the runner's cache (re)made to match."""
    kw.setdefault("max_running_requests", 16)
    config = SchedulerConfig(
        kv_tokens=kv_tokens,
        context_len=runner.model_cfg.context_len,
        overlap=overlap,
        journal_row_writes=True,
        **kw,
    )
    runner.init_cache(kv_tokens, config.effective_max_running_requests + 2)
    return config


def vllm_scheduler_config(runner: ModelRunner, kv_tokens: int = 2048, overlap: bool = False, **kw) -> VllmSchedulerConfig:
    """A vLLM scheduler config for `runner`, with the runner's cache (re)made to match."""
    kw.setdefault("max_num_seqs", 16)
    config = VllmSchedulerConfig(
        kv_tokens=kv_tokens, context_len=runner.model_cfg.context_len, overlap=overlap, journal_row_writes=True, **kw
    )
    runner.init_cache(kv_tokens, config.effective_max_running_requests + 2)
    return config


def prompt(seed: int, n: int, vocab: int = TINY["vocab_size"]) -> list[int]:
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(1, vocab, (n,), generator=g).tolist()


def make_req(rid: str, ids: list[int], max_new_tokens: int, index: int = 0, arrival: float = 0.0, ignore_eos: bool = True) -> Req:
    """ignore_eos=False with no EOS id given: the request still runs to its length, but the
    scheduler admits it on the decode estimate (new_token_ratio) as one that may stop early."""
    ids = list(ids)
    return Req(
        rid,
        len(ids),
        lambda: ids,
        SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos),
        arrival,
        index=index,
    )


@dataclass
class Record:
    """What the engine computed for one request: a logits row per sampled token."""

    prompt: list[int]
    logits: list[torch.Tensor] = field(default_factory=list)  # logits[k] predicted output k
    plans: list[tuple[ForwardPlan, int]] = field(default_factory=list)  # (plan, row) of every forward it was in
    # Every logits row of every forward it was in (non-final chunks and forwards later
    # undone by a retraction included), with the position of the token it was computed at.
    rows: list[tuple[int, torch.Tensor]] = field(default_factory=list)


class ManualRun:
    """The scheduler driven step by step by hand (no overlap), keeping every forward's logits."""

    def __init__(self, runner: ModelRunner, config: SchedulerConfig, scheduler: SchedulerCore | None = None) -> None:
        self.runner = runner
        self.sched = scheduler if scheduler is not None else Scheduler(config)
        self.records: dict[str, Record] = {}
        self.plans: list[ForwardPlan] = []
        self.now = 0.0

    def add(self, req: Req) -> Req:
        self.records[req.rid] = Record(list(req.origin_input_ids))
        self.sched.add_request(req)
        return req

    def step(self) -> ForwardPlan | None:
        sched = self.sched
        batch = sched.get_next_batch_to_run()
        if batch is None and not sched.is_idle():
            batch = sched.get_next_batch_to_run()
        if batch is None:
            return None
        self.now += 1.0
        launched = sched.launch(batch, self.now, False)
        plan = launched.plan
        ids = self.runner.forward(plan, keep_logits=True)
        logits = self.runner.last_logits
        assert logits is not None and logits.shape == (plan.batch_size, self.runner.model_cfg.vocab_size)
        assert logits.dtype == torch.float32
        for i, r in enumerate(launched.reqs):
            rec = self.records[r.rid]
            rec.plans.append((plan, i))
            row = logits[i].cpu()  # a copy on the CPU, where transformers' reference is
            rec.rows.append((plan.seq_lens[i] - 1, row))
            sampled = plan.mode is ForwardMode.DECODE or plan.sample[i]
            if sampled and not r.is_retracted:
                rec.logits.append(row)
        sched.process_batch_result(launched, ids.tolist(), self.now)
        self.plans.append(plan)
        return plan

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if self.step() is None:
                break
        else:
            raise AssertionError("the scheduler never went idle")
        self.sched.check_invariants()


# --- transformers references ---------------------------------------------------------------


@torch.no_grad()
def hf_logits(model, ids: list[int]) -> torch.Tensor:
    """transformers' logits [len(ids), vocab] of a whole sequence, float32."""
    return model(torch.tensor([ids])).logits[0].float()


@torch.no_grad()
def hf_generate(model, ids: list[int], n: int) -> list[int]:
    """transformers' greedy generation of exactly n tokens (EOS never stops it)."""
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=n,
        min_new_tokens=n,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(ids) :].tolist()


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got = got.cpu()
    diff = (got - want).abs().max().item()
    assert torch.allclose(got, want, atol=ATOL, rtol=RTOL), f"{what}: max |engine - transformers| = {diff:.3g}"


def check_record_against_hf(model, rec: Record, output_ids: list[int], what: str) -> None:
    """Every logits row the engine produced for a request equals transformers' logits at the
    same position of the request's full sequence; the sampled tokens are their argmaxes."""
    assert len(rec.logits) == len(output_ids), f"{what}: {len(rec.logits)} logits rows for {len(output_ids)} tokens"
    seq = rec.prompt + output_ids[:-1]
    ref = hf_logits(model, seq)
    n = len(rec.prompt)
    for k, row in enumerate(rec.logits):
        assert_close(row, ref[n - 1 + k], f"{what}, output token {k} (position {n - 1 + k})")
    assert output_ids == ref[n - 1 :].argmax(-1).tolist(), f"{what}: engine tokens are not transformers' argmaxes"
    # Rows of non-final prefill chunks, and of prefills redone after a retraction, too:
    # position p of the request's sequence (prompt, then its outputs) is the same token
    # whatever forward computed it.
    for pos, row in rec.rows:
        assert_close(row, ref[pos], f"{what}, forward at position {pos}")
