"""The trace generator: determinism, arrivals, lengths, shared prefixes, traces/a.json."""

from __future__ import annotations

import argparse
import re
import shlex
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from testbed.traces import cli as traces_cli
from testbed.traces.formats import load_trace
from testbed.traces.gen import GenConfig, generate_trace, parse_length_spec
from testbed.traces.schema import materialize_input_ids

REPO = Path(__file__).resolve().parents[3]


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="testbed")
    traces_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


MIXED = GenConfig(
    num_requests=400,
    rate=10,
    system_prompts=3,
    system_prompt_len=256,
    shared_fraction=0.6,
    multi_turn_fraction=0.4,
    turns=3,
    block_size=64,
    seed=7,
)


def test_same_seed_same_trace_other_seed_other_trace():
    a, b = generate_trace(MIXED), generate_trace(MIXED)
    assert a.requests == b.requests
    c = generate_trace(GenConfig(**{**MIXED.__dict__, "seed": 8}))
    assert c.requests != a.requests


def test_poisson_arrivals():
    t = generate_trace(GenConfig(num_requests=4000, rate=20, seed=1))
    arr = np.array([r.arrival_s for r in t.requests])
    assert arr[0] == 0.0 and np.all(np.diff(arr) >= 0)
    assert len(t) / t.duration_s == pytest.approx(20, rel=0.06)
    gaps = np.diff(arr)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.1)


def test_gamma_arrivals_are_bursty_at_the_same_rate():
    t = generate_trace(GenConfig(num_requests=6000, rate=20, arrival="gamma", cv=3.0, seed=2))
    gaps = np.diff([r.arrival_s for r in t.requests])
    assert 1 / gaps.mean() == pytest.approx(20, rel=0.15)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.2)


def test_length_specs():
    rng = np.random.default_rng(0)
    assert parse_length_spec("512").sample(rng, 3).tolist() == [512] * 3
    assert parse_length_spec("const:7").sample(rng, 2).tolist() == [7, 7]
    u = parse_length_spec("uniform:10,20").sample(rng, 5000)
    assert u.min() == 10 and u.max() == 20
    n = parse_length_spec("normal:1,100").sample(rng, 2000)
    assert n.min() >= 1  # clipped
    ln = parse_length_spec("lognormal:300,0.5").sample(rng, 20000)
    assert ln.mean() == pytest.approx(300, rel=0.05)
    for bad in ["", "uniform:5", "uniform:9,3", "gauss:1,2", "normal:5,-1", "0", "lognormal:0,1", "1,2"]:
        with pytest.raises(ValueError, match="bad length spec"):
            parse_length_spec(bad)


def test_no_sharing_means_no_hashes():
    t = generate_trace(GenConfig(num_requests=50, seed=3))
    assert all(r.block_hashes is None for r in t.requests)
    assert len({tuple(materialize_input_ids(r, i)[:1]) for i, r in enumerate(t.requests)}) == 50


def test_system_prompts_share_block_hashes_and_tokens():
    cfg = GenConfig(num_requests=200, system_prompts=3, system_prompt_len=200, shared_fraction=1.0, block_size=64, seed=4)
    t = generate_trace(cfg)
    full_blocks = 200 // 64  # the partial 4th block is mixed with each request's own tokens
    prefixes = {tuple(r.block_hashes[:full_blocks]) for r in t.requests}
    assert len(prefixes) == 3
    boundary = [r.block_hashes[full_blocks] for r in t.requests]
    assert len(set(boundary)) == len(boundary)  # never shared
    by_prefix = defaultdict(list)
    for i, r in enumerate(t.requests):
        by_prefix[tuple(r.block_hashes[:full_blocks])].append(i)
    for idx in by_prefix.values():
        i, j = idx[:2]
        a = materialize_input_ids(t.requests[i], i, None)
        b = materialize_input_ids(t.requests[j], j, None)
        assert a[: full_blocks * 64] == b[: full_blocks * 64]
        assert a[full_blocks * 64] != b[full_blocks * 64]


def test_conversation_turns_extend_the_previous_prompt():
    cfg = GenConfig(
        num_requests=120,
        multi_turn_fraction=1.0,
        turns=4,
        system_prompts=2,
        system_prompt_len=100,
        shared_fraction=0.5,
        block_size=32,
        seed=5,
    )
    t = generate_trace(cfg)
    convs = defaultdict(list)
    for i, r in enumerate(t.requests):
        conv, turn = re.fullmatch(r"conv(\d+)\.turn(\d+)", r.rid).groups()
        convs[conv].append((int(turn), i))
    assert len(convs) == 30 and all(len(v) == 4 for v in convs.values())
    for turns in convs.values():
        assert [turn for turn, _ in turns] == [0, 1, 2, 3]  # in arrival order
        for (_, i), (_, j) in zip(turns, turns[1:]):
            prev, cur = t.requests[i], t.requests[j]
            assert cur.input_len > prev.input_len + prev.output_len
            # The whole previous prompt is a prefix, in hashes and in tokens.
            assert cur.block_hashes[: len(prev.block_hashes)] == prev.block_hashes
            for vocab in (None, 32_000):
                a = materialize_input_ids(prev, i, vocab)
                b = materialize_input_ids(cur, j, vocab)
                assert b[: len(a)] == a


def test_a_json_is_made_by_the_documented_command(tmp_path):
    doc = (REPO / "docs" / "trace-format.md").read_text()
    m = re.search(r"^testbed trace gen --out traces/a\.json .*$", doc, re.M)
    assert m, "docs/trace-format.md must show the command that made traces/a.json"
    argv = shlex.split(m.group(0))[1:]
    out = tmp_path / "a.json"
    argv[argv.index("--out") + 1] = str(out)
    assert _cli(argv) == 0
    assert out.read_bytes() == (REPO / "traces" / "a.json").read_bytes()
    t = load_trace(REPO / "traces" / "a.json")
    assert len(t) == 300 and t.stats().reusable_fraction > 0.2


def test_cli_gen_rejects_bad_settings(tmp_path, capsys):
    assert _cli(["trace", "gen", "--out", str(tmp_path / "x.json"), "--shared-fraction", "1.5"]) == 2
    assert "shared_fraction" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        _cli(["trace", "gen", "--out", str(tmp_path / "x.json"), "--input-len", "uniform:9"])
    assert e.value.code == 2
    out = tmp_path / "g.jsonl"
    assert _cli(["trace", "gen", "--out", str(out), "-n", "20", "--arrival", "gamma", "--cv", "2"]) == 0
    assert len(load_trace(out)) == 20
