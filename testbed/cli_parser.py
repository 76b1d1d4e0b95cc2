"""The argument parser of every `testbed` command: a usage error is one line, not a page.

argparse prints the whole usage (about 20 lines for replay) before its message; a person
reads the message, so that is all there is, with where to look for the rest. Subparsers
are made of the parser's own class, so every subcommand behaves the same.
"""

from __future__ import annotations

import argparse
import typing

from testbed.errors import EXIT_USAGE


class CliParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_USAGE, f"testbed: error: {message} (see {self.prog} --help)\n")
