"""The parts of SGLang's Scheduler that the oracle stands in for: metrics, the model config's
unused fields, grammar, beam search, diffusion-LLM staging, the model worker's batch preparation.
Each does nothing, or hands its argument back, where SGLang's scheduling methods call it.
(conformance/stubs.py is the other kind: a package stubbed before SGLang is imported.)"""

from __future__ import annotations

from types import SimpleNamespace


class Null:
    """A component the scheduling path calls but whose work is outside the oracle (metrics, IPC)."""

    def __getattr__(self, name):
        return null_call

    def __bool__(self) -> bool:
        return False


def null_call(*args, **kwargs):
    return None


class Passthrough(Null):
    """dp_attn_adapter / ngram_embedding_manager: hand the batch back unchanged."""

    def maybe_prepare_mlp_sync_batch(self, batch, need_sync=None):
        return batch

    def maybe_convert_decode_to_extend(self, batch):
        return batch

    def prepare_for_forward(self, batch, chunked_req=None):
        return batch


def metrics_stub() -> Null:
    stub = Null()
    stub.num_generated_tokens = 0
    stub.forward_ct_decode = 0
    stub.num_retracted_reqs = 0
    stub.enable_metrics = False
    return stub


class ModelConfig(SimpleNamespace):
    """The model facts scheduling reads; any other (reasoning tokens, multimodal) is None."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class NoGrammar(Null):
    grammar_queue: list = []

    def has_waiting_grammars(self) -> bool:
        return False

    def process_req_with_grammar(self, req) -> bool:
        return False


class NoBeams(Null):
    def pending_member_rows(self, batch) -> int:
        return 0

    def commit_decode(self, batch):
        return set()


class NoDllm(Null):
    def any_staging_reqs(self) -> bool:
        return False
