"""Finding real rows of AIConfigurator's silicon_sample.csv for the tests of `testbed validate`."""

from __future__ import annotations

from testbed.validate.points import MeasuredPoint


def simulable_point(points: list[MeasuredPoint], **match) -> MeasuredPoint:
    """The first point the simulator can express whose fields equal `match`."""
    return next(p for p in points if p.skip_reason() is None and all(getattr(p, k) == v for k, v in match.items()))
