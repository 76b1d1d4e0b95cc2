"""testbed serve: the real engine behind an OpenAI-compatible streaming server (aiohttp).

The scheduler loop runs as in `replay --mode real` (same scheduler, options and engine), in a
process of its own (engine_process.py), with the server's requests as its arrivals. After every
step the engine sends each open request's new tokens; the HTTP side (an asyncio loop in this
process) writes them out to their streams as server-sent events.

Endpoints: /v1/completions and /v1/chat/completions (prompts as token ids; text where the model
folder has a tokenizer; a chat message without one is read as space-separated token ids),
/v1/models, /health, /version, and /metrics with SGLang's gauge names. A bad body gets a 400 with
an OpenAI-style error object, never a 500. A client that goes away has its request cut: it ends
at its next token, and its KV is freed then. Ctrl-C stops taking requests (503) and lets the
ones in flight finish.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from scheduler.core.sampling import SamplingParams
from testbed.errors import ConfigError
from testbed.live.engine_process import EngineClient

SERVER_VERSION = "testbed-serve"


class BadRequest(ValueError):
    """A request the server refuses (400), with the reason said to the client."""


@dataclass
class _Stream:
    """One request's way back to its client: the engine's messages for it, in order."""

    rid: str
    queue: asyncio.Queue


class Engine:
    """The engine (in its own process: engine_process.py) as the HTTP side sees it: requests in,
    each open request's tokens out to its stream, the gauges for /metrics."""

    def __init__(self, opts, served_name: str | None, aio_loop: asyncio.AbstractEventLoop) -> None:
        self.loop = aio_loop
        self.streams: dict[str, _Stream] = {}
        self.client = EngineClient(opts, served_name, self._on_step, self._on_error)
        info = self.client.info
        self.served_name, self.context_len, self.kv_tokens, self.vocab_size = (
            info.served_name,
            info.context_len,
            info.kv_tokens,
            info.vocab_size,
        )
        self.model_folder = info.model_folder

    @property
    def error(self) -> str | None:
        return self.client.error

    # -- the engine's messages (on the client's reader thread) -------------------------------
    def _on_step(self, updates: list) -> None:
        items = []
        for rid, tokens, finish in updates:
            st = self.streams.get(rid)
            if st is None:
                continue
            if tokens:
                items.append((st, ("tokens", tokens)))
            if finish is not None:
                items.append((st, ("end", finish)))
        if items:
            self.loop.call_soon_threadsafe(_deliver, items)  # one wake-up of the HTTP loop a step

    def _on_error(self, message: str) -> None:
        items = [(st, ("error", message)) for st in list(self.streams.values())]
        if items:
            self.loop.call_soon_threadsafe(_deliver, items)

    # -- HTTP side ---------------------------------------------------------------------------
    def submit(self, prompt: list[int], params: SamplingParams) -> _Stream:
        st = _Stream(uuid.uuid4().hex, asyncio.Queue())
        self.streams[st.rid] = st
        self.client.add(st.rid, prompt, params)
        return st

    def forget(self, st: _Stream) -> None:
        self.streams.pop(st.rid, None)

    def cut(self, st: _Stream) -> None:
        """The client went away: its request ends at its next token (its KV is freed then)."""
        if not self.client.exited.is_set():
            self.client.cut(st.rid)

    def metrics_text(self) -> str:
        g = self.client.gauges
        usage = g.kv_used / self.kv_tokens if self.kv_tokens else 0.0
        labels = f'{{model_name="{self.served_name}"}}'
        return (
            "# TYPE sglang:num_running_reqs gauge\n"
            f"sglang:num_running_reqs{labels} {g.running}\n"
            "# TYPE sglang:num_queue_reqs gauge\n"
            f"sglang:num_queue_reqs{labels} {g.waiting}\n"
            "# TYPE sglang:token_usage gauge\n"
            f"sglang:token_usage{labels} {usage:.6f}\n"
            "# TYPE sglang:max_total_num_tokens gauge\n"
            f"sglang:max_total_num_tokens{labels} {self.kv_tokens}\n"
        )


