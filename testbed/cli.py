"""The `testbed` command line."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from scheduler.model_config import ModelConfigError, bundled_model_names
from scheduler.policy import POLICIES
from simulator.hardware import HardwareConfigError
from testbed.errors import ConfigError, TraceError
from testbed.replay import ReplayOptions, check_options, replay
from testbed.summary_table import format_summary

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def add_replay_options(p: argparse.ArgumentParser) -> None:
    """The options every replay takes (also the axes of a sweep)."""
    d = ReplayOptions()
    p.add_argument("--mode", choices=("sim", "real"), default=d.mode, help="simulate, or run the real engine")
    p.add_argument("--policy", choices=POLICIES, default=d.policy, help="waiting-queue order (default %(default)s)")
    p.add_argument("--chunked-prefill-size", type=int, default=d.chunked_prefill_size, help="prefill chunk in tokens; <= 0 disables chunking (default %(default)s)")
    p.add_argument("--max-prefill-tokens", type=_positive_int, default=d.max_prefill_tokens, help="new tokens per prefill batch (default %(default)s)")
    p.add_argument("--page-size", type=_positive_int, default=d.page_size, help="KV page size in tokens (default %(default)s)")
    p.add_argument("--kv-tokens", type=_positive_int, default=None, help="KV pool size in tokens (default: from the model and the device memory)")
    p.add_argument("--mem-fraction-static", type=float, default=d.mem_fraction_static, help="device memory share for weights and KV (default %(default)s)")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None, help="overlap scheduling with the forward (default on; off for the real engine on a CPU)")
    p.add_argument("--disable-radix-cache", action="store_true", help="no prefix cache")
    p.add_argument("--max-running-requests", type=_positive_int, default=None, help="cap on the running batch (default: from the KV pool)")
    p.add_argument("--model", default=None, help=f"bundled config ({', '.join(bundled_model_names())}) or a local HF folder / config.json (default llama-3.1-8b; tiny-llama for --mode real on a CPU)")
    p.add_argument("--hardware", default=d.hardware, help="hardware spec: h100, h200, a100, cpu, or a JSON file (default %(default)s)")
    p.add_argument("--time-scale", type=_positive_float, default=d.time_scale, help="multiply arrival times: 2 stretches them (half the load), 0.5 compresses (default %(default)s)")
    p.add_argument("--max-requests", type=_positive_int, default=None, help="replay only the first N requests")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of every random choice (default %(default)s)")
    p.add_argument("--format", choices=("native", "mooncake", "azure", "sharegpt"), default=None, help="trace format (default: detected from the content)")
    p.add_argument("--rate", type=_positive_float, default=None, help="request rate for traces without arrival times (ShareGPT lengths)")
    p.add_argument("--profile", default=None, help="sim: cost every forward and CPU stage from a calibrated profile (testbed calibrate) instead of the roofline")
    g = p.add_argument_group("real engine (--mode real)")
    g.add_argument("--load-format", choices=("auto", "dummy"), default=None, help="weights from the model folder (auto) or random (dummy); default: auto for a folder, dummy for a bundled config")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default=d.device, help="default: CUDA if present, else the CPU")
    g.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default=d.dtype, help="default: bfloat16 on CUDA, float32 on the CPU")
    g.add_argument("--attention-backend", choices=("auto", "torch", "flashinfer"), default=d.attention_backend, help="default: flashinfer on CUDA when installed, else torch")
    g.add_argument("--kv-memory-gb", type=_positive_float, default=d.kv_memory_gb, help="CPU: KV cache budget when --kv-tokens is not given (default %(default)s)")


def options_from_args(args: argparse.Namespace) -> ReplayOptions:
    # Every ReplayOptions field has a --flag of the same name (add_replay_options).
    return ReplayOptions(**{f.name: getattr(args, f.name) for f in fields(ReplayOptions)})


def cmd_replay(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    opts = options_from_args(args)
    check_options(opts)
    from testbed.replay import default_overlap

    overlap = default_overlap(opts)
    bar = tqdm(total=None, unit="req", desc=f"replay {opts.mode}", disable=args.quiet, dynamic_ncols=True)

    def progress(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        if done != bar.n:
            bar.update(done - bar.n)

    try:
        result = replay(args.trace, opts, out=args.out, progress=progress)
    except KeyboardInterrupt:
        print("\ninterrupted: the run folder is marked incomplete", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        bar.close()
    print(format_summary(result.summary, title=f"{args.trace} ({opts.mode}, {opts.policy}, overlap {'on' if overlap else 'off'})"))
    print(f"run folder: {result.run_dir}   (wall {result.wall_s:.1f} s)")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from testbed.calibrate import CalibrationConfig, calibrate

    bars: dict[str, tqdm] = {}

    def progress(phase: str, done: int, total: int) -> None:
        if args.quiet:
            return
        bar = bars.get(phase)
        if bar is None:
            label = "forward sweep" if phase == "forward" else "real replay (CPU stages, forwards in place)"
            bar = bars[phase] = tqdm(total=total, desc=label, dynamic_ncols=True)
        bar.total = total
        bar.update(done - bar.n)

    cfg = CalibrationConfig(model=args.model, hardware=args.hardware, load_format=args.load_format, device=args.device, reps=args.reps)
    if args.refit:
        from simulator.profile_cost import ProfileError
        from testbed.calibrate import refit

        try:
            profile = refit(args.out)
        except ProfileError as e:
            raise ConfigError(str(e)) from None
    else:
        try:
            profile = calibrate(cfg, args.out, progress)
        finally:
            for bar in bars.values():
                bar.close()
    h = profile["holdout"]
    print(f"profile {args.out}: {profile['model']} on {profile['hardware']}, {len(profile['measurements']['extend'])} extend "
          f"+ {len(profile['measurements']['decode'])} decode points, {profile['wall_s']} s")
    for kind in ("extend", "decode"):
        e = h[kind]
        if e.get("points"):
            print(f"  {kind} fit, held-out error: median {e['median_rel_err'] * 100:.1f}%, max {e['max_rel_err'] * 100:.1f}% ({e['points']} points)")
        r = h.get(f"replay_{kind}")
        if r:
            print(f"    on the replay's {r['points']} {kind} forwards: median error {r['median_rel_err'] * 100:.1f}%, "
                  f"total {r['total_rel_err'] * 100:+.1f}% ({r['outliers']} starved outliers left out of the fit)")
    for stage in ("schedule", "launch", "process"):
        print(f"  CPU {stage}: {profile['fit']['cpu'][stage]}")
    ov = profile["fit"].get("overlap_forward")
    if ov:
        print("  with overlap, a forward takes longer by " + " and ".join(
            f"{ov[k]['fixed_s'] * 1e3:.2f} ms + {ov[k]['per_req_s'] * 1e6:.1f} us a request ({k})" for k in ("extend", "decode")))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from testbed import compare_cli, dashboard_cli, sweep_cli, trace_cli

    parser = argparse.ArgumentParser(prog="testbed", description="LLM-serving scheduler testbed: replay traces in simulation or on a real engine")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("replay", help="replay a trace and write a run folder")
    p.add_argument("trace", help="trace file: native JSON/JSONL, Mooncake JSONL, Azure CSV or ShareGPT-length CSV")
    add_replay_options(p)
    p.add_argument("--out", default=None, help="run folder (default runs/<trace>-<mode>-<policy>-<time>)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_replay)
    trace_cli.register(sub)
    compare_cli.register(sub)
    dashboard_cli.register(sub)
    sweep_cli.register(sub)
    p = sub.add_parser("calibrate", help="measure the real engine here and fit a profile for the simulator")
    p.add_argument("--model", default="tiny-llama", help="bundled config or local HF folder (default %(default)s)")
    p.add_argument("--hardware", default=None, help="a name for this machine in the profile (default: cpu or the GPU's name)")
    p.add_argument("--out", required=True, help="profile file to write, e.g. profiles/cpu-tiny-llama.json")
    p.add_argument("--load-format", choices=("auto", "dummy"), default=None)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--reps", type=_positive_int, default=5, help="timed repetitions per grid point (default %(default)s)")
    p.add_argument("--refit", action="store_true", help="measure nothing: fit the profile in --out again from its measurements")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_calibrate)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (TraceError, ModelConfigError, HardwareConfigError, ConfigError, FileNotFoundError, IsADirectoryError) as e:
        print(f"testbed: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # `testbed ... | head`: the reader left; not an error of ours.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
