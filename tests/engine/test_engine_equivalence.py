"""The real engine equals transformers: same weights, same logits, same greedy tokens.

Tiny random checkpoints of every supported family (Llama, Llama with llama3 RoPE
scaling, Qwen2 with q/k/v biases and tied embeddings, Qwen3 with q/k norm and a
head_dim that is not hidden / heads, Mistral) are written by transformers'
save_pretrained, loaded by the engine, and run through the scheduler:

- logits (fp32, 1e-4) of a prefill, of decode steps, of an extend on a radix-cached
  prefix, of every chunk of a chunked prefill, of a batch of prompts of different
  lengths prefilled and decoded together (the padded decode path);
- greedy tokens of a mixed batch run by EventLoop + RealDriver, overlap off and on,
  equal transformers' generate, and equal each other;
- the same with retraction forced by a KV pool barely larger than one request
  (and, by hand, the logits of the retracted request's second prefill);
- greedy tokens with pages of 4 and 16, chunks on top of radix hits, no prefix cache,
  staggered arrivals (one family: the scheduler options, not the model, vary).
"""

from __future__ import annotations

import pytest
from engine_helpers import (
    ARCHS,
    ManualRun,
    assert_close,
    check_record_against_hf,
    hf_generate,
    hf_logits,
    make_req,
    make_runner,
    prompt,
    save_hf_model,
    scheduler_config,
)

from engine.real_driver import RealDriver
from scheduler.core.forward_plan import ForwardMode
from scheduler.core.req import FinishReason
from scheduler.loop.event_loop import EventLoop
from scheduler.sglang.scheduler import Scheduler


class Env:
    def __init__(self, arch: str, folder, seed: int) -> None:
        self.arch = arch
        self.hf = save_hf_model(arch, folder, seed=seed)
        self.runner = make_runner(folder)
        self._generated: dict[tuple, list[int]] = {}

    def generate(self, ids: list[int], n: int) -> list[int]:
        """transformers' greedy tokens, cached: several tests ask for the same ones."""
        key = (tuple(ids), n)
        if key not in self._generated:
            self._generated[key] = hf_generate(self.hf, ids, n)
        return self._generated[key]


@pytest.fixture(scope="module", params=ARCHS)
def env(request, tmp_path_factory) -> Env:
    arch = request.param
    return Env(arch, tmp_path_factory.mktemp(arch), seed=ARCHS.index(arch))


def test_checkpoints_are_what_the_engine_is_meant_to_cover(env):
    """The fixture really exercises each family's difference (else the tests below prove less)."""
    cfg = env.runner.model_cfg
    if env.arch == "llama3-rope":
        assert cfg.rope_scaling and cfg.rope_scaling["rope_type"] == "llama3"
        assert cfg.rope_scaling["original_max_position_embeddings"] == 64 and cfg.context_len == 512
    if env.arch == "qwen2":
        assert cfg.attention_bias and cfg.tie_word_embeddings
        assert env.runner.model.lm_head.weight is env.runner.model.model.embed_tokens.weight
        assert env.hf.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0
    if env.arch == "qwen3":
        assert cfg.qk_norm and cfg.head_dim == 32 != cfg.hidden_size // cfg.num_attention_heads
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # GQA


# --- logits -----------------------------------------------------------------------------------


def test_prefill_then_decode_logits_equal_transformers(env):
    # Llama3 scaling: run past original_max_position_embeddings (64).
    n = 72 if env.arch == "llama3-rope" else 40
    p = prompt(1, n)
    run = ManualRun(env.runner, scheduler_config(env.runner))
    req = run.add(make_req("a", p, 6))
    run.run()
    rec = run.records["a"]
    modes = [plan.mode for plan, _ in rec.plans]
    assert modes == [ForwardMode.EXTEND] + [ForwardMode.DECODE] * 5
    first = rec.plans[0][0]
    assert first.prefix_lens == [0] and first.extend_lens == [n]

    # (a) prefill: the last prompt token's logits.
    assert_close(rec.logits[0], hf_logits(env.hf, p)[-1], "prefill")
    # (b) five decode steps fed with the greedy tokens.
    seq = list(p)
    for k in range(1, 6):
        seq.append(req.output_ids[k - 1])
        assert_close(rec.logits[k], hf_logits(env.hf, seq)[-1], f"decode step {k} (position {len(seq) - 1})")
    assert req.output_ids == env.generate(p, 6)


