"""The endpoints a server run sends to, and the checks of its options (no HTTP library imported:
every command checks its options)."""

from __future__ import annotations

from testbed.errors import ConfigError

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def check_server_options(opts) -> None:
    """--mode server needs --url; --url and --served-model are for it only."""
    if opts.mode == "server":
        if not opts.url:
            raise ConfigError("--mode server needs --url http://HOST:PORT (an OpenAI-compatible server)")
        if not str(opts.url).startswith(("http://", "https://")):
            raise ConfigError(f"--url {opts.url}: give an http:// or https:// address")
        if opts.endpoint not in ENDPOINTS:
            raise ConfigError(f"--endpoint {opts.endpoint}: choose one of {', '.join(ENDPOINTS)}")
        if opts.request_timeout is not None and not opts.request_timeout > 0:
            raise ConfigError(f"--request-timeout must be positive seconds, got {opts.request_timeout}")
    elif opts.url is not None or opts.served_model is not None:
        raise ConfigError(f"--url and --served-model are for --mode server, not --mode {opts.mode}")
