"""The argument parser of every `testbed` command: a usage error is one line, not a page.

argparse prints the whole usage (about 20 lines for replay) before its message; a person
reads the message, so that is all there is, with where to look for the rest: the --help of
the (sub)command the error is about. Subparsers are made of the parser's own class, so
every subcommand behaves the same.
"""

from __future__ import annotations

import argparse
import typing

from testbed.errors import EXIT_USAGE

_HELP_PROG = "_help_prog"  # the namespace attribute naming the subcommand that left arguments over


class CliParser(argparse.ArgumentParser):
    _hint_prog: str | None = None

    def parse_known_args(self, args=None, namespace=None):  # noqa: ANN001 - argparse's signature
        ns, extras = super().parse_known_args(args, namespace)
        if extras and not hasattr(ns, _HELP_PROG):  # the innermost parser returns first
            setattr(ns, _HELP_PROG, self.prog)
        return ns, extras

    def parse_args(self, args=None, namespace=None):  # noqa: ANN001
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            self._hint_prog = getattr(ns, _HELP_PROG, self.prog)
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns

    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_USAGE, f"testbed: error: {message} (see {self._hint_prog or self.prog} --help)\n")
