"""`testbed trace gen|convert|info`: the trace subcommands of the testbed CLI.

testbed/cli.py calls `register(subparsers)`; each handler takes the parsed Namespace
and returns an exit code. A TraceError propagates to the main CLI, which prints it.
"""

from __future__ import annotations

import argparse
import sys

from testbed.traces.formats import FORMATS, detect_format, load_trace
from testbed.traces.gen import GenConfig, generate_trace, parse_length_spec
from testbed.traces.schema import Trace


def register(subparsers: argparse._SubParsersAction) -> None:
    trace = subparsers.add_parser("trace", help="generate, convert and inspect request traces")
    sub = trace.add_subparsers(dest="trace_command", metavar="{gen,convert,info}")
    sub.required = True
    _add_gen(sub)
    _add_convert(sub)
    _add_info(sub)


def _length_spec(text: str) -> str:
    """argparse type: check the spec early so that a typo is a usage error (exit 2)."""
    try:
        parse_length_spec(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _add_gen(sub: argparse._SubParsersAction) -> None:
    d = GenConfig()
    p = sub.add_parser(
        "gen",
        help="generate a synthetic trace",
        description="Generate a synthetic trace in the native format (JSONL if --out ends with .jsonl). "
        "Lengths are specs: N, uniform:LO,HI, normal:MEAN,STD or lognormal:MEAN,SIGMA.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", required=True, help="file to write")
    p.add_argument("-n", "--num-requests", type=int, default=d.num_requests, help="number of requests")
    p.add_argument("--rate", type=float, default=d.rate, help="mean arrival rate, requests/s")
    p.add_argument("--arrival", choices=["poisson", "gamma"], default=d.arrival, help="arrival process")
    p.add_argument("--cv", type=float, default=d.cv, help="gamma: coefficient of variation of gaps (>1 is bursty)")
    p.add_argument("--input-len", type=_length_spec, default=d.input_len, help="new prompt tokens per request")
    p.add_argument("--output-len", type=_length_spec, default=d.output_len, help="tokens to generate")
    p.add_argument("--system-prompts", type=int, default=d.system_prompts, help="number of shared system prompts")
    p.add_argument("--system-prompt-len", type=int, default=d.system_prompt_len, help="tokens per system prompt")
    p.add_argument("--shared-fraction", type=float, default=d.shared_fraction, help="fraction of sessions that start with a system prompt")
    p.add_argument(
        "--multi-turn-fraction",
        type=float,
        default=d.multi_turn_fraction,
        help="fraction of requests that are turns of multi-turn conversations",
    )
    p.add_argument("--turns", type=int, default=d.turns, help="requests per conversation")
    p.add_argument("--block-size", type=int, default=d.block_size, help="tokens per hashed block")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed")
    p.set_defaults(func=cmd_gen)


def _add_convert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a trace to the native format",
        description="Convert a trace (format detected from its content) to the native format; JSONL if --out ends with .jsonl.",
    )
    p.add_argument("src", metavar="SRC", help="trace to read")
    p.add_argument("--out", required=True, metavar="DST", help="native trace to write")
    p.add_argument("--format", choices=FORMATS, help="read SRC as this format instead of detecting it")
    p.add_argument("--rate", type=float, help="requests/s for Poisson arrivals (formats without arrivals: sharegpt)")
    p.add_argument("--seed", type=int, default=0, help="seed of those arrivals")
    p.set_defaults(func=cmd_convert)


def _add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="summarize a trace", description="Print a summary of a trace.")
    p.add_argument("path", metavar="PATH", help="trace to read")
    p.add_argument("--format", choices=FORMATS, help="read PATH as this format instead of detecting it")
    p.add_argument("--rate", type=float, help="requests/s for Poisson arrivals (sharegpt; else lengths only)")
    p.add_argument("--seed", type=int, default=0, help="seed of those arrivals")
    p.set_defaults(func=cmd_info)


def _gen_config(args: argparse.Namespace) -> GenConfig:
    return GenConfig(
        num_requests=args.num_requests,
        rate=args.rate,
        arrival=args.arrival,
        cv=args.cv,
        input_len=args.input_len,
        output_len=args.output_len,
        system_prompts=args.system_prompts,
        system_prompt_len=args.system_prompt_len,
        shared_fraction=args.shared_fraction,
        multi_turn_fraction=args.multi_turn_fraction,
        turns=args.turns,
        block_size=args.block_size,
        seed=args.seed,
    )


def cmd_gen(args: argparse.Namespace) -> int:
    cfg = _gen_config(args)
    try:
        cfg.validate()
    except ValueError as e:
        print(f"testbed trace gen: error: {e}", file=sys.stderr)
        return 2
    trace = generate_trace(cfg)
    trace.write(args.out)
    print(f"wrote {args.out}: {_one_line(trace)}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    trace = load_trace(args.src, args.format, rate=args.rate, seed=args.seed)
    trace.write(args.out)
    print(f"wrote {args.out} from {trace.format} {args.src}: {_one_line(trace)}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    fmt = args.format
    no_arrivals = args.rate is None and (fmt or detect_format(args.path)) == "sharegpt"
    # Lengths are worth showing even without a rate; the arrivals are then placeholders.
    trace = load_trace(args.path, fmt, rate=1.0 if no_arrivals else args.rate, seed=args.seed)
    print(format_info(trace, arrivals_known=not no_arrivals))
    return 0


def _one_line(trace: Trace) -> str:
    s = trace.stats()
    return (
        f"{s.num_requests:,} requests over {s.duration_s:,.1f} s ({s.rate:.2f} req/s), "
        f"mean input {s.mean_input_len:,.0f}, mean output {s.mean_output_len:,.0f} tokens"
    )


def format_info(trace: Trace, arrivals_known: bool = True) -> str:
    """The `trace info` table: one `label  value` row per line."""
    s = trace.stats()
    sizes = sorted({r.block_size for r in trace.requests if r.block_hashes})
    rows = [
        ("trace", trace.path or "(in memory)"),
        ("format", trace.format),
        ("sha256", trace.sha256()),
        ("requests", f"{s.num_requests:,}"),
        (
            "duration",
            f"{s.duration_s:,.1f} s  ({s.rate:.2f} req/s)"
            if arrivals_known
            else "no arrival times in this format (Poisson at --rate R when loaded)",
        ),
        ("input len", f"mean {s.mean_input_len:,.0f}  max {s.max_input_len:,}  total {s.total_input_tokens:,}"),
        ("output len", f"mean {s.mean_output_len:,.0f}  max {s.max_output_len:,}  total {s.total_output_tokens:,}"),
    ]
    if s.hashed_requests:
        rows.append(
            (
                "blocks",
                f"{s.unique_blocks:,} unique of {s.total_blocks:,}  (block size {', '.join(map(str, sizes))}; "
                f"{s.hashed_requests:,} requests with hashes)",
            )
        )
        rows.append(
            (
                "prefix reuse",
                f"{s.reusable_fraction:.1%} of prompt tokens  ({s.reusable_prefix_tokens:,}; infinite-cache bound)",
            )
        )
    else:
        rows.append(("blocks", "none (no prefix information)"))
    width = max(len(k) for k, _ in rows) + 2
    return "\n".join(f"{k:<{width}}{v}" for k, v in rows)
