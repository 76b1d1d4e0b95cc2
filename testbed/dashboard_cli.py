"""`testbed dashboard [--runs DIR] [--port N]`: the Streamlit app on a directory of run folders.

testbed/cli.py calls `register(subparsers)`. The app runs as `streamlit run`
in a child process (Streamlit owns its event loop and signal handling); this
command prints the address, waits, and on Ctrl-C lets the child shut down and
exits 0.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
from pathlib import Path

from testbed.errors import EXIT_USAGE

DEFAULT_PORT = 8501
DEFAULT_RUNS = "runs"
SHUTDOWN_TIMEOUT_S = 10


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number in 1..65535, got {text}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "dashboard",
        help="browse run folders in a web dashboard (Streamlit)",
        description="Start the Streamlit dashboard on a directory of run folders: the Runs table, one Run in "
        "depth, Compare (sim against real), What-if simulations. Ctrl-C stops it.",
    )
    p.add_argument("--runs", default=None, help=f"directory of run folders (default {DEFAULT_RUNS}, which may not exist yet)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help="local port to serve on (default %(default)s)")
    p.set_defaults(func=cmd_dashboard)


def app_path() -> Path:
    """dashboard/app.py of the installed package (imported here, not at the top: other commands never need it)."""
    import dashboard

    return Path(dashboard.__file__).resolve().parent / "app.py"


def streamlit_command(runs: Path, port: int) -> list[str]:
    return [
        sys.executable, "-m", "streamlit", "run", str(app_path()),
        "--server.headless", "true",
        "--server.port", str(port),
        "--server.address", "localhost",
        "--browser.gatherUsageStats", "false",
        "--client.toolbarMode", "minimal",  # no "Deploy" button: this is a local tool
        "--", "--runs", str(runs),
    ]  # fmt: skip


def port_in_use(port: int) -> bool:
    """Something listens on localhost:port already (Streamlit would fail after printing a page of log)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: only a listener is in the way
        try:
            s.bind(("localhost", port))
        except OSError:
            return True
    return False


def cmd_dashboard(args: argparse.Namespace) -> int:
    runs = Path(args.runs or DEFAULT_RUNS).resolve()
    if runs.exists() and not runs.is_dir():
        print(f"testbed: error: --runs {args.runs}: not a directory", file=sys.stderr)
        return EXIT_USAGE
    if args.runs is not None and not runs.exists():  # the default may not exist yet: the app says how to fill it
        print(f"testbed: error: --runs {args.runs}: no such folder", file=sys.stderr)
        return EXIT_USAGE
    if port_in_use(args.port):
        print(f"testbed: error: --port {args.port}: the port is in use (another dashboard?); choose another with --port", file=sys.stderr)
        return EXIT_USAGE
    print(f"dashboard: http://localhost:{args.port} (runs: {args.runs or DEFAULT_RUNS})", flush=True)
    child = subprocess.Popen(streamlit_command(runs, args.port))
    try:
        return child.wait()
    except KeyboardInterrupt:
        # Ctrl-C in a terminal reached the child too (same process group); a signal from
        # elsewhere reached only us. Either way the child stops, and that is not an error.
        if child.poll() is None:
            child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=SHUTDOWN_TIMEOUT_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            child.kill()
            child.wait()
        return 0
