"""`testbed` (the console script) and `python -m testbed`.

The CLI's imports (pandas, pyarrow, the scheduler, the subcommands' modules) take a moment;
a Ctrl-C or SIGTERM then is answered like one at any other moment: one line, exit code 130,
no traceback. So this module sets its handlers before it imports anything of the project's.
During those imports a signal is held, not raised: a KeyboardInterrupt raised inside the
import machinery can land in one of its callbacks, which swallows it (the signal was lost and
the replay ran on, under load about 1 run in 100 signalled then). It is answered once the
imports are done, before any command starts.
"""

from __future__ import annotations

import os
import signal
import sys

EXIT_INTERRUPTED = 130  # testbed.errors.EXIT_INTERRUPTED (its import is one of those a signal may cut)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # (testbed.interrupts.STOP_SIGNALS)


def main() -> int:
    # A process started in the background inherits SIGINT ignored, and Python leaves it so: the
    # replay's own handler (testbed.interrupts) would then answer a SIGINT, its imports not.
    held: list[int] = []
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: held.append(signum))
    from testbed.cli import build_parser
    from testbed.cli import main as cli_main
    from testbed.interrupts import ignore_stop_signals

    parser = build_parser()
    try:
        for sig in STOP_SIGNALS:  # from here a signal is a KeyboardInterrupt (testbed.interrupts.sigterm_as_sigint)
            signal.signal(sig, signal.default_int_handler)
        if held:  # (checked after the swap: one that came just before it is in `held`)
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        ignore_stop_signals()
        print("testbed: interrupted while starting: nothing was run", file=sys.stderr)
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)  # out at once: nothing was opened
    code = cli_main(parser=parser)
    ignore_stop_signals()  # done: the exit code stands
    return code


if __name__ == "__main__":
    sys.exit(main())
