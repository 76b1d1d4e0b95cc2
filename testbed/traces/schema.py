"""The native trace schema: a list of requests with arrival times and lengths.

A request carries its prompt either as explicit token ids or as a length,
optionally with block hashes that say which blocks of the prompt are shared
with other requests. Token ids for the latter are made on demand by
`materialize_input_ids`, one request at a time (a replay's through `TracePrompts`, which
computes the block markers of a window of requests at once): a Mooncake replay holds
about 144M prompt tokens, which must never all be in memory at once.

The file format is described in docs/trace-format.md; loaders live in
testbed/traces/formats.py.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from pathlib import Path

import numpy as np

NATIVE_FORMAT_TAG = "testbed-trace"
NATIVE_VERSION = 1
DEFAULT_BLOCK_SIZE = 512


@dataclass(slots=True)
class TraceRequest:
    arrival_s: float  # seconds from trace start, non-decreasing over the trace
    input_len: int  # prompt tokens (>= 1)
    output_len: int  # tokens to generate (>= 1)
    input_ids: list[int] | None = None  # explicit prompt tokens (then input_len == len(input_ids))
    # Prefix sharing: block i covers tokens [i*block_size, (i+1)*block_size); equal hash = equal
    # tokens. A partial last block holds a prefix of the tokens of a full block with that hash.
    block_hashes: list[int] | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    rid: str | None = None
    priority: int = 0

    def to_json_obj(self) -> dict:
        """The request as a native-format JSON object (defaults left out)."""
        obj: dict = {"arrival": self.arrival_s, "input_len": self.input_len, "output_len": self.output_len}
        if self.input_ids is not None:
            obj["input_ids"] = self.input_ids
        if self.block_hashes is not None:
            obj["block_hashes"] = self.block_hashes
            obj["block_size"] = self.block_size
        if self.rid is not None:
            obj["id"] = self.rid
        if self.priority:
            obj["priority"] = self.priority
        return obj


@dataclass(slots=True)
class TraceStats:
    """What `testbed trace info` prints; cheap to compute (no token ids made)."""

    num_requests: int
    duration_s: float  # last arrival - first arrival
    mean_input_len: float
    mean_output_len: float
    max_input_len: int
    max_output_len: int
    total_input_tokens: int
    total_output_tokens: int
    hashed_requests: int  # requests that carry block hashes
    total_blocks: int  # block hashes over all requests
    unique_blocks: int  # distinct (block_size, hash) pairs
    # Prompt tokens an infinite prefix cache could serve: per request, the leading blocks
    # already seen in an earlier request (an upper bound on the radix cache hit rate).
    reusable_prefix_tokens: int

    @property
    def rate(self) -> float:
        return (self.num_requests - 1) / self.duration_s if self.duration_s > 0 else float("inf")

    @property
    def reusable_fraction(self) -> float:
        return self.reusable_prefix_tokens / self.total_input_tokens if self.total_input_tokens else 0.0


@dataclass
class Trace:
    requests: list[TraceRequest]
    path: str | None = None  # the file it was loaded from, if any
    format: str = "native"  # the format it was loaded from

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s - self.requests[0].arrival_s if self.requests else 0.0

    def sha256(self) -> str:
        """Hash of the source file (identifies the trace a run replayed); of the native
        JSONL serialization for a trace made in memory."""
        if self.path is not None and os.path.isfile(self.path):
            return file_sha256(self.path)
        h = hashlib.sha256()
        for line in _native_lines(self.requests):
            h.update(line.encode())
            h.update(b"\n")
        return h.hexdigest()

    def write(self, path: str | os.PathLike) -> None:
        """Write the native format: JSONL if the name ends with .jsonl, else the JSON object
        form. Either way one request per line, so that errors can name a line."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        header = {"format": NATIVE_FORMAT_TAG, "version": NATIVE_VERSION}
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            if path.suffix == ".jsonl":
                f.write(json.dumps(header) + "\n")
                for line in _native_lines(self.requests):
                    f.write(line + "\n")
            else:
                # The header object, then the requests array with one element per line.
                f.write(json.dumps(header)[:-1] + ', "requests": [\n')
                lines = _native_lines(self.requests)
                for i, line in enumerate(lines):
                    f.write(line + (",\n" if i + 1 < len(self.requests) else "\n"))
                f.write("]}\n")
        os.replace(tmp, path)  # never leave a half-written trace under the real name

    def stats(self) -> TraceStats:
        reqs = self.requests
        n = len(reqs)
        total_in = sum(r.input_len for r in reqs)
        total_out = sum(r.output_len for r in reqs)
        # Longest token count seen so far for each block, so that a partial block seen
        # earlier only counts for the tokens it really had.
        seen: dict[tuple[int, int], int] = {}
        total_blocks = hashed = reusable = 0
        for r in reqs:
            if not r.block_hashes:
                continue
            hashed += 1
            total_blocks += len(r.block_hashes)
            bs = r.block_size
            matching = True
            for i, h in enumerate(r.block_hashes):
                ntok = max(0, min(bs, r.input_len - i * bs))
                key = (bs, h)
                before = seen.get(key, 0)
                if matching:
                    reusable += min(ntok, before)
                    matching = before >= ntok
                if ntok > before:
                    seen[key] = ntok
        return TraceStats(
            num_requests=n,
            duration_s=self.duration_s,
            mean_input_len=total_in / n if n else 0.0,
            mean_output_len=total_out / n if n else 0.0,
            max_input_len=max((r.input_len for r in reqs), default=0),
            max_output_len=max((r.output_len for r in reqs), default=0),
            total_input_tokens=total_in,
            total_output_tokens=total_out,
            hashed_requests=hashed,
            total_blocks=total_blocks,
            unique_blocks=len(seen),
            reusable_prefix_tokens=reusable,
        )


