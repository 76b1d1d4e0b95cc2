"""Block hashes: the key under which a full KV block sits in vLLM's prefix cache.

vLLM chains them: a block's hash covers its tokens and its parent block's hash, so two blocks
have the same hash when their whole prefixes are equal. Here a block's hash is the 64-bit sum,
over every token of its prefix up to its end, of a mixing function of (token, position)
(splitmix64's finalizer): equal prefixes give equal sums, and two different prefixes would have
to collide on 64 bits to share a block. vLLM hashes with sha256 by default; what matters here
is the same rule for which blocks match, and a sum lets numpy hash a prompt's blocks at once
(a running sum) instead of one block at a time.
"""

from __future__ import annotations

import numpy as np

_K_TOKEN = np.uint64(0x9E3779B97F4A7C15)
_K_POS = np.uint64(0xD6E8FEB86659FD93)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer of each (token, position)."""
    x = (tokens.astype(np.uint64) + np.uint64(1)) * _K_TOKEN
    x ^= positions.astype(np.uint64) * _K_POS
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


def block_hashes(tokens: np.ndarray, first_block: int, parent: int, page_size: int) -> np.ndarray:
    """The hashes of blocks first_block .. first_block + len(tokens) // page_size - 1 of one
    prefix: tokens are those blocks' (a whole number of blocks), parent the hash of the block
    before them (0 for a first block)."""
    return hashes_of_runs([tokens], [first_block], [parent], page_size)[0]


def hashes_of_runs(token_runs: list[np.ndarray], first_blocks: list[int], parents: list[int], page_size: int) -> list[np.ndarray]:
    """block_hashes of several prefixes at once (one vector pass, not one per prefix):
    run k holds whole blocks from block first_blocks[k] on, whose prefix before sums to
    parents[k] (0 for a first block)."""
    counts = np.fromiter((len(t) // page_size for t in token_runs), dtype=np.int64, count=len(token_runs))
    tokens = np.concatenate(token_runs)
    # Each token's position: its run's first position plus its place in the run.
    lens = counts * page_size
    run_start = np.repeat(np.cumsum(lens) - lens, lens)
    firsts = np.asarray(first_blocks, dtype=np.int64) * page_size
    positions = np.arange(len(tokens), dtype=np.int64) - run_start + np.repeat(firsts, lens)
    with np.errstate(over="ignore"):
        sums = _mix(tokens, positions).reshape(-1, page_size).sum(axis=1, dtype=np.uint64)
        total = np.cumsum(sums, dtype=np.uint64)
        # A run's hashes: its parent plus the running sum since its first block.
        ends = np.cumsum(counts)
        before = np.concatenate((np.zeros(1, dtype=np.uint64), total[ends[:-1] - 1])) if len(ends) > 1 else np.zeros(1, dtype=np.uint64)
        base = np.asarray(parents, dtype=np.uint64) - before
        hashes = total + np.repeat(base, counts)
    return np.split(hashes, ends[:-1])
