"""The `testbed` command line."""

from __future__ import annotations

import argparse
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from testbed.backends import describe_engine
from testbed.cli_parser import CliParser
from testbed.errors import EXIT_INTERRUPTED, EXIT_USAGE, USER_ERRORS, ConfigError
from testbed.interrupts import ignore_stop_signals, sigterm_as_sigint
from testbed.options import add_replay_options, options_from_args, positive_int
from testbed.progress import progress_bar
from testbed.replay import ReplayProgress, default_run_dir, replay
from testbed.run_estimate import TimeLeft, busy_cpu_note, describe_work
from testbed.runs.folder import check_out_folder, interrupted_message
from testbed.runs.summary_table import format_instances, format_rejections, format_summary, run_title


def cmd_replay(args: argparse.Namespace) -> int:
    since = time.time()
    opts = options_from_args(args)
    out = check_out_folder(args.out) if args.out is not None else default_run_dir(args.trace, opts)
    bars = []  # made at the first report: after the trace, the model and the options are checked

    time_left: list[TimeLeft] = []  # real mode: the wall time left beside the progress

    def started(meta: dict) -> None:
        if meta.get("mode") == "real":
            print(describe_engine(meta), flush=True)
            if not args.quiet:
                print(describe_work(meta["trace"]), file=sys.stderr, flush=True)
            if (note := busy_cpu_note(meta)) is not None:
                print(note, file=sys.stderr, flush=True)
            time_left.append(TimeLeft(meta["trace"]["arrival_span_s"]))
        if meta.get("mode") == "server":
            srv = meta["server"]
            print(
                f"server {srv['url']}: {srv['model']}"
                + (f", {srv['version']}" if srv.get("version") else "")
                + ("" if srv.get("metrics") else " (no /metrics: the steps table stays empty)"),
                flush=True,
            )
        if meta.get("arrivals"):  # a closed loop (--concurrency): said once, before the progress
            print(meta["arrivals"], file=sys.stderr, flush=True)

    def progress(p: ReplayProgress) -> None:
        if not bars:
            bars.append(progress_bar(f"replay {opts.mode}", "req", p.total, disable=args.quiet))
        bar = bars[0]
        if time_left and (text := time_left[0].update(p)) is not None:
            bar.set_postfix_str(text, refresh=False)
        bar.update(p.done - bar.n)

    try:
        result = replay(args.trace, opts, out=out, progress=progress, started=started)
    except KeyboardInterrupt:
        for bar in bars:
            bar.close()
        print(interrupted_message(out, since), file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        for bar in bars:
            bar.close()
    s = result.summary
    if s["rejected"] and not s["completed"] and not s["unfinished"]:
        print(
            f"testbed: error: every request was rejected: {format_rejections(result.rejections)}; run folder {result.run_dir}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    print(format_summary(s, title=run_title(args.trace, result.meta)))
    if s.get("instances"):
        print(format_instances(s))
    if result.rejections:
        print(f"rejected: {format_rejections(result.rejections)}")
    if s.get("failed"):
        print(f"failed: {format_rejections(result.failures)}")
    if s.get("send_lag_p50_ms") is not None:
        print(f"send lag (sent - trace time): p50 {s['send_lag_p50_ms']:.2f} ms, p99 {s['send_lag_p99_ms']:.2f} ms")
    print(f"run folder: {result.run_dir}   (wall {result.wall_s:.1f} s)")
    return 0


CALIBRATION_PHASES = {  # calibrate's progress phase -> (label, unit)
    "forward": ("forward sweep", "points"),
    "replay": ("real replay (CPU stages, forwards in place)", "requests"),
    "replay overlap": ("real replay with overlap", "requests"),
}


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.source != "aiconfigurator" and (args.mixed_attention or args.decode_attention):
        raise ConfigError("--mixed-attention and --decode-attention are for --source aiconfigurator")
    if args.source != "llmservingsim" and args.timings:
        raise ConfigError("--timings is for --source llmservingsim")
    if args.source == "aiconfigurator":
        return cmd_calibrate_kernels(args)
    if args.source == "llmservingsim":
        return cmd_calibrate_llmservingsim(args)
    if args.link_gbps is not None:
        raise ConfigError("--link-gbps and --link-latency-us are for the kernel sources (--source aiconfigurator or llmservingsim)")
    if (
        args.system
        or args.backend_version
        or args.tp != 1
        or args.ep != 1
        or args.dp != 1
        or args.expert_imbalance is not None
        or args.quantization
        or args.kv_cache_dtype != "auto"
    ):
        raise ConfigError(
            "--system, --backend-version, --tp, --ep, --dp, --expert-imbalance, --quantization and --kv-cache-dtype are for --source aiconfigurator"
        )
    from simulator.hardware.specs import load_hardware
    from testbed.calibrate import CalibrationConfig, calibrate
    from testbed.options import ReplayOptions, default_hardware

    if args.refit and args.out is None:
        raise ConfigError("--refit: give the profile to fit again with --out FILE")
    hardware = args.hardware or (None if args.refit else default_hardware(ReplayOptions(mode="real", device=args.device)))
    if hardware is None and not args.refit:
        raise ConfigError("--hardware: this GPU matches no bundled spec; give its spec (h100, h200, a100 or a JSON file)")
    if hardware is not None:
        load_hardware(hardware)  # one meaning of --hardware: a spec, checked before anything is measured
    model = args.model or "tiny-llama"
    out = args.out or str(Path("runs") / "profiles" / f"{Path(model.rstrip('/')).name}-{Path(str(hardware)).stem}.json")
    bars: dict = {}

    def progress(phase: str, done: int, total: int) -> None:
        bar = bars.get(phase)
        if bar is None:
            label, unit = CALIBRATION_PHASES.get(phase, (phase, "steps"))
            bar = bars[phase] = progress_bar(label, unit, total, disable=args.quiet)
        bar.update(done - bar.n)

    cfg = CalibrationConfig(model=model, hardware=hardware, load_format=args.load_format, device=args.device, reps=args.reps)
    if args.refit:
        from simulator.costs.profile_cost import ProfileError
        from testbed.calibrate import refit

        try:
            profile = refit(out)
        except ProfileError as e:
            raise ConfigError(str(e)) from None
    else:
        try:
            profile = calibrate(cfg, out, progress)
        except KeyboardInterrupt:
            print(f"interrupted: nothing was written to {out} (a profile is written when calibration ends)", file=sys.stderr)
            return EXIT_INTERRUPTED
        finally:
            for bar in bars.values():
                bar.close()
    h = profile["holdout"]
    print(
        f"profile {out}: {profile['model']} on {profile['hardware']}, {len(profile['measurements']['extend'])} extend "
        f"+ {len(profile['measurements']['decode'])} decode points, {profile['wall_s']} s"
    )
    for kind in ("extend", "decode"):
        e = h[kind]
        if e.get("points"):
            print(
                f"  {kind} fit, held-out error: median {e['median_rel_err'] * 100:.1f}%, max {e['max_rel_err'] * 100:.1f}% ({e['points']} points)"
            )
        r = h.get(f"replay_{kind}")
        if r:
            print(
                f"    on the replay's {r['points']} {kind} forwards: median error {r['median_rel_err'] * 100:.1f}%, "
                f"total {r['total_rel_err'] * 100:+.1f}% ({r['outliers']} starved outliers left out of the fit)"
            )
    for stage in ("schedule", "launch", "process"):
        c = profile["fit"]["cpu"][stage]
        print(
            f"  CPU {stage}: {c['base_s'] * 1e6:.1f} us + {c['per_req_s'] * 1e6:.2f} us a request + {c['per_token_s'] * 1e6:.3f} us a token"
        )
    ov = profile["fit"].get("overlap_forward")
    if ov:
        print(
            "  with overlap, a forward takes longer by "
            + " and ".join(
                f"{ov[k]['fixed_s'] * 1e3:.2f} ms + {ov[k]['per_req_s'] * 1e6:.1f} us a request ({k})" for k in ("extend", "decode")
            )
        )
    return 0


def _link(args: argparse.Namespace):
    """--link-gbps / --link-latency-us as an InterconnectLink (None without them)."""
    from simulator.profiles.interconnect_link import InterconnectLink

    if args.link_gbps is None:
        if args.link_latency_us is not None:
            raise ConfigError("--link-latency-us needs --link-gbps")
        return None
    try:
        return InterconnectLink(args.link_gbps * 1e9, (args.link_latency_us or 0.0) * 1e-6, "--link-gbps, --link-latency-us")
    except ValueError:
        raise ConfigError(
            f"--link-gbps {args.link_gbps:g} --link-latency-us {args.link_latency_us or 0:g}: needs a bandwidth above 0 and a latency of 0 or more"
        ) from None


def cmd_calibrate_llmservingsim(args: argparse.Namespace) -> int:
    from testbed.calibrate_llmservingsim import calibrate_llmservingsim, default_out, summary_lines

    if not args.timings:
        raise ConfigError("--source llmservingsim needs --timings DIR: LLMServingSim's timings of the GPU (meta.yaml beside tp<N>/)")
    asked = [
        name
        for name, value in (("--system", args.system), ("--backend-version", args.backend_version), ("--quantization", args.quantization))
        if value
    ]
    asked += [
        name
        for name, value, default in (("--ep", args.ep, 1), ("--dp", args.dp, 1), ("--kv-cache-dtype", args.kv_cache_dtype, "auto"))
        if value != default
    ]
    if asked or args.expert_imbalance is not None:
        raise ConfigError(
            f"{', '.join(asked) or '--expert-imbalance'}: not for --source llmservingsim (its timings are of one GPU, bf16, TP only)"
        )
    out = args.out or str(default_out(args.timings, args.tp))
    profile = calibrate_llmservingsim(args.timings, args.model, args.tp, out, hardware=args.hardware, link=_link(args))
    print("\n".join(summary_lines(profile, out)))
    return 0


def cmd_calibrate_kernels(args: argparse.Namespace) -> int:
    from testbed.calibrate_kernels import DEFAULT_MODEL, calibrate_kernels, summary_lines

    if args.hardware:
        raise ConfigError("--hardware: with --source aiconfigurator the hardware is the --system's")
    model = args.model or DEFAULT_MODEL
    precision = (f"-{args.quantization}" if args.quantization else "") + (
        "-kv" + args.kv_cache_dtype if args.kv_cache_dtype != "auto" else ""
    )
    out = args.out or str(
        Path("runs")
        / "profiles"
        / f"{args.system}-{args.backend}-{Path(model.rstrip('/')).name}-tp{args.tp}{f'-ep{args.ep}' if args.ep > 1 else ''}{f'-dp{args.dp}' if args.dp > 1 else ''}{precision}.json"
    )
    bars: list = []

    def progress(phase: str, done: int, total: int) -> None:
        if not bars:
            bars.append(progress_bar("kernels", "queries", total, disable=args.quiet))
        bars[0].update(done - bars[0].n)

    try:
        profile = calibrate_kernels(
            args.system,
            args.backend,
            args.backend_version,
            model,
            args.tp,
            out,
            progress,
            quantization=args.quantization,
            kv_cache_dtype=args.kv_cache_dtype,
            mixed_attention=args.mixed_attention,
            decode_attention=args.decode_attention,
            ep=args.ep,
            expert_imbalance=args.expert_imbalance,
            dp=args.dp,
            link=_link(args),
        )
    finally:
        for bar in bars:
            bar.close()
    print("\n".join(summary_lines(profile, out)))
    return 0


def _own_version() -> str:
    """The installed distribution's version; a checkout run from its folder (PYTHONPATH) has none."""
    try:
        return version("testbed")
    except PackageNotFoundError:
        return "(not installed: run from a source checkout)"


def build_parser() -> argparse.ArgumentParser:
    from simulator.costs.precision import KV_CACHE_DTYPES, QUANTIZATIONS
    from simulator.profiles.kernel_catalog import BACKENDS
    from testbed import dashboard_cli
    from testbed.live import serve_cli
    from testbed.runs import cli as runs_cli
    from testbed.runs import import_cli
    from testbed.studies import cli as studies_cli
    from testbed.traces import cli as traces_cli
    from testbed.validate import cli as validate_cli

    parser = CliParser(prog="testbed", description="LLM-serving scheduler testbed: replay traces in simulation or on a real engine")
    parser.add_argument("--version", action="version", version=f"testbed {_own_version()}")
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
    validate_cli.register(sub)
    serve_cli.register(sub)
    p = sub.add_parser(
        "calibrate", help="measure the real engine here (or take AIConfigurator's GPU kernels) and make a profile for the simulator"
    )
    p.add_argument(
        "--model", default=None, help="bundled config or local HF folder (default tiny-llama; llama-3.1-8b with --source aiconfigurator)"
    )
    p.add_argument(
        "--hardware",
        default=None,
        help="hardware spec of this machine, as replay's --hardware (h100, h200, a100, rtx4090, cpu, or a "
        "JSON file); a sim with the profile defaults to it (default: cpu, or the GPU's spec; with --source aiconfigurator: the --system)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="profile file to write (default runs/profiles/<model>-<hardware>.json; "
        "with --source aiconfigurator runs/profiles/<system>-<backend>-<model>-tp<N>[-fp8][-kvfp8].json)",
    )
    p.add_argument("--load-format", choices=("auto", "dummy"), default=None)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--reps", type=positive_int, default=5, help="timed repetitions per grid point (default %(default)s)")
    p.add_argument("--refit", action="store_true", help="measure nothing: fit the profile in --out again from its measurements")
    p.add_argument("-q", "--quiet", action="store_true")
    # A profile of a GPU system from AIConfigurator's measured kernels (testbed/calibrate_kernels.py).
    p.add_argument(
        "--source",
        choices=("engine", "aiconfigurator", "llmservingsim"),
        default="engine",
        help="engine: time this machine's engine (default); aiconfigurator: compose the model from GPU kernels measured by AIConfigurator (pip install -e '.[aiconfigurator]'); "
        "llmservingsim: from LLMServingSim's timings of a GPU (--timings)",
    )
    k = p.add_argument_group("kernel profiles (--source aiconfigurator or llmservingsim)")
    k.add_argument(
        "--link-gbps",
        type=float,
        default=None,
        help="the link between this machine's GPUs, GB/s each way: TP's all-reduces (and, with --dp, the experts' exchange) as NCCL's ring over it (default: the database's measured collectives, or the spec's interconnect)",
    )
    k.add_argument("--link-latency-us", type=float, default=None, help="one hop's latency on that link, microseconds (default 0)")
    p.add_argument_group("--source llmservingsim").add_argument(
        "--timings",
        default=None,
        metavar="DIR",
        help="LLMServingSim's timings of one GPU and model (its profiler's meta.yaml beside tp<N>/ with dense.csv, per_sequence.csv, attention.csv); --model defaults to meta.yaml's, --hardware to its gpu's bundled spec",
    )
    g = p.add_argument_group("--source aiconfigurator")
    g.add_argument(
        "--system", default=None, help="a system of the database (h100_sxm, h200_sxm, rtx_pro_6000_server, ...; a bad name lists them)"
    )
    g.add_argument("--backend", choices=BACKENDS, default="sglang", help="whose kernels (default %(default)s)")
    g.add_argument("--backend-version", default=None, help="default: the newest the database maintains for the system")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor parallelism over this many GPUs (default %(default)s)")
    g.add_argument(
        "--ep",
        type=positive_int,
        default=1,
        help="a mixture of experts' experts over this many ranks of the --tp x --dp GPUs, whole experts a rank (expert parallelism; default %(default)s)",
    )
    g.add_argument(
        "--dp",
        type=positive_int,
        default=1,
        help="attention data parallelism: this many ranks of --tp GPUs, each with its own requests and attention, a mixture of "
        "experts' experts over all tp x dp GPUs (as replay's --dp with --enable-dp-attention; default %(default)s)",
    )
    g.add_argument(
        "--expert-imbalance",
        type=float,
        default=None,
        metavar="ALPHA",
        help="a mixture of experts' token load as the database's power law of exponent ALPHA (it measures 1.01 and 1.2; default: balanced)",
    )
    g.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=None,
        help="the layers' GEMMs from the database's tables of that format: fp8 (per tensor), fp8_block (128x128 blocks), nvfp4 (Blackwell) (default: the model's dtype)",
    )
    g.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default="auto",
        help="fp8: attention from the database's fp8-KV tables where it has them (default %(default)s: the model's dtype)",
    )
    g.add_argument(
        "--mixed-attention",
        default=None,
        metavar="CSV",
        help="LLMServingSim's attention.csv of the same GPU and engine: its mixed batches price the decode rows that share a forward with a prefill chunk (the database measures none)",
    )
    g.add_argument(
        "--decode-attention",
        default=None,
        metavar="CSV",
        help="LLMServingSim's attention.csv of the same GPU, engine, model and TP: its decode batches replace the database's decode attention (the database reads a KV cache its L2 may hold; a served forward reads it from memory)",
    )
    p.set_defaults(func=cmd_calibrate)
    return parser


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    """Run the command argv (sys.argv's by default); parser: build_parser()'s, when already made."""
    sigterm_as_sigint()  # `kill` stops a replay as Ctrl-C does, leaving its folder readable
    try:
        args = (parser or build_parser()).parse_args(argv)
        return args.func(args)
    except USER_ERRORS as e:
        print(f"testbed: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # the commands that write something say what they left
        print("testbed: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `testbed ... | head`: the reader left; not an error of ours.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    code = main()
    ignore_stop_signals()  # done: the exit code stands
    sys.exit(code)
