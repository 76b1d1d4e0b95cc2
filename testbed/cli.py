"""The `testbed` command line."""

from __future__ import annotations

import argparse
import sys

from testbed.errors import EXIT_INTERRUPTED, EXIT_USAGE, USER_ERRORS, ConfigError
from testbed.options import add_replay_options, check_options, default_overlap, options_from_args, positive_int
from testbed.replay import replay
from testbed.runs.summary_table import format_summary


def cmd_replay(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    opts = options_from_args(args)
    check_options(opts)
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

    if args.source == "aiconfigurator":
        return cmd_calibrate_kernels(args)
    if args.system or args.backend_version or args.tp != 1:
        raise ConfigError("--system, --backend-version and --tp are for --source aiconfigurator")
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

    cfg = CalibrationConfig(model=args.model or "tiny-llama", hardware=args.hardware, load_format=args.load_format, device=args.device, reps=args.reps)
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


def cmd_calibrate_kernels(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from testbed.calibrate_kernels import calibrate_kernels, summary_lines

    bar = tqdm(total=None, desc="kernels", disable=args.quiet, dynamic_ncols=True)

    def progress(phase: str, done: int, total: int) -> None:
        bar.total, bar.desc = total, f"kernels ({phase})"
        bar.update(done - bar.n)

    try:
        profile = calibrate_kernels(args.system, args.backend, args.backend_version, args.model, args.tp, args.out, progress)
    finally:
        bar.close()
    print("\n".join(summary_lines(profile, args.out)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from simulator.kernel_db import BACKENDS
    from testbed import dashboard_cli
    from testbed.runs import cli as runs_cli
    from testbed.runs import import_cli
    from testbed.studies import cli as studies_cli
    from testbed.traces import cli as traces_cli

    parser = argparse.ArgumentParser(prog="testbed", description="LLM-serving scheduler testbed: replay traces in simulation or on a real engine")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("replay", help="replay a trace and write a run folder")
    p.add_argument("trace", help="trace file: native JSON/JSONL, Mooncake JSONL, Azure CSV or ShareGPT-length CSV")
    add_replay_options(p)
    p.add_argument("--out", default=None, help="run folder (default runs/<trace>-<mode>-<policy>-<time>)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_replay)
    traces_cli.register(sub)
    runs_cli.register(sub)
    import_cli.register(sub)
    dashboard_cli.register(sub)
    studies_cli.register(sub)
    p = sub.add_parser("calibrate", help="measure the real engine here (or take AIConfigurator's GPU kernels) and make a profile for the simulator")
    p.add_argument("--model", default=None, help="bundled config or local HF folder (default tiny-llama; llama-3.1-8b with --source aiconfigurator)")
    p.add_argument("--hardware", default=None, help="a name for this machine in the profile (default: cpu or the GPU's name)")
    p.add_argument("--out", required=True, help="profile file to write, e.g. profiles/cpu-tiny-llama.json")
    p.add_argument("--load-format", choices=("auto", "dummy"), default=None)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--reps", type=positive_int, default=5, help="timed repetitions per grid point (default %(default)s)")
    p.add_argument("--refit", action="store_true", help="measure nothing: fit the profile in --out again from its measurements")
    p.add_argument("-q", "--quiet", action="store_true")
    # Issue 10: a profile of a GPU system from AIConfigurator's measured kernels (testbed/calibrate_kernels.py).
    p.add_argument("--source", choices=("engine", "aiconfigurator"), default="engine", help="engine: time this machine's engine (default); aiconfigurator: compose the model from GPU kernels measured by AIConfigurator (pip install -e '.[aiconfigurator]')")
    g = p.add_argument_group("--source aiconfigurator")
    g.add_argument("--system", default=None, help="a system of the database (h100_sxm, h200_sxm, rtx_pro_6000_server, ...; a bad name lists them)")
    g.add_argument("--backend", choices=BACKENDS, default="sglang", help="whose kernels (default %(default)s)")
    g.add_argument("--backend-version", default=None, help="default: the newest the database maintains for the system")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor parallelism over this many GPUs (default %(default)s)")
    p.set_defaults(func=cmd_calibrate)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as e:
        print(f"testbed: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # `testbed ... | head`: the reader left; not an error of ours.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
