"""Hypothesis profiles: `ci` (the default: `make test`, `make test-fast`, CI) and `deep`
(`pytest --hypothesis-profile=deep`, or `make test-deep`).

The costly properties (each example is one or two whole replays) draw `examples(n)`: n examples
under `deep` (the counts they always had) and a quarter of n under `ci`, where a whole suite
must fit in a few minutes. The cheap properties keep their counts under both profiles.

A profile's max_examples sets the scale (hypothesis's default 100 is the full count), so
`--hypothesis-profile=default` draws the full counts too.
"""

from __future__ import annotations

from hypothesis import settings

FULL = 100  # hypothesis's own default max_examples: the scale at which examples(n) == n
CI_EXAMPLES = 25  # a quarter


def register() -> None:
    """Registers `ci` and `deep` on what hypothesis loaded at import (its built-in `ci` profile
    where the CI variable is set: derandomized, no example database), and loads `ci`.
    A --hypothesis-profile on the command line loads after this (hypothesis's pytest plugin
    reads it in pytest_configure, after the first conftest.py), and wins."""
    base = settings.default
    settings.register_profile("ci", base, max_examples=CI_EXAMPLES)
    settings.register_profile("deep", base, max_examples=FULL)
    settings.load_profile("ci")


def examples(full: int) -> int:
    """How many examples a costly property draws under the loaded profile: `full` under `deep`
    (or any profile of max_examples 100), in proportion under `ci`, and never fewer than 5."""
    return max(5, round(full * settings.default.max_examples / FULL))