def _native_lines(requests: list[TraceRequest]) -> list[str]:
    # Compact separators inside lists keep files with many hashes small; still one line each.
    return [json.dumps(r.to_json_obj(), separators=(", ", ": ")) for r in requests]


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------
# Token ids on demand.
#
# Only token *equality* matters to a prefix cache, and prefix matching stops at the first
# differing token. So each hashed block is one "marker" token that identifies the hash,
# followed by filler tokens read cyclically from a pool, range(pool size), from an offset
# (a memcpy from the pool's bytes, under a microsecond per 512-token block; the markers and
# offsets of a prompt's blocks are computed in one go with numpy). The filler offset is also
# drawn from the hash, so different hashes differ beyond the first token too, except on a
# rare offset collision; that never creates false sharing because the markers differ.
# The unique tail of a request (tokens past its hashed blocks, or all of them when it
# has no hashes) starts with a marker derived from its index, so nothing after it can
# match another request.
#
# vocab_size None (simulator, any int is a token): markers live in ranges disjoint from
#   the pool and from each other, so different hashes always differ at their first token:
#   pool [0, 2^16), request markers 2^20 + index, hash markers 2^40 + zigzag(hash).
#   All ids are non-negative (negative ids are the scheduler's placeholders).
# vocab_size V (real engine): every id must be in [0, V), so markers are a multiplicative
#   hash mod V and collide with probability 1/V. A collision of two sibling blocks
#   makes the radix cache share one token (or, when the filler offsets also collide,
#   with odds of 1/V^2, a whole block). That is harmless for correctness: the KV of
#   equal tokens after an equal prefix is equal. It only adds a rare, tiny cache hit the
#   simulator would not see. The pool is range(V), so fillers are arithmetic
#   progressions mod V.
# ---------------------------------------------------------------------------------------

_SIM_POOL_SIZE = 1 << 16
_SIM_REQUEST_MARKER_BASE = 1 << 20
_SIM_HASH_MARKER_BASE = 1 << 40
_MASK64 = (1 << 64) - 1


def _zigzag(h: int) -> int:
    """Any int to a distinct non-negative int: 0, -1, 1, -2, ... -> 0, 1, 2, 3, ..."""
    return 2 * h if h >= 0 else -2 * h - 1


