"""Sliding-window attention in a kernel profile: a share of the layers attend only their last tokens.

gpt-oss alternates sliding-window layers (layer_types "sliding_attention": each query attends the last
`sliding_window` tokens, 128) with full-attention ones, half each. The database measures attention
with such a window (its rows' window_size: 128, 1024 and 8192 beside 0 on every vLLM and SGLang system
with an attention table of its own; the A100's have none), so one (average) layer's attention is

    share x attention(window) + (1 - share) x attention(full context)

with `share` the sliding layers over all layers: the split AIConfigurator's own GptOssForCausalLM
model prices (sdk/models/moe.py: a ContextAttention / GenerationAttention with window_size=128 over
half the layers, one without over the other half). Past the window the windowed rows stay flat, as the
kernel reads only the window's keys; the engine answers contexts past its rows from their own trend,
as for any other shape (no clamp of ours).

gpt-oss's attention sinks are not priced: a sink is a learned logit per head (not a key: no dot
product, no value) that joins each softmax, one more term beside at least the window's 128 scores
of head_dim-long dot products, so at most 1/128 of the softmax and far less of the kernel. Whether
the database's rows ran with sinks its tables do not say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from scheduler.model_config import ModelConfig

if TYPE_CHECKING:
    from simulator.profiles.kernel_db import KernelDatabase


@dataclass(frozen=True)
class SlidingWindow:
    """`share` of a model's layers attend the last `window` tokens; the others every token."""

    window: int
    share: float

    @classmethod
    def of(cls, model: ModelConfig) -> "SlidingWindow | None":
        """The model's sliding-window layers (ModelConfig.sliding_window_layers), None without any."""
        if not model.sliding_window_layers or not model.sliding_window:
            return None
        return cls(model.sliding_window, model.sliding_window_layers / model.num_hidden_layers)

    def layer_mean(self, attention: Callable[[int], float]) -> float:
        """One average layer's attention time, from `attention(window)` (0: the full context)."""
        return self.share * attention(self.window) + (1.0 - self.share) * attention(0)

    def record(self, db: KernelDatabase, prefill_kv: str, decode_kv: str, attention_sinks: bool) -> dict:
        """What the profile says of it (precision.sliding_window): the window, the share, and the kernels of
        the windowed rows that priced the sliding layers (in the KV dtype that priced each attention)."""
        record = {
            "window": self.window,
            "sliding_layers_share": round(self.share, 6),
            "priced_as": f"the database's attention rows of window_size {self.window} for the sliding layers, "
            "of window_size 0 for the others",
            "prefill_kernel": db.tables.attention_kernel(True, prefill_kv, self.window)[0],
            "decode_kernel": db.tables.attention_kernel(False, decode_kv, self.window)[0],
        }
        if attention_sinks:
            record["attention_sinks"] = "not priced: one more logit per query and head in each softmax (no key, no dot product)"
        return record