def test_extend_on_a_cached_prefix_equals_transformers(env):
    shared, x, y = prompt(2, 24), prompt(3, 10), prompt(4, 13)
    if x[0] == y[0]:
        y[0] = (y[0] % 500) + 1
    run = ManualRun(env.runner, scheduler_config(env.runner))
    a = run.add(make_req("a", shared + x, 4))
    run.run()
    b = run.add(make_req("b", shared + y, 4, index=1))
    run.run()
    first, row = run.records["b"].plans[0]
    assert first.mode is ForwardMode.EXTEND and first.batch_size == 1
    # The radix cache served exactly the shared prefix; only Y was computed.
    assert first.prefix_lens[row] == len(shared) >= 16
    assert first.extend_lens[row] == len(y)
    assert b.cached_tokens == len(shared)
    assert_close(run.records["b"].logits[0], hf_logits(env.hf, shared + y)[-1], "extend on a cached prefix")
    check_record_against_hf(env.hf, run.records["a"], a.output_ids, "request A")
    check_record_against_hf(env.hf, run.records["b"], b.output_ids, "request B (prefix hit)")


def test_chunked_prefill_equals_transformers(env):
    p = prompt(5, 50)
    run = ManualRun(env.runner, scheduler_config(env.runner, chunked_prefill_size=16))
    req = run.add(make_req("a", p, 4))
    run.run()
    rec = run.records["a"]
    extends = [(plan, i) for plan, i in rec.plans if plan.mode is ForwardMode.EXTEND]
    assert [plan.prefix_lens[i] for plan, i in extends] == [0, 16, 32, 48]
    assert [plan.extend_lens[i] for plan, i in extends] == [16, 16, 16, 2]
    assert [plan.sample[i] for plan, i in extends] == [False, False, False, True]
    ref = hf_logits(env.hf, p)
    assert_close(rec.logits[0], ref[-1], "last chunk")
    # The non-final chunks' last rows, too (their samples are dropped, their KV is not).
    for (plan, i), (pos, row) in zip(extends, rec.rows):
        assert pos == plan.seq_lens[i] - 1
        assert_close(row, ref[pos], f"chunk ending at position {pos}")
    check_record_against_hf(env.hf, rec, req.output_ids, "chunked request")
    assert req.output_ids == env.generate(p, 4)


def test_batched_prefill_and_padded_decode_equal_transformers(env):
    lens, outs = [12, 33, 47, 60], [5, 8, 3, 6]
    run = ManualRun(env.runner, scheduler_config(env.runner))
    reqs = [run.add(make_req(f"r{i}", prompt(10 + i, n), o, index=i)) for i, (n, o) in enumerate(zip(lens, outs))]
    run.run()
    first = run.plans[0]
    assert first.mode is ForwardMode.EXTEND and first.extend_lens == lens and first.prefix_lens == [0] * 4
    decodes = [plan for plan in run.plans if plan.mode is ForwardMode.DECODE]
    # Decode batches of requests at different lengths: the padded path.
    assert decodes[0].batch_size == 4 and len(set(decodes[0].seq_lens)) == 4
    assert [plan.batch_size for plan in decodes] == sorted((plan.batch_size for plan in decodes), reverse=True)
    for r in reqs:
        assert len(r.output_ids) == r.max_new_tokens
        check_record_against_hf(env.hf, run.records[r.rid], r.output_ids, f"request {r.rid} of a batch")


# --- greedy generation through the event loop ----------------------------------------------------

MIXED_LENS = [10, 60, 25, 41, 17, 52]
MIXED_OUTS = [5, 20, 12, 7, 16, 9]


