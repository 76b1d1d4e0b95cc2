"""What a server says about itself before a run: that it answers as an OpenAI-compatible server
(`/v1/models`), the model it serves, its context length, and its version where it tells
(`/version`: vLLM and `testbed serve`; `/get_server_info`: SGLang)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from testbed.errors import ConfigError

PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ServerInfo:
    url: str  # without a trailing slash
    model: str  # the served model's name, as requests must give it
    models: tuple[str, ...]  # every model /v1/models lists
    max_model_len: int | None
    version: str | None
    has_metrics: bool


async def _get_json(session: aiohttp.ClientSession, url: str):
    async with session.get(url) as resp:
        if resp.status != 200:
            return None
        try:
            return await resp.json(content_type=None)
        except ValueError:
            return None


async def probe(url: str, served_model: str | None) -> ServerInfo:
    """Ask the server at url; ConfigError (one line) if none answers there or it is not OpenAI-compatible."""
    base = url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            listed = await _get_json(session, f"{base}/v1/models")
            if not isinstance(listed, dict) or not isinstance(listed.get("data"), list) or not listed["data"]:
                raise ConfigError(f"--url {url}: not an OpenAI-compatible server (GET /v1/models lists no model)")
            entries = [m for m in listed["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]
            models = tuple(m["id"] for m in entries)
            if served_model is not None and served_model not in models:
                raise ConfigError(f"--served-model {served_model}: the server at {url} serves {', '.join(models)}")
            model = served_model or models[0]
            entry = next(m for m in entries if m["id"] == model)
            max_len = entry.get("max_model_len")
            version = None
            for path in ("/version", "/get_server_info"):
                got = await _get_json(session, base + path)
                if isinstance(got, dict) and isinstance(got.get("version"), str):
                    version = got["version"]
                    break
            try:
                async with session.get(f"{base}/metrics") as resp:
                    has_metrics = resp.status == 200
            except aiohttp.ClientError:
                has_metrics = False
    except (aiohttp.ClientError, TimeoutError) as e:
        reason = "no answer in time" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
        raise ConfigError(f"--url {url}: no server answers there ({' '.join(str(reason).split())})") from None
    return ServerInfo(base, model, models, max_len if isinstance(max_len, int) else None, version, has_metrics)


def probe_server(url: str, served_model: str | None) -> ServerInfo:
    return asyncio.run(probe(url, served_model))
