from __future__ import annotations

import pytest

from testbed.validate.points import MeasuredPoint, default_points_path, load_points


@pytest.fixture(scope="session")
def points() -> list[MeasuredPoint]:
    """Every row of the installed silicon_sample.csv."""
    return load_points(default_points_path())