def _deliver(items: list[tuple[_Stream, tuple]]) -> None:
    """(On the HTTP side's loop) each item to its stream's queue."""
    for st, item in items:
        st.queue.put_nowait(item)


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": status}}, status=status)


def _int(body: dict, key: str, default: int, minimum: int = 0) -> int:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise BadRequest(f"{key} must be an integer >= {minimum}, got {json.dumps(v)[:40]}")
    return v


def _number(body: dict, key: str, default: float) -> float:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadRequest(f"{key} must be a number, got {json.dumps(v)[:40]}")
    return float(v)


class Server:
    def __init__(self, engine: Engine, tokenizer=None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.draining = False

    # -- prompts ---------------------------------------------------------------------------
    def _ids(self, prompt: Any) -> list[int]:
        vocab = self.engine.vocab_size
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise BadRequest(f"{self.engine.served_name} has no tokenizer here: send the prompt as a list of token ids")
            prompt = self.tokenizer.encode(prompt)
        if not isinstance(prompt, list) or not prompt:
            raise BadRequest("prompt must be a non-empty list of token ids (or text, where the model has a tokenizer)")
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in prompt):
            raise BadRequest(f"prompt token ids must be integers from 0 to {vocab - 1} (the model's vocabulary)")
        return prompt

    def _chat_ids(self, messages: Any) -> list[int]:
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("messages must be a non-empty list of {role, content} objects")
        if self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):  # (transformers 5 gives the encoding, 4 the ids)
                ids = ids["input_ids"]
            return self._ids(list(ids))
        content = messages[-1].get("content")
        try:
            ids = [int(w) for w in str(content).split()]
        except ValueError:
            raise BadRequest(
                f"{self.engine.served_name} has no chat template here: give the last message's content as space-separated token ids"
            ) from None
        return self._ids(ids)

    def _params(self, body: dict, prompt_len: int) -> SamplingParams:
        max_tokens = _int(body, "max_tokens", 16, minimum=1)
        if body.get("max_completion_tokens") is not None:
            max_tokens = _int(body, "max_completion_tokens", 16, minimum=1)
        limit = self.engine.context_len
        if prompt_len + max_tokens > limit:
            raise BadRequest(
                f"this model's context length is {limit} tokens: the prompt ({prompt_len}) and max_tokens ({max_tokens}) exceed it"
            )
        min_tokens = _int(body, "min_tokens", 0)
        ignore_eos = bool(body.get("ignore_eos", False)) or min_tokens >= max_tokens
        return SamplingParams(
            max_new_tokens=max_tokens,
            temperature=_number(body, "temperature", 1.0),
            top_k=_int(body, "top_k", -1, minimum=-1),
            top_p=_number(body, "top_p", 1.0),
            seed=body.get("seed") if isinstance(body.get("seed"), int) else None,
            ignore_eos=ignore_eos,
        )

    def _text(self, tokens: list[int]) -> str:
        if self.tokenizer is not None:
            return self.tokenizer.decode(tokens)
        return "".join(f" {t}" for t in tokens)

    # -- handlers ----------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        e = self.engine
        return web.json_response(
            {"object": "list", "data": [{"id": e.served_name, "object": "model", "owned_by": "testbed", "max_model_len": e.context_len}]}
        )

    async def health(self, request: web.Request) -> web.Response:
        if self.engine.error:
            return _error(503, f"the engine stopped: {self.engine.error}", "ServiceUnavailable")
        return web.Response(text="ok")

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": SERVER_VERSION})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.engine.metrics_text(), content_type="text/plain")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        if self.engine.error:
            return _error(503, f"the engine stopped: {self.engine.error}", "ServiceUnavailable")
        if self.draining:
            return _error(503, "the server is shutting down", "ServiceUnavailable")
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(400, "the request body is not JSON")
        try:
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            model = body.get("model")
            if model is not None and model != self.engine.served_name:
                raise BadRequest(f"model {json.dumps(model)[:60]} is not served here: {self.engine.served_name} is")
            prompt = self._chat_ids(body.get("messages")) if chat else self._ids(body.get("prompt"))
            params = self._params(body, len(prompt))
        except BadRequest as e:
            return _error(400, str(e))
        st = self.engine.submit(prompt, params)
        try:
            if body.get("stream"):
                return await self._stream(request, st, body, chat, len(prompt))
            return await self._whole(st, chat, len(prompt))
        finally:
            self.engine.forget(st)

    def _choice(self, tokens: list[int], chat: bool, finish: str | None, stream: bool) -> dict:
        text = self._text(tokens)
        if chat:
            key = "delta" if stream else "message"
            return {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": finish}
        return {"index": 0, "text": text, "token_ids": tokens, "finish_reason": finish}

    async def _whole(self, st: _Stream, chat: bool, prompt_len: int) -> web.Response:
        tokens: list[int] = []
        finish = None
        while finish is None:
            kind, value = await st.queue.get()
            if kind == "tokens":
                tokens += value
            elif kind == "end":
                finish = value
            else:
                return _error(503, f"the engine stopped: {value}", "ServiceUnavailable")
        return web.json_response(
            {
                "id": st.rid,
                "object": "chat.completion" if chat else "text_completion",
                "model": self.engine.served_name,
                "choices": [self._choice(tokens, chat, finish, stream=False)],
                "usage": {"prompt_tokens": prompt_len, "completion_tokens": len(tokens), "total_tokens": prompt_len + len(tokens)},
            }
        )

    async def _stream(self, request: web.Request, st: _Stream, body: dict, chat: bool, prompt_len: int) -> web.StreamResponse:
        options = body.get("stream_options") or {}
        usage_each = bool(options.get("continuous_usage_stats"))
        usage_last = bool(options.get("include_usage")) or usage_each
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        count = 0

        async def send(payload: dict) -> None:
            await resp.write(b"data: " + json.dumps(payload).encode() + b"\n\n")

        try:
            while True:
                kind, value = await st.queue.get()
                if kind == "error":
                    await send({"error": {"message": f"the engine stopped: {value}", "type": "ServiceUnavailable"}})
                    break
                finish = value if kind == "end" else None
                tokens = value if kind == "tokens" else []
                count += len(tokens)
                if tokens or finish:
                    chunk = {
                        "id": st.rid,
                        "object": obj,
                        "model": self.engine.served_name,
                        "choices": [self._choice(tokens, chat, finish, True)],
                    }
                    if usage_each:
                        chunk["usage"] = {"prompt_tokens": prompt_len, "completion_tokens": count, "total_tokens": prompt_len + count}
                    await send(chunk)
                if finish:
                    if usage_last:
                        usage = {"prompt_tokens": prompt_len, "completion_tokens": count, "total_tokens": prompt_len + count}
                        await send({"id": st.rid, "object": obj, "model": self.engine.served_name, "choices": [], "usage": usage})
                    await resp.write(b"data: [DONE]\n\n")
                    break
        except ConnectionError:  # the client went away (a write to its closed connection)
            self.engine.cut(st)
        except asyncio.CancelledError:  # (the server stopping the handler)
            self.engine.cut(st)
            raise
        return resp

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app


def _tokenizer(folder: str | None):
    if not folder:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)
    except Exception:  # no tokenizer files in the folder: token ids only
        return None


def serve(opts, host: str, port: int, served_name: str | None = None) -> None:
    asyncio.run(_serve(opts, host, port, served_name))


async def _serve(opts, host: str, port: int, served_name: str | None) -> None:
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    engine = Engine(opts, served_name, loop)
    server = Server(engine, _tokenizer(engine.model_folder))
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        await loop.run_in_executor(None, engine.client.close)
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})") from None
    print(
        f"testbed serve: {engine.served_name} on http://{host}:{port} (context {engine.context_len}, "
        f"KV pool {engine.kv_tokens:,} tokens, {'text and token ids' if server.tokenizer else 'token ids only'}; "
        f"ready in {time.perf_counter() - started:.1f} s; Ctrl-C drains and stops)",
        flush=True,
    )
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    # Ctrl-C: no new requests (503); the engine finishes the ones it has, their streams end, then it stops.
    print("testbed serve: draining", flush=True)
    server.draining = True
    await loop.run_in_executor(None, engine.client.close)
    await runner.cleanup()  # (it waits for the handlers still writing their streams' last tokens)