def _mix64(x: int) -> int:
    """splitmix64 finalizer: spreads nearby integers (hash ids 0, 1, 2, ...) over 64 bits."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _sim_hash_marker(h: int) -> int:
    """A distinct int64 token for each block hash. Hash ids of real traces are small and map
    one to one; the rare huge ones (|h| >= 2**61) are mixed into a disjoint range."""
    z = _zigzag(h)
    if z < 1 << 62:
        return _SIM_HASH_MARKER_BASE + z
    return _SIM_HASH_MARKER_BASE + (1 << 62) + _mix64(z & _MASK64) % (1 << 61)


# splitmix64's constants as numpy scalars: uint64 arrays wrap mod 2**64 like the masks above.
_U1, _U20, _U27, _U30, _U31 = (np.uint64(k) for k in (1, 20, 27, 30, 31))
_MIX_ADD = np.uint64(0x9E3779B97F4A7C15)
_MIX_MUL1, _MIX_MUL2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _block_markers_and_offsets(hashes: list[int], vocab_size: int | None, pool_size: int) -> tuple[list[int], list[int]]:
    """Per block hash: its marker token and its filler offset into the pool (_zigzag, _mix64 and
    _sim_hash_marker over all hashes at once)."""
    if not all(-(1 << 61) <= h < 1 << 61 for h in hashes):
        # Huge hash ids (zigzag beyond 2**62): one at a time, in Python ints.
        mixed = [_mix64(_zigzag(h) & _MASK64) for h in hashes]
        markers = [_sim_hash_marker(h) for h in hashes] if vocab_size is None else [m % vocab_size for m in mixed]
        return markers, [(m >> 20) % pool_size for m in mixed]
    markers, offsets = _block_markers_and_offsets_array(np.array(hashes, dtype=np.int64), vocab_size, pool_size)
    return markers.tolist(), offsets.tolist()


def _block_markers_and_offsets_array(h: np.ndarray, vocab_size: int | None, pool_size: int) -> tuple[np.ndarray, np.ndarray]:
    """_block_markers_and_offsets of int64 hashes in [-2**61, 2**61), as int64 arrays."""
    z = (h.astype(np.uint64) << _U1) ^ (h >> 63).astype(np.uint64)  # zigzag, < 2**62
    x = z + _MIX_ADD
    x ^= x >> _U30
    x *= _MIX_MUL1
    x ^= x >> _U27
    x *= _MIX_MUL2
    x ^= x >> _U31
    offsets = ((x >> _U20) % np.uint64(pool_size)).astype(np.int64)
    if vocab_size is None:
        return (z + np.uint64(_SIM_HASH_MARKER_BASE)).astype(np.int64), offsets
    return (x % np.uint64(vocab_size)).astype(np.int64), offsets


@lru_cache(maxsize=8)
def _pool_bytes(pool_size: int) -> memoryview:
    """range(pool_size) twice over, as int64 bytes: any run of up to pool_size fillers from any
    offset is one slice of it."""
    pool = array("q", range(pool_size))
    pool.extend(pool)
    return memoryview(pool).cast("B")


def _write_run(out: array, out_bytes: memoryview, pos: int, n: int, marker: int, offset: int, pool: memoryview, pool_size: int) -> None:
    """Write n tokens at out[pos:]: the marker, then n - 1 fillers read cyclically from the pool
    (_pool_bytes(pool_size)) at offset; out_bytes is out's memory as bytes."""
    if n <= 0:
        return
    out[pos] = marker
    pos, n = pos + 1, n - 1
    while n > 0:  # one copy unless the run is longer than the pool
        take = n if n <= pool_size else pool_size
        out_bytes[8 * pos : 8 * (pos + take)] = pool[8 * offset : 8 * (offset + take)]
        pos, n = pos + take, n - take


def _check_vocab_size(vocab_size: int | None) -> int:
    """The filler pool's size for vocab_size."""
    if vocab_size is not None and vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return _SIM_POOL_SIZE if vocab_size is None else vocab_size


