"""What the app was started with: `streamlit run dashboard/app.py -- --runs DIR` (testbed dashboard does this)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_RUNS_DIR = "runs"


def runs_dir(argv: list[str] | None = None) -> Path:
    """The run folders' directory from the script's arguments (default runs/)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--runs", default=DEFAULT_RUNS_DIR)
    args, _ = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    return Path(args.runs)
