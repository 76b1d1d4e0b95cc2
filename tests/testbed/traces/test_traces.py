"""Trace loaders, validation errors, native round trip and token materialization."""

from __future__ import annotations

import argparse
import pickle
import time
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.errors import TraceError
from testbed.traces import cli as traces_cli
from testbed.traces import schema
from testbed.traces.formats import detect_format, load_trace
from testbed.traces.schema import Trace, TracePrompts, TraceRequest, file_sha256, materialize_input_ids

SHARED = Path(__file__).resolve().parents[4] / "shared" / "traces"
MOONCAKE = SHARED / "mooncake" / "conversation_trace.jsonl"
AZURE = SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
SHAREGPT = SHARED / "sharegpt" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared trace {path} is absent (expected next to the repository, in shared/traces)")
    return path


@pytest.fixture(scope="module")
def mooncake() -> Trace:
    return load_trace(_need(MOONCAKE))


# --- real traces ----------------------------------------------------------------------


def test_mooncake_loads_fast_and_right():
    path = _need(MOONCAKE)
    t0 = time.perf_counter()
    trace = load_trace(path)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, f"loading Mooncake took {elapsed:.2f} s"
    assert trace.format == "mooncake" and detect_format(path) == "mooncake"
    assert len(trace) == 12_031
    first = trace.requests[0]
    assert (first.arrival_s, first.input_len, first.output_len) == (0.0, 6758, 500)
    assert first.block_hashes == list(range(14)) and first.block_size == 512
    assert trace.requests[-1].arrival_s == pytest.approx(3536.999)
    assert all(len(r.block_hashes) == -(-r.input_len // 512) for r in trace.requests)


def test_mooncake_equal_hashes_give_equal_blocks(mooncake):
    reqs = mooncake.requests
    # Requests 0 and 1 share hash 0 in block 0, then differ (1 vs 14).
    assert reqs[0].block_hashes[:2] == [0, 1] and reqs[1].block_hashes[:2] == [0, 14]
    for vocab in (None, 128_256):
        a = materialize_input_ids(reqs[0], 0, vocab)
        b = materialize_input_ids(reqs[1], 1, vocab)
        assert len(a) == reqs[0].input_len and len(b) == reqs[1].input_len
        assert a[:512] == b[:512]
        assert a[512] != b[512]
        if vocab:
            assert all(0 <= t < vocab for t in a + b)
    # A hash shared at a later position by requests far apart in the trace.
    where: dict[tuple[int, int], int] = {}
    found = None
    for i, r in enumerate(reqs):
        for pos, h in enumerate(r.block_hashes[:-1]):  # full blocks only
            if pos > 0 and (pos, h) in where and where[(pos, h)] < i - 1:
                found = (where[(pos, h)], i, pos)
                break
            where.setdefault((pos, h), i)
        if found:
            break
    assert found, "expected the conversation trace to reuse a non-first block"
    i, j, pos = found
    a = materialize_input_ids(reqs[i], i, None)
    b = materialize_input_ids(reqs[j], j, None)
    assert a[pos * 512 : (pos + 1) * 512] == b[pos * 512 : (pos + 1) * 512]


def test_mooncake_distinct_hashes_give_distinct_first_tokens(mooncake):
    first_tokens: dict[int, int] = {}
    for i, r in enumerate(mooncake.requests[:500]):
        ids = materialize_input_ids(r, i, None)
        for k, h in enumerate(r.block_hashes):
            tok = ids[k * 512]
            assert first_tokens.setdefault(h, tok) == tok
    assert len(set(first_tokens.values())) == len(first_tokens)


def test_azure_loads_with_wall_clock_seconds():
    path = _need(AZURE)
    trace = load_trace(path)
    assert trace.format == "azure" and len(trace) == 8_819
    r0, r1 = trace.requests[:2]
    assert (r0.arrival_s, r0.input_len, r0.output_len) == (0.0, 4808, 10)
    # 18:17:04.0319600 - 18:17:03.9799600
    assert r1.arrival_s == pytest.approx(0.052, abs=1e-9)
    # 19:14:19.9280160 - 18:17:03.9799600 = 57 min 15.948056 s
    assert trace.requests[-1].arrival_s == pytest.approx(3435.948056, abs=1e-9)
    assert all(r.block_hashes is None for r in trace.requests)


def test_sharegpt_needs_rate_and_is_seeded():
    path = _need(SHAREGPT)
    with pytest.raises(TraceError, match="--rate"):
        load_trace(path)
    trace = load_trace(path, rate=5.0, seed=3)
    assert trace.format == "sharegpt" and len(trace) == 30_731
    first = trace.requests[0]
    assert (first.arrival_s, first.input_len, first.output_len) == (0.0, 74, 918)
    assert 30_731 / trace.duration_s == pytest.approx(5.0, rel=0.05)
    again = load_trace(path, rate=5.0, seed=3)
    other = load_trace(path, rate=5.0, seed=4)
    assert [r.arrival_s for r in again.requests] == [r.arrival_s for r in trace.requests]
    assert [r.arrival_s for r in other.requests] != [r.arrival_s for r in trace.requests]


# --- detection and --format -----------------------------------------------------------

MOONCAKE_ROWS = (
    '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
    '{"timestamp": 1500, "input_length": 100, "output_length": 7, "hash_ids": [1]}\n'
)
AZURE_ROWS = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,10,3\r\n2023-11-16 18:17:04.0000000,20,4"


def test_detection_is_by_content_not_name(tmp_path):
    (tmp_path / "looks.csv").write_text(MOONCAKE_ROWS)
    (tmp_path / "looks.jsonl").write_text(AZURE_ROWS)
    assert detect_format(tmp_path / "looks.csv") == "mooncake"
    assert detect_format(tmp_path / "looks.jsonl") == "azure"
    t = load_trace(tmp_path / "looks.csv")
    assert [r.arrival_s for r in t.requests] == [0.0, 1.5]
    azure = load_trace(tmp_path / "looks.jsonl")
    assert azure.requests[1].arrival_s == pytest.approx(0.02004, abs=1e-9)


def test_csv_tolerates_extra_columns_and_order(tmp_path):
    p = tmp_path / "az.csv"
    p.write_text("extra,GeneratedTokens,ContextTokens,TIMESTAMP\nx,3,10,2023-11-16 18:17:03.5\ny,4,20,2023-11-16 18:17:05\n")
    t = load_trace(p)
    assert [(r.arrival_s, r.input_len, r.output_len) for r in t.requests] == [(0.0, 10, 3), (1.5, 20, 4)]


def test_format_forcing(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(MOONCAKE_ROWS)
    assert load_trace(p, format="mooncake").format == "mooncake"
    with pytest.raises(TraceError) as e:
        load_trace(p, format="native")
    assert (e.value.line, e.value.field) == (1, "arrival")
    a = tmp_path / "a.csv"
    a.write_text(AZURE_ROWS)
    with pytest.raises(TraceError) as e:
        load_trace(a, format="sharegpt", rate=1.0)
    assert e.value.field == "num_prefill_tokens" and "missing column" in str(e.value)
    cols = tmp_path / "cols.csv"
    cols.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:17:02.0,5\n")
    with pytest.raises(TraceError) as e:
        load_trace(cols, format="azure")
    assert (e.value.line, e.value.field) == (1, "GeneratedTokens")
    with pytest.raises(TraceError, match="unknown format"):
        load_trace(a, format="burstgpt")


# --- validation errors ----------------------------------------------------------------

HEADER = '{"format": "testbed-trace", "version": 1, "requests": [\n'
OK = '{"arrival": 0, "input_len": 5, "output_len": 3}'

ERROR_CASES = [
    # (file name, content, line, field, words in the message)
    ("bad.jsonl", OK + '\n{"arrival": 1, "input_len": 5,\n', 2, None, "invalid JSON"),
    ("miss.jsonl", OK + '\n{"arrival": 1, "input_len": 5}\n', 2, "output_len", "missing"),
    ("neg.jsonl", "\n" + OK + '\n{"arrival": 1, "input_len": 5, "output_len": -3}\n', 3, "output_len", "got -3"),
    ("zero.jsonl", '{"arrival": 0, "input_len": 5, "output_len": 0}\n', 1, "output_len", "got 0"),
    ("nan.jsonl", '{"arrival": "soon", "input_len": 5, "output_len": 1}\n', 1, "arrival", "number"),
    ("negt.jsonl", '{"arrival": -1, "input_len": 5, "output_len": 1}\n', 1, "arrival", "non-negative"),
    ("strlen.jsonl", '{"arrival": 0, "input_len": "5", "output_len": 1}\n', 1, "input_len", "integer"),
    ("noinput.jsonl", '{"arrival": 0, "output_len": 1}\n', 1, "input_len", "missing"),
    (
        "sort.jsonl",
        OK + '\n{"arrival": 2, "input_len": 5, "output_len": 3}\n{"arrival": 1, "input_len": 5, "output_len": 3}\n',
        3,
        "arrival",
        "non-decreasing",
    ),
    (
        "hash.jsonl",
        '{"arrival": 0, "input_len": 100, "block_size": 64, "block_hashes": [1, 2, 3], "output_len": 1}\n',
        1,
        "block_hashes",
        "at most ceil(100/64) = 2",
    ),
    ("ids.jsonl", '{"arrival": 0, "input_ids": [1, 2, 3], "input_len": 4, "output_len": 1}\n', 1, "input_len", "3 tokens"),
    ("hdr.jsonl", '{"format": "testbed-trace", "version": 2}\n' + OK + "\n", 1, "version", "version 1"),
    ("syntax.json", HEADER + OK + ",\n" + OK + ",\n" + '{"arrival": 1 "input_len": 5, "output_len": 3}\n]}\n', 4, None, "invalid JSON"),
    ("elem.json", HEADER + OK + ",\n" + OK + ",\n\n" + '{"arrival": 1, "input_len": 5, "output_len": 0}\n]}\n', 5, "output_len", "got 0"),
    ("sort.json", HEADER + '{"arrival": 5, "input_len": 5, "output_len": 3},\n' + OK + "\n]}\n", 3, "arrival", "non-decreasing"),
    ("list.json", "[\n" + OK + ",\n  " + '{"arrival": 1, "input_len": -5, "output_len": 3}]', 3, "input_len", "got -5"),
    (
        "mc_hash.jsonl",
        MOONCAKE_ROWS + '{"timestamp": 2000, "input_length": 1025, "output_length": 5, "hash_ids": [1, 2]}\n',
        3,
        "hash_ids",
        "ceil(1025/512) = 3",
    ),
    ("mc_out.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [1]}\n', 1, "output_length", "got 0"),
    (
        "mc_sort.jsonl",
        '{"timestamp": 10, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
        '{"timestamp": 9, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n',
        2,
        "timestamp",
        "non-decreasing",
    ),
    ("mc_miss.jsonl", '{"timestamp": 0, "output_length": 1, "hash_ids": [1]}\n', 1, "input_length", "missing"),
    ("az_time.csv", AZURE_ROWS + "\r\nyesterday,5,5", 4, "TIMESTAMP", "must be a time"),
    ("az_neg.csv", AZURE_ROWS + "\r\n2023-11-16 18:17:05.0,-5,5", 4, "ContextTokens", "got -5"),
    ("az_zero.csv", AZURE_ROWS + "\r\n2023-11-16 18:17:05.0,5,0", 4, "GeneratedTokens", "got 0"),
    ("az_text.csv", AZURE_ROWS + "\r\n2023-11-16 18:17:05.0,5,many", 4, "GeneratedTokens", "'many'"),
    ("az_sort.csv", AZURE_ROWS + "\r\n2023-11-16 18:17:02.0,5,5", 4, "TIMESTAMP", "non-decreasing"),
    ("sg_zero.csv", "num_prefill_tokens,num_decode_tokens\n5,5\n7,0\n", 3, "num_decode_tokens", "got 0"),
    ("unknown.txt", "hello, world\n", 1, None, "unrecognized trace format"),
]


@pytest.mark.parametrize("name,content,line,field,words", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_errors_name_file_line_and_field(tmp_path, name, content, line, field, words):
    path = tmp_path / name
    path.write_bytes(content.encode())
    with pytest.raises(TraceError) as e:
        load_trace(path, rate=1.0)
    err = e.value
    assert (err.path, err.line, err.field) == (str(path), line, field)
    prefix = f"{path}:{line}: " + (f"field {field!r}: " if field else "")
    assert str(err).startswith(prefix), str(err)
    assert words in str(err)


@pytest.mark.parametrize(
    "content", ["", "\n\n", '{"format": "testbed-trace", "version": 1}\n', HEADER + "]}\n", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"]
)
def test_empty_traces_are_errors(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError, match="empty|no requests"):
        load_trace(path)


def test_trace_error_reads_like_a_compiler_message():
    e = TraceError("traces/x.jsonl", 12, "output_len", "must be a non-negative integer, got -3")
    assert str(e) == "traces/x.jsonl:12: field 'output_len': must be a non-negative integer, got -3"
    assert str(TraceError("x.csv", None, None, "empty trace file")) == "x.csv: empty trace file"
    assert str(pickle.loads(pickle.dumps(e))) == str(e)


def test_missing_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "nope.json")


# --- native round trip ----------------------------------------------------------------

SAMPLE = [
    TraceRequest(0.0, 700, 10, block_hashes=[5, 6], block_size=512, rid="a"),
    TraceRequest(0.125, 3, 1, input_ids=[7, 8, 9], priority=2),
    TraceRequest(0.125, 130, 99, block_hashes=[-1, 2**70], block_size=64),
    TraceRequest(1 / 3, 1, 1),
]


@pytest.mark.parametrize("name", ["t.json", "t.jsonl"])
def test_native_round_trip(tmp_path, name):
    path = tmp_path / name
    Trace(list(SAMPLE)).write(path)
    loaded = load_trace(path)
    assert loaded.format == "native" and loaded.requests == SAMPLE
    assert loaded.sha256() == file_sha256(path)
    # One request per line, so that errors name a line.
    lines = path.read_text().splitlines()
    assert len(lines) == len(SAMPLE) + (1 if name.endswith(".jsonl") else 2)


def test_native_long_first_line_and_one_line_json(tmp_path):
    ids = list(range(30_000))  # a first line far longer than any read-ahead buffer
    jsonl = tmp_path / "long.jsonl"
    jsonl.write_text(f'{{"arrival": 0, "input_ids": {ids}, "output_len": 2}}\n{OK.replace("0", "1", 1)}\n')
    t = load_trace(jsonl)
    assert t.requests[0].input_ids == ids and t.requests[0].input_len == 30_000 and len(t) == 2
    one = tmp_path / "one.json"
    one.write_text('{"format": "testbed-trace", "version": 1, "requests": [' + OK + ", " + OK + "]}")
    assert len(load_trace(one)) == 2


def test_mooncake_round_trip_through_native(tmp_path, mooncake):
    part = Trace(mooncake.requests[:3000])  # a slice keeps the test quick
    path = tmp_path / "mc.json"
    part.write(path)
    again = load_trace(path)
    assert again.requests == part.requests
    assert again.stats() == part.stats()


# --- materialize_input_ids ------------------------------------------------------------


def test_materialize_rules():
    explicit = TraceRequest(0.0, 3, 1, input_ids=[4, 5, 6])
    assert list(materialize_input_ids(explicit, 0)) == explicit.input_ids
    plain = TraceRequest(0.0, 1000, 1)
    a, b = materialize_input_ids(plain, 0), materialize_input_ids(plain, 1)
    assert len(a) == 1000 and a[0] != b[0]  # unique to the request
    assert materialize_input_ids(plain, 0) == a  # deterministic
    # Hashed blocks then a unique tail; a partial block is a prefix of the full one.
    full = TraceRequest(0.0, 64 * 3, 1, block_hashes=[1, 2, 3], block_size=64)
    part = TraceRequest(0.0, 64 * 2 + 10, 1, block_hashes=[1, 2, 3], block_size=64)
    tail = TraceRequest(0.0, 64 * 2 + 10, 1, block_hashes=[1, 2], block_size=64)
    for vocab in (None, 1000):
        f, p, t = (materialize_input_ids(r, i, vocab) for i, r in enumerate([full, part, tail]))
        assert p == f[: len(p)]
        assert t[:128] == f[:128] and t[128] != f[128]
        assert all(x >= 0 for x in f + p + t)
        if vocab:
            assert max(f + p + t) < vocab


def test_materialize_is_fast(mooncake):
    reqs = mooncake.requests[:300]
    blocks = sum(len(r.block_hashes) for r in reqs)
    t0 = time.perf_counter()
    for i, r in enumerate(reqs):
        materialize_input_ids(r, i, None)
    per_block = (time.perf_counter() - t0) / blocks
    assert per_block < 20e-6, f"{per_block * 1e6:.1f} us per 512-token block"  # loose: CI machines vary


def _materialize_block_by_block(req: TraceRequest, index: int, vocab_size: int | None) -> array:
    """The former implementation, one block at a time from a materialized pool: the reference
    the numpy one must equal token for token."""
    if req.input_ids is not None:
        return array("q", req.input_ids)
    pool = array("q", range(schema._SIM_POOL_SIZE if vocab_size is None else vocab_size))

    def run(out: array, n: int, marker: int, mixed: int) -> None:
        if n <= 0:
            return
        out.append(marker)
        offset, n = mixed % len(pool), n - 1
        while n > 0:
            take = min(n, len(pool) - offset)
            out.extend(pool[offset : offset + take])
            n -= take
            offset = 0

    out, total, pos = array("q"), req.input_len, 0
    for h in req.block_hashes or ():
        n = min(req.block_size, total - pos)
        if n <= 0:
            break
        mixed = schema._mix64(schema._zigzag(h) & schema._MASK64)
        run(out, n, schema._sim_hash_marker(h) if vocab_size is None else mixed % vocab_size, mixed >> 20)
        pos += n
    if pos < total:
        mixed = schema._mix64((index ^ 0x5DEECE66D) & schema._MASK64)
        marker = schema._SIM_REQUEST_MARKER_BASE + index if vocab_size is None else mixed % vocab_size
        run(out, total - pos, marker, mixed >> 20)
    return out


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.integers(-1000, 100_000), st.integers(-(2**70), 2**70)), max_size=8),
    st.integers(1, 700),  # block size
    st.integers(0, 4000),  # prompt tokens: fewer, as many as or more than the blocks cover
    st.integers(0, 20_000),  # request index
    st.sampled_from([None, 1, 7, 50, 32_000, 1 << 16, 150_000]),
    st.booleans(),  # explicit input_ids
)
def test_materialize_equals_block_by_block(hashes, block_size, input_len, index, vocab, explicit):
    input_ids = [(7 * i) % 97 for i in range(input_len)] if explicit else None
    req = TraceRequest(0.0, input_len, 1, input_ids=input_ids, block_hashes=hashes or None, block_size=block_size)
    got = materialize_input_ids(req, index, vocab)
    assert type(got) is array and got.typecode == "q"
    assert got == _materialize_block_by_block(req, index, vocab)


_request_strategy = st.builds(
    lambda hashes, block_size, input_len, explicit: TraceRequest(
        0.0,
        input_len,
        1,
        input_ids=[(7 * i) % 97 for i in range(input_len)] if explicit else None,
        block_hashes=hashes or None,
        block_size=block_size,
    ),
    st.lists(st.integers(-1000, 100_000), max_size=8)
    | st.lists(st.one_of(st.integers(-1000, 100_000), st.integers(-(2**70), 2**70)), max_size=8),
    st.integers(1, 700),
    st.integers(0, 4000),
    st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_request_strategy, max_size=6), st.sampled_from([None, 1, 7, 50, 32_000, 1 << 16]), st.randoms(), st.integers(1, 4))
def test_trace_prompts_equal_materialize_input_ids(requests, vocab, rng, window):
    """A replay's prompts (TracePrompts: a window of requests' block markers in one pass) are
    the requests' materialize_input_ids, whatever order they are asked for in."""
    prompts = TracePrompts(requests, vocab)
    prompts.WINDOW = window
    order = list(range(len(requests)))
    rng.shuffle(order)
    for i in order:
        got = prompts.prompt(i)
        assert type(got) is array and got.typecode == "q"
        assert got == _materialize_block_by_block(requests[i], i, vocab)


def test_trace_prompts_of_mooncake_equal_materialize_input_ids(mooncake):
    reqs = mooncake.requests[:300]
    for vocab in (None, 128_256):
        prompts = TracePrompts(reqs, vocab)
        for i in (299, 0, 1, 150, 151):
            assert prompts.prompt(i) == materialize_input_ids(reqs[i], i, vocab)


@pytest.mark.slow
def test_materialize_mooncake_equals_block_by_block(mooncake):
    for i, r in enumerate(mooncake.requests[:200]):
        for vocab in (None, 128_256):
            assert materialize_input_ids(r, i, vocab) == _materialize_block_by_block(r, i, vocab)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-(2**63), 2**63), min_size=1, max_size=6),
    st.lists(st.integers(-(2**63), 2**63), min_size=1, max_size=6),
    st.sampled_from([None, 50, 32_000]),
)
def test_equal_hashes_equal_tokens_property(h1, h2, vocab):
    bs = 16
    r1 = TraceRequest(0.0, len(h1) * bs, 1, block_hashes=h1, block_size=bs)
    r2 = TraceRequest(0.0, len(h2) * bs, 1, block_hashes=h2, block_size=bs)
    t1, t2 = materialize_input_ids(r1, 0, vocab), materialize_input_ids(r2, 1, vocab)
    for i, x in enumerate(h1):
        for j, y in enumerate(h2):
            b1, b2 = t1[i * bs : (i + 1) * bs], t2[j * bs : (j + 1) * bs]
            if x == y:
                assert b1 == b2
            elif vocab is None:
                assert b1[0] != b2[0]


