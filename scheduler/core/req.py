"""Req: one request as the scheduler sees it (SGLang's vocabulary)."""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable

from scheduler.core.ids import as_ids, ids
from scheduler.core.sampling import SamplingParams


class FinishReason(enum.Enum):
    LENGTH = "length"  # produced max_new_tokens
    STOP = "stop"  # sampled an EOS token
    REJECTED = "rejected"  # could never run; see Req.reject_reason


@dataclass(eq=False, slots=True)
class Req:
    rid: str
    input_len: int
    # Prompt tokens are made on demand: a long trace never holds every prompt at once.
    input_ids_fn: Callable[[], list[int]]
    sampling_params: SamplingParams
    arrival_time: float
    priority: int = 0
    eos_token_ids: tuple[int, ...] = ()
    index: int = 0  # position in the trace, the tie breaker of every ordering

    output_ids: list[int] = field(default_factory=list)
    # The latest sampled token may still be on the device (overlap): a negative placeholder.
    pending_token: int | None = None
    finished_reason: FinishReason | None = None
    reject_reason: str | None = None
    # Set when admission cut max_new_tokens to what the context and the KV pool allow (as SGLang
    # does): the requested length and why.
    truncated_from: int | None = None
    truncate_reason: str | None = None

    # Set by the scheduler while the request holds memory.
    req_pool_idx: int | None = None
    prefix_indices: array = field(default_factory=ids)  # KV slots of the reused prefix
    last_node: Any = None  # radix node that locks prefix_indices
    fill_ids: array = field(default_factory=ids)  # the tokens this round extends to
    # len(prompt + outputs) when the request was last matched for a round (SGLang's
    # full_untruncated_fill_ids, which preemption reads before the round's own match).
    full_fill_len: int = 0
    queue_entry: int = 0  # when it last entered the waiting queue (a counter): priority ties go by it
    extend_input_len: int = 0
    seq_len: int = 0  # tokens whose KV is allocated (what the next forward attends to)
    is_chunked: int = 0  # > 0 while a chunk of its prefill is in flight
    is_retracted: bool = False
    num_retractions: int = 0
    instance: int = 0  # the instance of a cluster that served it (its router's choice)

    # Metrics.
    # When the scheduler took it in: the loop's next schedule after its arrival, where vLLM's
    # engine core stamps queued_ts (it reads new requests only between its steps).
    queued_time: float | None = None
    scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: array = field(default_factory=lambda: array("d"))
    cached_tokens: int = 0  # prompt tokens served from the radix cache, over all admissions
    prefill_tokens: int = 0  # prompt tokens admitted (cached + computed), over all admissions

    _input_ids: array | None = None
    max_new_tokens: int = 0  # copied from sampling_params: read on every step

    def __post_init__(self) -> None:
        self.max_new_tokens = self.sampling_params.max_new_tokens

    @property
    def origin_input_ids(self) -> array:
        if self._input_ids is None:
            prompt = as_ids(self.input_ids_fn())
            assert len(prompt) == self.input_len, f"{self.rid}: {len(prompt)} prompt ids, expected {self.input_len}"
            self._input_ids = prompt
        return self._input_ids

    def release_tokens(self) -> None:
        """A finished request keeps its outputs and metrics, not its prompt and KV lists
        (a replay of a long trace would otherwise hold every prompt)."""
        self._input_ids = None
        self.fill_ids = ids()
        self.prefix_indices = ids()
        self.last_node = None

    def finished(self) -> bool:
        return self.finished_reason is not None

    def init_next_round_input(self, tree_cache: Any | None = None) -> None:
        """Set fill_ids, and (with a cache) the longest cached prefix, for the next prefill."""
        self.fill_ids = self.origin_input_ids + ids(self.output_ids) if self.output_ids else self.origin_input_ids
        self.full_fill_len = len(self.fill_ids)
        if tree_cache is not None:
            # At least one token must be computed to get logits of the next token.
            self.prefix_indices, self.last_node = tree_cache.match_prefix(self.fill_ids, len(self.fill_ids) - 1)
        self.extend_input_len = len(self.fill_ids) - len(self.prefix_indices)

    def match_full_prefix(self, tree_cache: Any) -> None:
        """Match prompt + outputs, all of it, against the cache (the queue policies' match:
        SGLang's match_kv_cache without a length cap)."""
        key = self.origin_input_ids + ids(self.output_ids) if self.output_ids else self.origin_input_ids
        self.prefix_indices, self.last_node = tree_cache.match_prefix(key)

    def next_output_finishes_by_length(self) -> bool:
        return len(self.output_ids) + 1 >= self.max_new_tokens

    def take_token(self, token_id: int, now: float) -> None:
        """A processed forward's sampled token: an output token at `now`, and maybe the last."""
        out = self.output_ids
        out.append(token_id)
        self.token_times.append(now)
        if self.first_token_time is None:
            self.first_token_time = now
        if len(out) >= self.max_new_tokens or not self.sampling_params.ignore_eos:
            self.check_finished()

    def check_finished(self) -> None:
        if len(self.output_ids) >= self.max_new_tokens:
            self.finished_reason = FinishReason.LENGTH
        elif not self.sampling_params.ignore_eos and self.output_ids and self.output_ids[-1] in self.eos_token_ids:
            self.finished_reason = FinishReason.STOP

    def reset_for_retract(self) -> None:
        self.prefix_indices = ids()
        self.last_node = None
        self.fill_ids = ids()
        self.extend_input_len = 0
        self.seq_len = 0
        self.req_pool_idx = None
        self.pending_token = None
        self.is_retracted = True
        self.num_retractions += 1
