"""One request to an OpenAI-compatible server, streamed: what a serving benchmark's client
records (`vllm bench serve`, `sglang.bench_serving`).

The prompt is a list of token ids (vLLM and SGLang both take one as `prompt`; the chat endpoint
gets it as text of those ids, see chat_body), and the server is asked for exactly max_tokens
tokens: `ignore_eos`, `min_tokens` = `max_tokens`. Every chunk's arrival is a token time; with
`stream_options.continuous_usage_stats` (vLLM, SGLang) a chunk says how many tokens it brings,
else each chunk with text counts one and the final usage gives the total.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Sequence

import aiohttp


@dataclass
class StreamRecord:
    """What the client saw of one request (times on the replay's clock, seconds)."""

    sent: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish: float | None = None
    output_tokens: int = 0  # as the server counted them (usage), else the chunks that brought text
    cached_tokens: int | None = None  # prompt tokens the server's prefix cache held, where its usage says
    error: str | None = None  # the kind: "http 503", "timeout", "connection", "stream"; None when it ended well
    detail: str | None = None  # the error's own words (one line)


def completion_body(model: str, prompt: Sequence[int], max_tokens: int) -> dict:
    return {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


def chat_body(model: str, prompt: Sequence[int], max_tokens: int) -> dict:
    """The chat endpoint takes messages of text: the prompt's ids written out as words (its token
    count is then the server tokenizer's, near but not exactly len(prompt))."""
    body = completion_body(model, prompt, max_tokens)
    del body["prompt"]
    body["messages"] = [{"role": "user", "content": " ".join(str(t) for t in prompt)}]
    return body


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


async def stream_request(
    session: aiohttp.ClientSession, url: str, body: dict, clock, timeout_s: float | None, record: StreamRecord
) -> StreamRecord:
    """POST body to url (an endpoint of ENDPOINTS) and read its event stream into record (clock():
    the replay's time). Never raises for what the server or network does: record.error says."""
    record.sent = clock()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=body) as resp:
                if resp.status != 200:
                    record.error, record.detail = f"http {resp.status}", _one_line(await resp.text())
                    return record
                usage_total = None
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    now = clock()
                    chunk = json.loads(data)
                    if "error" in chunk:
                        record.error, record.detail = "stream", _one_line(chunk["error"])
                        return record
                    usage = chunk.get("usage") or {}
                    choices = chunk.get("choices") or []
                    n = usage.get("completion_tokens")
                    if choices and n is not None:  # continuous usage: the tokens so far
                        new = n - len(record.token_times)
                    elif choices:
                        c = choices[0]
                        new = 1 if (c.get("text") or (c.get("delta") or {}).get("content")) else 0
                    else:
                        new = 0
                    record.token_times.extend([now] * max(new, 0))
                    if n is not None:
                        usage_total = n
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                    if isinstance(cached, int):
                        record.cached_tokens = cached
                record.finish = clock()
                record.output_tokens = usage_total if usage_total is not None else len(record.token_times)
    except TimeoutError:
        record.error, record.detail = "timeout", f"no end after {timeout_s:g} s"
    except aiohttp.ClientConnectionError as e:
        record.error, record.detail = "connection", _one_line(f"{type(e).__name__}: {e}")
    except (aiohttp.ClientError, ValueError, UnicodeDecodeError) as e:
        record.error, record.detail = "stream", _one_line(f"{type(e).__name__}: {e}")
    return record


def wall_clock(t0: float):
    """The replay's clock: seconds since t0 (time.perf_counter)."""
    return lambda: time.perf_counter() - t0
