"""`testbed serve`: the command line of serve.py."""

from __future__ import annotations

import argparse

from testbed.errors import ConfigError

# Replay options about a trace or the simulator, which a server has no use for: given, they are refused.
_NOT_FOR_A_SERVER = ("time_scale", "max_requests", "format", "rate", "concurrency", "url", "served_model", "request_timeout", "profile")


def cmd_serve(args: argparse.Namespace) -> int:
    from testbed.live.serve import serve
    from testbed.options import options_from_args
    from testbed.replay_options import ReplayOptions

    opts = options_from_args(args)
    if opts.mode != "real":
        raise ConfigError(f"--mode {opts.mode}: testbed serve runs the real engine (--mode real)")
    defaults = ReplayOptions()
    given = [name for name in _NOT_FOR_A_SERVER if getattr(opts, name) != getattr(defaults, name)]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ConfigError(f"{flags}: for a replay of a trace, not for testbed serve")
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port}: give a port from 1 to 65535")
    serve(opts, args.host, args.port, args.served_model_name)
    return 0


def register(sub) -> None:
    from testbed.options import add_replay_options

    p = sub.add_parser(
        "serve",
        help="the real engine behind an OpenAI-compatible streaming server (/v1/completions, /v1/chat/completions, /metrics)",
    )
    add_replay_options(p)
    p.set_defaults(mode="real")  # (the only mode a server runs)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port (default %(default)s)")
    p.add_argument("--served-model-name", default=None, help="the model name clients give (default: --model's name)")
    p.set_defaults(func=cmd_serve)