def _loop_run(env: Env, specs, overlap: bool, kv_tokens: int = 4096, ignore_eos: bool = True, **kw):
    """Run requests [(prompt, max_new_tokens)] (all arriving at 0) through EventLoop + RealDriver."""
    config = scheduler_config(env.runner, kv_tokens=kv_tokens, overlap=overlap, **kw)
    sched = Scheduler(config)
    reqs = [make_req(f"r{i}", p, n, index=i, ignore_eos=ignore_eos) for i, (p, n) in enumerate(specs)]
    driver = RealDriver(env.runner, overlap)
    loop = EventLoop(sched, iter(reqs), driver.clock, overlap)
    driver.run(loop)
    sched.check_invariants()
    assert len(sched.done) == len(reqs)
    assert all(r.finished_reason is FinishReason.LENGTH for r in reqs)
    steps = loop.steps.cols
    assert all(s <= e for s, e in zip(steps["device_start"], steps["device_end"]))
    return sched, reqs, loop


_greedy_tokens: dict[tuple[str, bool], list[list[int]]] = {}


@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "overlap"])
def test_greedy_generation_equals_transformers_generate(env, overlap):
    specs = [(prompt(20 + i, n), o) for i, (n, o) in enumerate(zip(MIXED_LENS, MIXED_OUTS))]
    _, reqs, loop = _loop_run(env, specs, overlap)
    # All six were prefilled in one batch and decoded together.
    assert loop.steps.cols["mode"][0] == "extend" and loop.steps.cols["batch_size"][0] == 6
    for r, (p, n) in zip(reqs, specs):
        assert r.output_ids == env.generate(p, n), f"request {r.rid} (prompt {len(p)}, {n} tokens), overlap {overlap}"
    _greedy_tokens[(env.arch, overlap)] = [list(r.output_ids) for r in reqs]


def test_overlap_on_and_off_give_the_same_tokens(env):
    runs = {}
    for overlap in (False, True):
        if (env.arch, overlap) not in _greedy_tokens:  # run alone (-k): compute it here
            specs = [(prompt(20 + i, n), o) for i, (n, o) in enumerate(zip(MIXED_LENS, MIXED_OUTS))]
            _greedy_tokens[(env.arch, overlap)] = [list(r.output_ids) for r in _loop_run(env, specs, overlap)[1]]
        runs[overlap] = _greedy_tokens[(env.arch, overlap)]
    assert runs[False] == runs[True]


# --- retraction ---------------------------------------------------------------------------------

# Found by search: with a pool of max(input + output) + 16 = 81 tokens, the scheduler admits
# a request on the discounted estimate of the running ones' remaining outputs
# (new_token_ratio 0.7) and later has to retract one, overlap on or off.
RETRACT_LENS = [10, 18, 33, 11, 18, 31]
RETRACT_OUTS = [31, 28, 32, 34, 39, 19]


@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "overlap"])
def test_retraction_keeps_transformers_tokens(env, overlap):
    specs = [(prompt(40 + i, n), o) for i, (n, o) in enumerate(zip(RETRACT_LENS, RETRACT_OUTS))]
    kv_tokens = max(len(p) + n for p, n in specs) + 16  # room for one request and a bit
    # Admitted on the decode estimate (they may stop at EOS; none is given), so the pool
    # runs out: fixed-length requests would be reserved in full and never retracted.
    sched, reqs, loop = _loop_run(env, specs, overlap, kv_tokens=kv_tokens, ignore_eos=False)
    assert sched.num_retractions > 0, "the tiny KV pool was meant to force a retraction"
    assert sum(loop.steps.cols["num_retracted"]) == sched.num_retractions
    assert any(r.num_retractions > 0 for r in reqs)
    for r, (p, n) in zip(reqs, specs):
        assert r.output_ids == env.generate(p, n), f"request {r.rid} (retracted {r.num_retractions}x), overlap {overlap}"


