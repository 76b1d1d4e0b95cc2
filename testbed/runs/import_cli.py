"""`testbed run import FILE`: another system's serving run as a run folder (the `run` command group).

testbed/cli.py calls `register(subparsers)`. A bad file is a TraceError: the main CLI
prints it as one line and exits 2.
"""

from __future__ import annotations

import argparse

from testbed.options import positive_int
from testbed.runs.import_run import import_run
from testbed.runs.importers import IMPORT_FORMATS
from testbed.runs.summary_table import format_summary


def register(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser("run", help="run folders of other systems: import")
    sub = run.add_subparsers(dest="run_command", metavar="{import}")
    sub.required = True
    p = sub.add_parser(
        "import",
        help="import a real serving run (LLMServingSim, vllm bench serve, sglang.bench_serving) as a run folder",
        description="Write a run folder with a replay's schema from another system's run, and beside it "
        "trace.jsonl, the run's arrivals and lengths as a native trace: replay that in sim and compare. "
        "The format is detected from the content unless --format.",
    )
    p.add_argument("file", help="requests.jsonl of LLMServingSim, a vllm bench serve result JSON, or a sglang.bench_serving JSONL")
    p.add_argument("--format", choices=IMPORT_FORMATS, default=None, help="the file's format (default: detected)")
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument(
        "--entry",
        type=positive_int,
        default=None,
        help="vllm-bench, sglang-bench: the line of the run to import when the file holds several (default: the last)",
    )
    p.add_argument("--seed", type=int, default=0, help="sglang-bench: seed of the Poisson arrivals drawn for it (default %(default)s)")
    p.set_defaults(func=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    result = import_run(args.file, args.out, args.format, entry=args.entry, seed=args.seed)
    print(format_summary(result.summary, title=f"{args.file} (imported, {result.format})"))
    for note in result.missing:
        print(f"missing: {note}")
    print(f"run folder: {result.run_dir}   trace: {result.trace_path}")
    return 0
