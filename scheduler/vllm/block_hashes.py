"""Block hashes: the key under which a full KV block sits in vLLM's prefix cache.

vLLM chains them: a block's hash covers its tokens and its parent block's hash, so two blocks
have the same hash when their whole prefixes are equal. Here a block's hash is the 64-bit sum,
over every token of its prefix up to its end, of key(token) * key(position): each key a random
64-bit number (splitmix64's finalizer of the token id, or of the position; position keys odd).
Equal prefixes give equal sums; two different prefixes share a hash only if a sum of random
64-bit products cancels. vLLM hashes with sha256 by default; what matters here is the same rule
for which blocks match. A sum lets numpy hash a prompt's blocks at once (a running sum), and
keys kept in tables make each token cost a gather and a multiply (the Mooncake trace hashes
145M prompt tokens: 0.3 s), not a mixing function's dozen passes.
"""

from __future__ import annotations

import numpy as np

_K_TOKEN = np.uint64(0x9E3779B97F4A7C15)
_K_POS = np.uint64(0xD6E8FEB86659FD93)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
# Token ids below this get their keys from a table (2 MiB: vocabularies are up to ~256k ids);
# others (a simulated trace's request and block markers, tests' 40-bit ids) are mixed apart:
# in Python up to FEW_BIG of them (a prompt's one request marker: ~1 us against numpy's ~8).
TOKEN_TABLE = 1 << 18
FEW_BIG = 4
_MASK64 = (1 << 64) - 1


def _mix(x: np.ndarray, salt: np.uint64) -> np.ndarray:
    """splitmix64's finalizer of x + 1 (as uint64) times salt: a random-looking 64-bit key each."""
    with np.errstate(over="ignore"):
        x = (x.astype(np.uint64) + np.uint64(1)) * salt
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
    return x


def _mix_one(x: int, salt: int) -> int:
    """_mix of one value, in Python ints (x as uint64)."""
    x = ((x + 1) * salt) & _MASK64
    x ^= x >> 30
    x = (x * int(_M1)) & _MASK64
    x ^= x >> 27
    x = (x * int(_M2)) & _MASK64
    return x ^ (x >> 31)


class _Keys:
    """The token key table, and the position key table (grown to a power of two as needed)."""

    tokens = _mix(np.arange(TOKEN_TABLE, dtype=np.uint64), _K_TOKEN)
    positions = np.empty(0, dtype=np.uint64)

    @classmethod
    def of_tokens(cls, tokens: np.ndarray) -> np.ndarray:
        if not len(tokens):
            return np.empty(0, dtype=np.uint64)
        tokens = tokens.astype(np.int64, copy=False)
        unsigned = tokens.view(np.uint64)  # (a negative id reads as a huge one)
        if int(unsigned.max()) < TOKEN_TABLE:
            return cls.tokens.take(tokens)
        keys = cls.tokens.take(tokens, mode="clip")
        big = (unsigned >= TOKEN_TABLE).nonzero()[0]
        if len(big) <= FEW_BIG:
            for i, t in zip(big.tolist(), unsigned.take(big).tolist()):
                keys[i] = _mix_one(t, int(_K_TOKEN))
        else:
            keys[big] = _mix(tokens.take(big), _K_TOKEN)
        return keys

    @classmethod
    def of_positions(cls, end: int) -> np.ndarray:
        """Keys of positions 0 .. end - 1 at least."""
        if end > len(cls.positions):
            cls.positions = _mix(np.arange(1 << max(end - 1, 1).bit_length(), dtype=np.uint64), _K_POS) | np.uint64(1)
        return cls.positions


def block_hashes(tokens: np.ndarray, first_block: int, parent: int, page_size: int) -> np.ndarray:
    """The hashes of blocks first_block .. first_block + len(tokens) // page_size - 1 of one
    prefix: tokens are those blocks' (a whole number of blocks), parent the hash of the block
    before them (0 for a first block)."""
    start = first_block * page_size
    x = _Keys.of_tokens(tokens)
    # (uint64 arrays wrap around silently: no np.errstate needed, which costs ~1 us a call)
    x *= _Keys.of_positions(start + len(x))[start : start + len(x)]
    np.cumsum(x, out=x)
    return x[page_size - 1 :: page_size] + np.uint64(parent)


def hashes_of_runs(token_runs: list[np.ndarray], first_blocks: list[int], parents: list[int], page_size: int) -> list[np.ndarray]:
    """block_hashes of several prefixes: run k holds whole blocks from block first_blocks[k] on,
    whose prefix before sums to parents[k] (0 for a first block)."""
    counts = [len(t) // page_size for t in token_runs]
    hashes = hashes_of_joined_runs(np.concatenate(token_runs), counts, first_blocks, parents, page_size)
    ends = np.cumsum(counts).tolist()
    return [hashes[e - c : e] for e, c in zip(ends, counts)]


def hashes_of_joined_runs(tokens: np.ndarray, counts: list[int], first_blocks: list[int], parents: list[int], page_size: int) -> np.ndarray:
    """hashes_of_runs of runs given joined (one vector pass, not one per run): tokens holds run
    k's counts[k] blocks after run k - 1's; the hashes come joined the same way."""
    if len(counts) == 1:
        return block_hashes(tokens, first_blocks[0], parents[0], page_size)
    x = _Keys.of_tokens(tokens)
    counts_np = np.array(counts, dtype=np.int64)
    lens = counts_np * page_size
    # Each token's position: its run's first position plus its place in the run.
    offsets = np.array(first_blocks, dtype=np.int64) * page_size - (np.cumsum(lens) - lens)
    positions = np.arange(len(x), dtype=np.int64) + np.repeat(offsets, lens)
    with np.errstate(over="ignore"):
        x *= _Keys.of_positions(int(positions.max()) + 1 if len(x) else 0).take(positions)
        np.cumsum(x, out=x)
        ends = x[page_size - 1 :: page_size]
        # A run's hashes: its parent plus the running sum since the run began.
        before = np.concatenate((np.zeros(1, dtype=np.uint64), ends)).take(np.cumsum(counts_np) - counts_np)
        ends += np.repeat(np.array(parents, dtype=np.uint64) - before, counts_np)
    return ends