def test_retraction_logits_equal_transformers_after_the_re_prefill(env):
    """By hand, logits kept: a retracted request's re-prefill (prompt + its outputs so far,
    partly from the radix cache) gives transformers' logits at every position."""
    specs = [(prompt(40 + i, n), o) for i, (n, o) in enumerate(zip(RETRACT_LENS, RETRACT_OUTS))]
    kv_tokens = max(len(p) + n for p, n in specs) + 16
    run = ManualRun(env.runner, scheduler_config(env.runner, kv_tokens=kv_tokens))
    reqs = [run.add(make_req(f"r{i}", p, n, index=i, ignore_eos=False)) for i, (p, n) in enumerate(specs)]
    run.run()
    assert run.sched.num_retractions > 0
    retracted = [r for r in reqs if r.num_retractions]
    # A retracted request was prefilled again, with the outputs it had made.
    for r in retracted:
        extends = [(plan, i) for plan, i in run.records[r.rid].plans if plan.mode is ForwardMode.EXTEND]
        assert len(extends) >= 2
        assert max(plan.seq_lens[i] for plan, i in extends) > r.input_len
    for r, (p, n) in zip(reqs, specs):
        check_record_against_hf(env.hf, run.records[r.rid], r.output_ids, f"request {r.rid} (retracted {r.num_retractions}x)")
        assert r.output_ids == env.generate(p, n)


# --- scheduler options around the same engine ---------------------------------------------------


@pytest.fixture(scope="module")
def qwen2_env(tmp_path_factory) -> Env:
    return Env("qwen2", tmp_path_factory.mktemp("qwen2-matrix"), seed=7)


@pytest.mark.parametrize(
    "page_size, chunk, overlap, disable_radix_cache, kv_tokens, mixed",
    [
        (1, 16, True, False, 4096, False),  # chunks on top of radix hits, overlap
        (4, 16, True, False, 120, False),  # pages of 4, chunks, a pool small enough to retract
        (16, None, False, True, 160, False),  # pages of 16, no prefix cache, no overlap
        # --enable-mixed-chunk: running requests decode inside the prefill forwards (MIXED
        # plans through the extend path), with overlap (decode inputs still on the device) and without.
        (1, 16, True, False, 4096, True),
        (4, 16, False, False, 4096, True),
    ],
    ids=[
        "page1-chunk16-overlap",
        "page4-chunk16-overlap-small-pool",
        "page16-nocache-normal",
        "page1-chunk16-overlap-mixed",
        "page4-chunk16-normal-mixed",
    ],
)
def test_pages_chunks_shared_prefixes_and_staggered_arrivals_keep_transformers_tokens(
    qwen2_env, page_size, chunk, overlap, disable_radix_cache, kv_tokens, mixed
):
    env = qwen2_env
    shared = prompt(99, 40)
    specs = [(prompt(20 + i, n), o) for i, (n, o) in enumerate(zip(MIXED_LENS, MIXED_OUTS))]
    specs += [(shared + prompt(200 + i, 5 + 3 * i), 6 + i) for i in range(4)]
    config = scheduler_config(
        env.runner, kv_tokens=kv_tokens, overlap=overlap, page_size=page_size,
        chunked_prefill_size=chunk, disable_radix_cache=disable_radix_cache, enable_mixed_chunk=mixed,
    )  # fmt: skip
    sched = Scheduler(config)
    # The first of the prefix sharers comes with the rest, the others 0.1 s later: by then
    # it has been prefilled and cached (a forward of this model takes milliseconds).
    arrivals = [0.002 * i if i <= 6 else 0.1 + 0.002 * i for i in range(len(specs))]
    reqs = [make_req(f"r{i}", p, n, index=i, arrival=t) for i, ((p, n), t) in enumerate(zip(specs, arrivals))]
    driver = RealDriver(env.runner, overlap)
    loop = EventLoop(sched, iter(reqs), driver.clock, overlap)
    driver.run(loop)
    sched.check_invariants()
    if not disable_radix_cache:
        assert sum(r.cached_tokens for r in reqs) > 0
    assert ("mixed" in loop.steps.cols["mode"]) == mixed
    for r, (p, n) in zip(reqs, specs):
        assert r.output_ids == env.generate(p, n), f"request {r.rid} (prompt {len(p)}, {n} tokens)"
