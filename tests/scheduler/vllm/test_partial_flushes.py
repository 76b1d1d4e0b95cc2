"""A vLLM lookup hashes only the blocks it reaches, and puts in the prefix cache's map only the
waiting blocks below them (kv_blocks.VllmKVBlocks.get_computed_blocks, unhashed_blocks.py's
flush(below)); freed requests' blocks past that wait on, split from those flushed. Here the
first window is 2 blocks, so that prompts of a few blocks go through every part of it (hashes
extended as the hit grows, flushes again past the first, freed runs split, the evicted ones
dropped), and a replay equals one whose every lookup flushes every waiting block and hashes
its whole prompt first: the same prefix hits, steps and pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.vllm import block_hash_index, block_pool, kv_blocks, unhashed_blocks
from scheduler.vllm.kv_blocks import VllmKVBlocks
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import load_run
from testbed.traces.gen import GenConfig, generate_trace

FIRST_WINDOW = 2


def _conversations(seed: int):
    """Multi-turn conversations on shared system prompts: later turns' lookups reach far into
    earlier turns' blocks, which freed requests and running ones hold."""
    return generate_trace(
        GenConfig(
            num_requests=60,
            rate=20.0,
            input_len="uniform:30,400",
            output_len="uniform:1,80",
            system_prompts=2,
            system_prompt_len=120,
            shared_fraction=0.7,
            multi_turn_fraction=0.8,
            turns=4,
            block_size=16,
            seed=seed,
        )
    )


def _whole_lookup(self: VllmKVBlocks, req) -> list[int]:
    """The reference: every waiting block in the map, the whole prompt hashed, then the lookup."""
    if not self.enable_caching:
        return []
    max_blocks = (req.input_len + len(req.output_ids) - 1) // self.page_size
    if not max_blocks:
        return []
    self.unhashed.flush()
    return self.pool.longest_hit(self._hashes(req, self._state(req), max_blocks)[:max_blocks])


def _replay(trace, tmp: Path, **opts):
    path = tmp / "trace.json"
    tmp.mkdir(parents=True, exist_ok=True)
    trace.write(path)
    result = replay(str(path), ReplayOptions(scheduler="vllm", **opts), out=tmp / "run")
    return result, load_run(tmp / "run")


@pytest.mark.parametrize("page_size", [4, 16])
@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("seed", [1, 2])
def test_lookups_that_flush_only_what_they_reach_give_the_run_of_whole_flushes(page_size, overlap, seed, tmp_path, monkeypatch):
    for module in (kv_blocks, unhashed_blocks, block_pool):
        monkeypatch.setattr(module, "FIRST_HASHED" if module is kv_blocks else "FIRST_PROBES", FIRST_WINDOW)
    # A small hash table: rebuilt many times while blocks wait past `below` (their hashes unknown).
    monkeypatch.setattr(block_hash_index, "SLOTS_PER_BLOCK", 2)
    monkeypatch.setattr(block_hash_index, "MIN_SLOTS_PER_BLOCK", 2)
    seen = {"partial": 0, "split": 0, "past_first": 0, "rebuilt_beside_waiting": 0}
    flush, split, lookup = unhashed_blocks.UnhashedBlocks.flush, unhashed_blocks.UnhashedRun.split, VllmKVBlocks.get_computed_blocks
    rebuild = block_hash_index.BlockHashIndex._rebuild

    def counting_rebuild(self, *args):
        seen["rebuilt_beside_waiting"] += bool(waiting_of[0])
        return rebuild(self, *args)

    waiting_of = [None]

    def counting_flush(self, below=None):
        waiting_of[0] = self
        flush(self, below)
        seen["partial"] += below is not None and bool(self)  # (blocks left waiting past `below`)

    def counting_split(self, k):
        seen["split"] += 1
        return split(self, k)

    def counting_lookup(self, req):
        hit = lookup(self, req)
        seen["past_first"] += len(hit) > FIRST_WINDOW
        return hit

    monkeypatch.setattr(unhashed_blocks.UnhashedBlocks, "flush", counting_flush)
    monkeypatch.setattr(unhashed_blocks.UnhashedRun, "split", counting_split)
    monkeypatch.setattr(VllmKVBlocks, "get_computed_blocks", counting_lookup)
    monkeypatch.setattr(block_hash_index.BlockHashIndex, "_rebuild", counting_rebuild)
    trace = _conversations(seed)
    # A pool for about a dozen requests: the cache fills and evicts.
    opts = dict(page_size=page_size, kv_tokens=6000, overlap=overlap)
    res, run = _replay(trace, tmp_path / "partial", **opts)
    assert seen["partial"] >= 5 and seen["split"] >= 5 and seen["past_first"] >= 5 and seen["rebuilt_beside_waiting"] >= 2, seen
    monkeypatch.setattr(VllmKVBlocks, "get_computed_blocks", _whole_lookup)
    ref_res, ref_run = _replay(trace, tmp_path / "whole", **opts)
    assert res.summary == ref_res.summary
    assert run.requests.equals(ref_run.requests)
    assert run.steps.equals(ref_run.steps)
    assert int(run.requests["cached_tokens"].sum()) > 0
