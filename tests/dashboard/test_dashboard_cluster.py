"""The Run page of a cluster run (replay --replicas N): each instance's load, and where requests went.

A real 3-replica simulation of the example trace, shown through the app as `testbed dashboard`
runs it (streamlit's AppTest); the figures' data is checked against the run's own tables.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from dashboard_helpers import plotly_array
from streamlit.testing.v1 import AppTest

from dashboard import cluster_charts
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import load_run

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
TRACE = Path(__file__).resolve().parents[2] / "traces" / "a.json"
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("dash-cluster") / "runs"
    replay(str(TRACE), ReplayOptions(replicas=3, router="round-robin", max_requests=90, time_scale=0.25), out=d / "cluster")
    replay(str(TRACE), ReplayOptions(max_requests=90), out=d / "single")
    return d


def _run_page(monkeypatch, runs_dir: Path, run: str) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", "--runs", str(runs_dir)])
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S).run()
    at.switch_page("views/run.py").run()
    (select,) = [w for w in at.selectbox if w.label == "Run"]
    select.set_value(run).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _charts(at: AppTest) -> dict[str, dict]:
    specs = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    return {spec["layout"]["title"]["text"]: spec for spec in specs}


def test_cluster_run_shows_each_instance_and_where_requests_went(monkeypatch, runs_dir):
    at = _run_page(monkeypatch, runs_dir, "cluster")
    run = load_run(runs_dir / "cluster")
    assert "Instances" in [h.value for h in at.header]
    assert any("round-robin" in m.value and "load imbalance" in m.value for m in at.markdown)
    charts = _charts(at)
    load = charts["Load per instance"]
    # One line per instance in each of running, waiting and KV: three instances, three panels.
    names = [trace["name"] for trace in load["data"]]
    assert sorted(set(names)) == ["instance 0", "instance 1", "instance 2"] and len(names) == 9
    # Each instance's peak of running requests is its own steps' peak (no mixing of instances).
    for trace in load["data"][::3]:
        instance = int(trace["name"].split()[-1])
        own = run.steps[run.steps["instance"] == instance]
        assert max(plotly_array(trace["y"])) == own["num_running"].max()
    routing = charts["Where the router sent the requests"]
    sent = dict(zip(plotly_array(routing["data"][0]["x"]), plotly_array(routing["data"][0]["y"])))
    counts = run.requests["instance"].value_counts()
    assert sent == {str(i): int(counts[i]) for i in range(3)}
    # Round robin: 90 requests, 30 each.
    assert set(sent.values()) == {30}
    table = at.dataframe[-1].value
    assert list(table["requests"]) == [30, 30, 30]
    assert table["output_tokens"].sum() == run.requests["output_tokens"].sum()
    # The step timeline is one instance's CPU and device at a time.
    (instance,) = [w for w in at.selectbox if w.label == "Instance"]
    instance.set_value(2).run()
    (download,) = at.get("download_button")
    assert f"All {int((run.steps['instance'] == 2).sum()):,} steps" in download.help


def test_single_instance_run_has_no_instances_section(monkeypatch, runs_dir):
    at = _run_page(monkeypatch, runs_dir, "single")
    assert "Instances" not in [h.value for h in at.header]
    assert "Load per instance" not in _charts(at)
    assert cluster_charts.instance_count(load_run(runs_dir / "single").steps) == 1
