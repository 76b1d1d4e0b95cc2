"""A minimal OpenAI-compatible server that streams every token at once: the other end for checking
the client (`--mode server`) without an engine, and for measuring how late the client sends.

    python -m testbed.live.instant_server [--port 8001] [--fail-every N] [--stall-every N] [--reset-every N]

It answers /v1/models, /version, /metrics (vLLM's gauge names: the requests in flight),
/v1/completions and /v1/chat/completions (streamed: `max_tokens` chunks of one token each, with
continuous usage, then a usage chunk and [DONE]). Faults, for tests: every N-th request answers
503 (--fail-every), never ends its stream (--stall-every), or has its connection cut mid-stream
(--reset-every).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from dataclasses import dataclass, field

from aiohttp import web

MODEL = "instant"


@dataclass
class Faults:
    fail_every: int = 0
    stall_every: int = 0
    reset_every: int = 0


@dataclass
class _State:
    faults: Faults
    served: int = 0
    in_flight: int = 0
    bodies: list = field(default_factory=list)  # every request body received (tests read them)


STATE = web.AppKey("state", _State)  # (tests read what the server received: app[STATE].bodies)


def make_app(faults: Faults | None = None) -> web.Application:
    state = _State(faults or Faults())
    app = web.Application()
    app[STATE] = state

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 1 << 20}]})

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": "instant"})

    async def metrics(request: web.Request) -> web.Response:
        text = (
            f'vllm:num_requests_running{{model_name="{MODEL}"}} {state.in_flight}\n'
            f'vllm:num_requests_waiting{{model_name="{MODEL}"}} 0\n'
            f'vllm:kv_cache_usage_perc{{model_name="{MODEL}"}} 0.0\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def complete(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": {"message": "the body is not JSON", "type": "BadRequestError"}}, status=400)
        state.bodies.append(body)
        state.served += 1
        n, f = state.served, state.faults
        if f.fail_every and n % f.fail_every == 0:
            return web.json_response({"error": {"message": "overloaded", "type": "ServiceUnavailable"}}, status=503)
        chat = request.path.endswith("/chat/completions")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        state.in_flight += 1
        try:
            tokens = int(body.get("max_tokens") or 16)
            for k in range(1, tokens + 1):
                if f.stall_every and n % f.stall_every == 0 and k == 2:
                    await asyncio.sleep(3600)
                if f.reset_every and n % f.reset_every == 0 and k == 2:
                    request.transport.close()
                    return resp
                choice = {"index": 0, "delta": {"content": "x"}} if chat else {"index": 0, "text": "x"}
                chunk = {"choices": [choice], "usage": {"completion_tokens": k}}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            prompt = body.get("prompt") or []
            usage = {"prompt_tokens": len(prompt), "completion_tokens": tokens}
            await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
        finally:
            state.in_flight -= 1
        return resp

    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    return app


class BackgroundServer:
    """The app served on 127.0.0.1 from a thread of its own (tests, benchmarks)."""

    def __init__(self, app: web.Application, port: int = 0) -> None:
        self.app = app
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._port = port
        self.url = ""
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        runner = web.AppRunner(self.app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", self._port)
        self._loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self._runner = runner
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m testbed.live.instant_server", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--fail-every", type=int, default=0)
    p.add_argument("--stall-every", type=int, default=0)
    p.add_argument("--reset-every", type=int, default=0)
    a = p.parse_args(argv)
    web.run_app(make_app(Faults(a.fail_every, a.stall_every, a.reset_every)), host=a.host, port=a.port, print=None)


if __name__ == "__main__":
    main()
