"""What vLLM's KV cache manager keeps for one request (kv_blocks.py), and the request's known
tokens that its block hashes cover."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from scheduler.core.ids import ids
from scheduler.core.req import Req

NO_HASHES = np.empty(0, dtype=np.uint64)


@dataclass(eq=False, slots=True)
class RequestBlocks:
    """One request's blocks (vLLM: req_to_blocks, num_cached_block, and the request's
    block_hashes, which outlive a preemption)."""

    blocks: array = field(default_factory=ids)
    num_cached: int = 0  # its first blocks that are in the cache
    num_hashed: int = 0  # of those, the first whose hashes the pool's map has (unhashed_blocks.py)
    hashes: np.ndarray = field(default_factory=lambda: NO_HASHES)  # of its full blocks of known tokens, so far


def known_tokens_between(req: Req, start: int, end: int) -> array:
    """Known tokens start .. end - 1 (of the prompt, then the outputs)."""
    prompt = req.origin_input_ids
    n = len(prompt)
    if end <= n:
        return prompt[start:end]
    outs = ids(req.output_ids[max(start - n, 0) : end - n])
    return prompt[start:] + outs if start < n else outs