# --- CLI: convert and info ------------------------------------------------------------


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="testbed")
    traces_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_convert_and_info(tmp_path, capsys):
    src = tmp_path / "m.jsonl"
    src.write_text(MOONCAKE_ROWS)
    dst = tmp_path / "out.jsonl"
    assert _cli(["trace", "convert", str(src), "--out", str(dst)]) == 0
    assert load_trace(dst).requests == load_trace(src).requests
    assert _cli(["trace", "info", str(dst)]) == 0
    out = capsys.readouterr().out
    assert "native" in out and "requests" in out and "2 unique of 3" in out
    sg = tmp_path / "sg.csv"
    sg.write_text("num_prefill_tokens,num_decode_tokens,pd_ratio\n5,5,1\n7,3,2\n")
    assert _cli(["trace", "info", str(sg)]) == 0  # lengths only, without --rate
    assert "no arrival times" in capsys.readouterr().out
    with pytest.raises(TraceError, match="--rate"):
        _cli(["trace", "convert", str(sg), "--out", str(tmp_path / "x.json")])
    assert _cli(["trace", "convert", str(sg), "--out", str(tmp_path / "x.json"), "--rate", "2"]) == 0
    with pytest.raises(TraceError) as e:
        _cli(["trace", "info", str(src), "--format", "native"])
    assert e.value.line == 1
