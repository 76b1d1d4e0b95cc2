"""`testbed` (the console script) and `python -m testbed`.

The CLI's imports (pandas, pyarrow, the scheduler) take a moment; a Ctrl-C or SIGTERM
then is answered like one at any other moment: one line, exit code 130, no traceback.
So this module sets the handlers before it imports anything of the project's.
"""

from __future__ import annotations

import os
import signal
import sys

EXIT_INTERRUPTED = 130  # testbed.errors.EXIT_INTERRUPTED (its import is one of those a signal may cut)


def main() -> int:
    # A process started in the background inherits SIGINT ignored, and Python leaves it so: the
    # replay's own handler (testbed.interrupts) would then answer a SIGINT, its imports not.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # (testbed.interrupts.sigterm_as_sigint)
    try:
        from testbed.cli import main as cli_main
        from testbed.interrupts import ignore_stop_signals
    except KeyboardInterrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):  # (testbed.interrupts.ignore_stop_signals)
            signal.signal(sig, signal.SIG_IGN)
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
