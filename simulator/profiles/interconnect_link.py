"""The link between a machine's GPUs, where the machine's own description gives it: TP all-reduces priced over it.

AIConfigurator's database measures each system's all-reduce on the machine its collector ran on.
Another machine of the same GPU may join its GPUs otherwise: two RTX PRO 6000s in a PCIe server
all-reduce through the host where peer-to-peer access is off, far slower than the database's rows
of that system. A kernel profile built with an InterconnectLink prices every all-reduce of a TP
group as NCCL's ring over that link (the alpha-beta model): 2 (n - 1) steps, each one hop's latency
and 1/n of the message over the link's bandwidth (a reduce-scatter, then an all-gather). With
attention data parallelism, a mixture of experts' exchange is vLLM's default all2all backend,
`allgather_reducescatter` (its expert-parallel deployment guide): the ranks' tokens all-gathered
before the experts and reduce-scattered after them, each a ring over the link too.

Where the figures come from is the link's `source`. LLMServingSim's cluster configs (its
`bench/examples/<GPU>/<model>/config.json`, beside the real run in `vllm/`) state the link of the
machine each real run was measured on: `link_bw` in GB/s and `link_latency` in ns
(`llmservingsim_link`). On the RTX PRO 6000 runs they say 16 GB/s and 20 us, LLMServingSim's
setting for a PCIe node (its H100 config says 900 GB/s, NVLink's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scheduler.model_config import bundled_model_of

BYTES_PER_ELEMENT = 2  # the all-reduces of a forward carry bf16 activations (the database's rows are of bf16 too)


@dataclass(frozen=True)
class InterconnectLink:
    bandwidth: float  # bytes a second, one direction, between two GPUs
    latency_s: float  # one hop
    source: str  # where the figures come from (said in the profile)

    def __post_init__(self) -> None:
        if not self.bandwidth > 0 or not self.latency_s >= 0:
            raise ValueError(
                f"a link needs a bandwidth above 0 and a latency of 0 or more (got {self.bandwidth:g} B/s, {self.latency_s:g} s)"
            )

    def all_reduce(self, elements: int, gpus: int) -> float:
        """Seconds of a ring all-reduce of `elements` bf16 values over `gpus` GPUs (0 for one)."""
        if gpus <= 1:
            return 0.0
        return 2 * (gpus - 1) * (self.latency_s + elements * BYTES_PER_ELEMENT / gpus / self.bandwidth)

    def all_gather(self, elements_per_gpu: int, gpus: int) -> float:
        """Seconds of a ring all-gather of `elements_per_gpu` bf16 values from each of `gpus` GPUs:
        gpus - 1 steps of one hop and one GPU's share. A reduce-scatter of the gathered values back
        takes as long (the same steps, the same shares)."""
        if gpus <= 1:
            return 0.0
        return (gpus - 1) * (self.latency_s + elements_per_gpu * BYTES_PER_ELEMENT / self.bandwidth)

    def describe(self) -> str:
        return f"ring over {self.bandwidth / 1e9:g} GB/s, {self.latency_s * 1e6:g} us a hop ({self.source})"


def llmservingsim_link(config: Path, model: str, tp: int) -> InterconnectLink | None:
    """The link of an LLMServingSim cluster config (config.json: `link_bw` GB/s, `link_latency` ns) with an
    instance of `model` (a bundled config's name) at TP `tp`; None if the file is no such config."""
    try:
        cluster = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cluster, dict) or "link_bw" not in cluster:
        return None
    instances = [i for node in cluster.get("nodes") or [] for i in (node.get("instances") or []) if isinstance(i, dict)]
    if not any(bundled_model_of(str(i.get("model_name", ""))) == model and i.get("tp_size", 1) == tp for i in instances):
        return None
    bw, latency = cluster["link_bw"], cluster.get("link_latency", 0)
    # Per-level links (a list: within a node, then between nodes): the first, a node's own.
    bw = bw[0] if isinstance(bw, list) and bw else bw
    latency = latency[0] if isinstance(latency, list) and latency else latency
    try:
        return InterconnectLink(float(bw) * 1e9, float(latency) / 1e9, str(config))
    except (TypeError, ValueError):
        return None