def _used_hashes(req: TraceRequest) -> list[int]:
    """The block hashes of the blocks that hold at least one of the prompt's tokens."""
    if req.input_ids is not None or not req.block_hashes or req.input_len <= 0:
        return []
    return req.block_hashes[: -(-req.input_len // req.block_size)]


def materialize_input_ids(req: TraceRequest, index: int, vocab_size: int | None = None) -> array:
    """The prompt token ids of request `index` of a trace, made on demand.

    Returns an int64 array. Explicit input_ids are copied as they are. Otherwise the tokens of block i depend on
    block_hashes[i] and the block size alone, so equal hashes give equal tokens wherever
    they occur, and different hashes give different first tokens. Tokens past the hashed
    blocks are unique to the request. With vocab_size every id is in [0, vocab_size).
    """
    if req.input_ids is not None:
        return array("q", req.input_ids)
    pool_size = _check_vocab_size(vocab_size)
    markers, offsets = _block_markers_and_offsets(_used_hashes(req), vocab_size, pool_size)
    return _write_prompt(req, index, vocab_size, pool_size, markers, offsets)


def _write_prompt(req: TraceRequest, index: int, vocab_size: int | None, pool_size: int, markers: list[int], offsets: list[int]) -> array:
    """materialize_input_ids of a request without explicit ids, given its used blocks' markers
    and filler offsets."""
    total = max(req.input_len, 0)
    # int64: slices and compares are memcpy/memcmp in the scheduler. Made at its full size
    # and filled in place: appending block by block reallocates (and copies) it as it grows.
    out = array("q", [0]) * total
    pool = _pool_bytes(pool_size)
    with memoryview(out) as view, view.cast("B") as out_bytes:
        pos = 0
        bs = req.block_size
        if bs <= pool_size:
            # _write_run inlined (a Mooncake prompt has 24 blocks on average): each block is
            # its marker and one copy from the pool.
            for marker, offset in zip(markers, offsets):
                n = total - pos if total - pos < bs else bs
                out[pos] = marker
                out_bytes[8 * pos + 8 : 8 * (pos + n)] = pool[8 * offset : 8 * (offset + n - 1)]
                pos += n
        else:
            for marker, offset in zip(markers, offsets):
                n = min(bs, total - pos)
                _write_run(out, out_bytes, pos, n, marker, offset, pool, pool_size)
                pos += n
        if pos < total:
            mixed = _mix64((index ^ 0x5DEECE66D) & _MASK64)
            marker = _SIM_REQUEST_MARKER_BASE + index if vocab_size is None else mixed % vocab_size
            _write_run(out, out_bytes, pos, total - pos, marker, (mixed >> 20) % pool_size, pool, pool_size)
    return out


@dataclass(slots=True)
class _BlockWindow:
    """The block markers and filler offsets of requests [first, first + len(starts) - 1):
    request first + k's blocks are [starts[k], starts[k + 1]). exact False: huge hash ids
    among them (their prompts are made one request at a time)."""

    first: int
    starts: list[int]
    markers: np.ndarray
    offsets: np.ndarray
    exact: bool

    def holds(self, index: int) -> bool:
        return 0 <= index - self.first < len(self.starts) - 1


class TracePrompts:
    """The prompts of a trace's requests, made on demand: prompt(i) == materialize_input_ids(
    trace.requests[i], i, vocab_size). The block markers and filler offsets of the WINDOW
    requests around the one asked for (from a multiple of WINDOW) are computed in one numpy pass
    (numpy's fixed cost once a window, not once a request: on Mooncake's 288k blocks, 0.18 s ->
    0.03 s). A replay asks for each prompt once, about in arrival order (the waiting queue's
    head, from its 128th request back to its first), so the two latest windows are kept (16
    bytes a block): a sweep across a window's edge does not make them again."""

    WINDOW = 1024

    def __init__(self, requests: list[TraceRequest], vocab_size: int | None = None) -> None:
        self.requests = requests
        self.vocab_size = vocab_size
        self.pool_size = _check_vocab_size(vocab_size)
        self._windows: list[_BlockWindow] = []  # the latest first

    def prompt(self, index: int) -> array:
        req = self.requests[index]
        if req.input_ids is not None:
            return array("q", req.input_ids)
        w = self._window(index)
        if not w.exact:
            return materialize_input_ids(req, index, self.vocab_size)
        k = index - w.first
        a, b = w.starts[k], w.starts[k + 1]
        return _write_prompt(req, index, self.vocab_size, self.pool_size, w.markers[a:b].tolist(), w.offsets[a:b].tolist())

    def _window(self, index: int) -> _BlockWindow:
        windows = self._windows
        if windows and windows[0].holds(index):
            return windows[0]
        if len(windows) > 1 and windows[1].holds(index):
            windows.reverse()
            return windows[0]
        w = self._mark_window(index - index % self.WINDOW)
        self._windows = [w] + windows[:1]
        return w

    def _mark_window(self, first: int) -> _BlockWindow:
        used = [_used_hashes(req) for req in self.requests[first : first + self.WINDOW]]
        starts = [0]
        for hashes in used:
            starts.append(starts[-1] + len(hashes))
        empty = np.empty(0, dtype=np.int64)
        try:
            h = np.fromiter(chain.from_iterable(used), dtype=np.int64, count=starts[-1])
        except OverflowError:
            return _BlockWindow(first, starts, empty, empty, exact=False)
        if len(h) and not (h.min() >= -(1 << 61) and h.max() < 1 << 61):
            return _BlockWindow(first, starts, empty, empty, exact=False)
        markers, offsets = _block_markers_and_offsets_array(h, self.vocab_size, self.pool_size)
        return _BlockWindow(first, starts, markers, offsets, exact=True)
