"""`testbed` (the console script) and `python -m testbed`.

The CLI's imports (pandas, pyarrow, the scheduler) take a moment; a Ctrl-C or SIGTERM
then is answered like one at any other moment: one line, exit code 130, no traceback.
"""

from __future__ import annotations

import os
import sys

from testbed.errors import EXIT_INTERRUPTED
from testbed.interrupts import ignore_stop_signals, sigterm_as_sigint


def main() -> int:
    sigterm_as_sigint()
    try:
        from testbed.cli import main as cli_main
    except KeyboardInterrupt:
        ignore_stop_signals()
        print("testbed: interrupted while starting: nothing was run", file=sys.stderr)
        # Out at once: nothing was opened, and the interpreter's shutdown after an import cut
        # midway ended the process by SIGINT (exit -2, not 130) in the full test suite.
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)
    code = cli_main()
    ignore_stop_signals()  # done: the exit code stands
    return code


if __name__ == "__main__":
    sys.exit(main())
