"""A sweep opened on the dashboard's What-if page: the points table, a metric over two axes,
the Pareto front; the pure parts (dashboard.sweep_view, charts) and the page in AppTest.

The sweeps are made here as a user makes them (`testbed sweep` in a subprocess):
three axes with a Pareto front that leaves points out, one whose model does not
exist (two points fail), and one over a single axis with a `none` value kept
outside the runs dir.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dashboard_helpers import plotly_array
from streamlit.testing.v1 import AppTest

from dashboard import charts
from dashboard.runs_index import scan_runs
from dashboard.sweep_view import (
    MEAN,
    RATE_AXIS,
    SweepLoadError,
    axis_labels,
    find_sweeps,
    metric_grid,
    open_sweep,
    pareto_front,
    points_table,
    value_label,
)
from testbed.studies.sweep import load_sweep
from testbed.traces.gen import GenConfig, generate_trace

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "dashboard" / "app.py"
TIMEOUT_S = 60  # a cold first run imports plotly and pandas on a shared 2-core machine
N = 30  # requests per point
# Queues build at x2 the load (time scale 0.5): throughput and latency trade off, and overlap off loses on both.
TRACE = GenConfig(
    num_requests=N, rate=40.0, input_len="uniform:100,1500", output_len="uniform:10,120", system_prompts=3, shared_fraction=0.7, seed=5
)
BASE = ["--max-requests", N, "--model", "tiny-llama", "--hardware", "cpu", "--workers", 2, "-q"]
MAIN_AXES = {"policy": ["fcfs", "lpm"], "time_scale": ["0.5", "1", "2"], "overlap": ["on", "off"]}
LATENCY, THROUGHPUT = "p90_ttft_ms", "output_throughput"


def _testbed(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """runs/ with the main sweep and (one level down) the failing one, a broken sweep.parquet, and
    the one-axis sweep outside runs/."""
    d = tmp_path_factory.mktemp("dash-sweep")
    trace = d / "trace.json"
    generate_trace(TRACE).write(trace)
    out = {"runs": d / "runs", "main": d / "runs" / "sweep-main", "failing": d / "runs" / "group" / "sweep-failing",
           "one": d / "elsewhere" / "sweep-one", "broken": d / "runs" / "sweep-broken",
           "capacity": d / "elsewhere" / "capacity"}  # fmt: skip
    grid = [a for name, values in MAIN_AXES.items() for a in ("--grid", f"{name}={','.join(values)}")]
    proc = _testbed("sweep", trace, *grid, *BASE, "--out", out["main"])
    assert proc.returncode == 0, proc.stderr
    proc = _testbed("sweep", trace, "--grid", "model=tiny-llama,llama-3.1-70b", "--grid", "overlap=on,off", *BASE, "--out", out["failing"])
    assert proc.returncode == 1, proc.stderr  # some points failed
    proc = _testbed("sweep", trace, "--grid", "kv_tokens=none,40000", *BASE, "--out", out["one"])
    assert proc.returncode == 0, proc.stderr
    proc = _testbed("capacity", trace, "--slo", "p90_ttft_ms=2000", *BASE, "--out", out["capacity"])
    assert proc.returncode == 0, proc.stderr
    out["broken"].mkdir()
    (out["broken"] / "sweep.parquet").write_bytes(b"PAR1 this is not a parquet file")
    return out


def _metric(df: pd.DataFrame, metric: str, **axes) -> float:
    """The sweep.parquet value of the one point with these axis values (labelled as in a point's name)."""
    keep = pd.Series(True, index=df.index)
    for axis, label in axes.items():
        keep &= df[axis].map(value_label) == label
    (value,) = df.loc[keep, metric]
    return value


# --- finding and opening --------------------------------------------------------------------


def test_find_sweeps_finds_them_at_any_of_a_few_levels(made):
    found = find_sweeps(made["runs"])
    assert sorted(found) == sorted([made["main"], made["failing"], made["broken"]])
    assert find_sweeps(made["one"]) == [made["one"]]  # the folder itself


@pytest.mark.parametrize("case", ["broken", "missing", "no metadata"])
def test_a_folder_that_is_not_a_readable_sweep_says_why(made, tmp_path, case):
    if case == "broken":
        path, words = made["broken"], "unreadable"
    elif case == "missing":
        path, words = tmp_path / "nothing-here", "no sweep.parquet"
    else:  # a parquet file some other tool wrote
        path, words = tmp_path, "no testbed.sweep metadata"
        pd.DataFrame({"point": ["a"], "status": ["complete"]}).to_parquet(tmp_path / "sweep.parquet")
    with pytest.raises(SweepLoadError, match=words):
        open_sweep(path)


# --- the points table -----------------------------------------------------------------------


def test_points_table_lists_every_point_axes_first_with_links_to_their_runs(made):
    sweep = open_sweep(made["main"])
    df, _ = load_sweep(made["main"])
    table = points_table(sweep, made["runs"])
    # No point failed: no error column full of None (the failing sweep's table has one).
    assert list(table.columns[:4]) == ["policy", "time_scale", "overlap", "status"]
    assert "error" not in table.columns and "error" in points_table(open_sweep(made["failing"])).columns
    assert len(table) == 12 and list(table["point"]) == list(df["point"])
    assert table[LATENCY].tolist() == df[LATENCY].tolist()
    # Each link opens the point's run: its name in the runs index of the Run page.
    names = set(scan_runs(made["runs"])["name"])
    for point, link in zip(table["point"], table["run"]):
        (name,) = parse_qs(urlsplit(link).query)["run"]
        assert name == f"sweep-main/points/{point}" and name in names


def test_failed_points_are_listed_with_their_error_but_not_drawn(made):
    sweep = open_sweep(made["failing"])
    table = points_table(sweep, made["runs"]).set_index("point")
    failed = table[table["model"] == "llama-3.1-70b"]
    assert list(failed["status"]) == ["failed", "failed"]
    assert all("does not fit" in e for e in failed["error"])
    assert failed["run"].isna().all()  # no run folder to open
    assert table.loc[table["model"] == "tiny-llama", "status"].tolist() == ["complete", "complete"]
    # Charts: only the complete points.
    grid = metric_grid(sweep, LATENCY, "overlap", "model")
    assert list(grid.index) == ["tiny-llama"] and list(grid.columns) == ["on", "off"]
    front = pareto_front(sweep, THROUGHPUT, LATENCY)
    assert set(front["model"]) == {"tiny-llama"}
    fig = charts.pareto_figure(sweep.complete(), front, THROUGHPUT, LATENCY)
    drawn = {name for trace in fig.data for name in trace.text}
    assert drawn == {"model=tiny-llama,overlap=on", "model=tiny-llama,overlap=off"}


def test_pending_points_of_an_interrupted_sweep_are_listed_but_not_drawn(made, tmp_path):
    """What Ctrl-C leaves: points not run are rows with status pending, no numbers, no folder."""
    sweep_dir = tmp_path / "interrupted"
    shutil.copytree(made["main"], sweep_dir)
    table = pq.read_table(sweep_dir / "sweep.parquet")
    df = table.to_pandas()
    pending = df["time_scale"] == 0.5
    df.loc[pending, "status"] = "pending"
    for column in json.loads(table.schema.metadata[b"testbed.sweep"])["metric_columns"]:
        df.loc[pending, column] = None
    for point in df.loc[pending, "point"]:
        shutil.rmtree(sweep_dir / "points" / point)
    pq.write_table(
        pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(table.schema.metadata), sweep_dir / "sweep.parquet"
    )
    sweep = open_sweep(sweep_dir)
    shown = points_table(sweep, tmp_path)
    assert len(shown) == 12 and (shown["status"] == "pending").sum() == 4
    assert shown.loc[shown["status"] == "pending", "run"].isna().all()
    assert list(metric_grid(sweep, LATENCY, "time_scale", "policy").columns) == ["1", "2"]
    assert 0.5 not in set(pareto_front(sweep, THROUGHPUT, LATENCY)["time_scale"])


def test_a_capacity_search_shows_its_load_as_rounded_request_rates(made):
    sweep = open_sweep(made["capacity"])
    report = json.loads((made["capacity"] / "capacity.json").read_text())
    assert sweep.axes == [RATE_AXIS]  # not time_scale 0.17677669529663687
    labels = axis_labels(sweep, RATE_AXIS)
    assert len(labels) >= 3 and all(len(label.replace(".", "").strip("0")) <= 3 for label in labels), labels  # 3 significant digits
    for scale, rate in zip(sweep.points["time_scale"], sweep.points[RATE_AXIS]):
        assert rate == pytest.approx(report["trace_rate"] / scale, rel=5e-3)
    assert list(points_table(sweep).columns[:2]) == [RATE_AXIS, "status"]


# --- a metric over two axes -----------------------------------------------------------------


def test_the_grid_of_a_metric_is_the_sweep_metric_at_those_axis_values(made):
    sweep = open_sweep(made["main"])
    df, _ = load_sweep(made["main"])
    for overlap in MAIN_AXES["overlap"]:
        grid = metric_grid(sweep, LATENCY, "time_scale", "policy", {"overlap": overlap})
        assert list(grid.index) == MAIN_AXES["policy"] and list(grid.columns) == MAIN_AXES["time_scale"]
        for policy, scale in itertools.product(MAIN_AXES["policy"], MAIN_AXES["time_scale"]):
            assert grid.loc[policy, scale] == _metric(df, LATENCY, policy=policy, time_scale=scale, overlap=overlap)
    # The other axis by default at its first value; averaged over with MEAN.
    assert metric_grid(sweep, LATENCY, "time_scale", "policy").equals(
        metric_grid(sweep, LATENCY, "time_scale", "policy", {"overlap": "on"})
    )
    mean = metric_grid(sweep, THROUGHPUT, "overlap", "time_scale", {"policy": MEAN})
    for scale, overlap in itertools.product(MAIN_AXES["time_scale"], MAIN_AXES["overlap"]):
        both = [_metric(df, THROUGHPUT, policy=p, time_scale=scale, overlap=overlap) for p in MAIN_AXES["policy"]]
        assert mean.loc[scale, overlap] == pytest.approx(sum(both) / 2, rel=1e-12)
    # No second axis: one row, the metric against the first.
    line = metric_grid(sweep, "p90_tpot_ms", "time_scale", None, {"policy": "lpm", "overlap": "off"})
    assert list(line.index) == ["p90_tpot_ms"]
    assert line.iloc[0].tolist() == [_metric(df, "p90_tpot_ms", policy="lpm", time_scale=s, overlap="off") for s in MAIN_AXES["time_scale"]]


def test_heat_map_and_lines_show_the_grid(made):
    sweep = open_sweep(made["main"])
    grid = metric_grid(sweep, LATENCY, "time_scale", "policy")
    (heat,) = charts.sweep_metric_figure(grid, LATENCY, "time_scale", "policy").data
    assert heat.type == "heatmap" and list(heat.x) == MAIN_AXES["time_scale"] and list(heat.y) == MAIN_AXES["policy"]
    assert [list(row) for row in heat.z] == grid.to_numpy().tolist()
    lines = charts.sweep_metric_figure(grid, LATENCY, "time_scale", "policy", "lines").data
    assert [t.name for t in lines] == ["policy=fcfs", "policy=lpm"] and list(lines[1].y) == grid.loc["lpm"].tolist()


def test_a_one_axis_sweep_with_a_none_value_is_a_line(made):
    sweep = open_sweep(made["one"])
    df, _ = load_sweep(made["one"])
    assert sweep.axes == ["kv_tokens"] and axis_labels(sweep, "kv_tokens") == ["none", "40000"]
    line = metric_grid(sweep, "summary_kv_tokens", "kv_tokens")
    assert list(line.columns) == ["none", "40000"]
    assert line.iloc[0].tolist() == df["summary_kv_tokens"].tolist() and line.iloc[0, 1] == 40000
    (trace,) = charts.sweep_metric_figure(line, "summary_kv_tokens", "kv_tokens", None).data
    assert trace.type == "scatter" and list(trace.x) == ["none", "40000"]


# --- the Pareto front -----------------------------------------------------------------------


def _dominated(p: dict, others: list[dict], t: str, lat: str) -> bool:
    return any(q[t] >= p[t] and q[lat] <= p[lat] and (q[t] > p[t] or q[lat] < p[lat]) for q in others)


@pytest.mark.parametrize("throughput,latency", [(THROUGHPUT, LATENCY), ("request_throughput", "p99_e2e_ms"), (THROUGHPUT, "mean_tpot_ms")])
def test_the_pareto_front_is_exactly_the_points_no_other_beats(made, throughput, latency):
    sweep = open_sweep(made["main"])
    df, _ = load_sweep(made["main"])
    rows = df.to_dict("records")
    expected = {r["point"] for r in rows if not _dominated(r, rows, throughput, latency)}
    front = pareto_front(sweep, throughput, latency)
    assert set(front["point"]) == expected
    assert len(front) == len(expected)
    assert front[latency].is_monotonic_increasing and front[throughput].is_monotonic_increasing
    fig = charts.pareto_figure(sweep.complete(), front, throughput, latency)
    assert list(fig.data[0].text) == list(df["point"]) and list(fig.data[1].text) == list(front["point"])
    if (throughput, latency) == (THROUGHPUT, LATENCY):
        assert 0 < len(front) < len(df)  # this sweep has points off the front: the test tells them apart


# --- the What-if page -----------------------------------------------------------------------


def _app(monkeypatch, runs_dir: Path, page: str = "views/whatif.py") -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", "--runs", str(runs_dir)])
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S).run()
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _by_label(widgets, label: str):
    (w,) = [w for w in widgets if w.label == label]
    return w


def _chart_titles(at: AppTest) -> list[str]:
    return [json.loads(el.proto.spec)["layout"]["title"]["text"] for el in at.get("plotly_chart")]


def _chart(at: AppTest, title_start: str) -> list[dict]:
    """The traces of the one chart whose title starts so, arrays decoded."""
    specs = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    (spec,) = [s for s in specs if s["layout"]["title"]["text"].startswith(title_start)]
    return [{k: plotly_array(v) for k, v in trace.items()} for trace in spec["data"]]


def test_whatif_page_opens_a_sweep_table_heat_map_and_pareto_front(monkeypatch, made):
    at = _app(monkeypatch, made["runs"])
    _by_label(at.selectbox, "Sweep").set_value(str(made["main"])).run()
    assert not at.exception and not at.error
    df, _ = load_sweep(made["main"])
    table = at.dataframe[0].value
    assert len(table) == 12 and list(table["point"]) == list(df["point"])
    assert list(table.columns[:3]) == ["policy", "time_scale", "overlap"]
    assert any("12 points over policy (2) × time_scale (3) × overlap (2): 12 complete" in m.value for m in at.markdown)
    assert _chart_titles(at) == ["p90_ttft_ms by time_scale and policy", "Pareto front: output_throughput against p90_ttft_ms"]
    heat = _chart(at, "p90_ttft_ms by")[0]
    assert heat["z"][1][0] == _metric(df, LATENCY, policy="lpm", time_scale="0.5", overlap="on")
    # The Pareto front's table: exactly the non-dominated points.
    rows = df.to_dict("records")
    front = at.dataframe[1].value
    assert set(front["point"]) == {r["point"] for r in rows if not _dominated(r, rows, THROUGHPUT, LATENCY)}
    # Other choices: hold overlap off, lines; no Y axis; another latency.
    _by_label(at.selectbox, "Hold overlap at").set_value("off").run()
    _by_label(at.radio, "Chart").set_value("lines").run()
    lines = _chart(at, "p90_ttft_ms by time_scale, one line per policy")
    assert lines[0]["y"] == [_metric(df, LATENCY, policy="fcfs", time_scale=s, overlap="off") for s in MAIN_AXES["time_scale"]]
    _by_label(at.selectbox, "Y axis").set_value("none").run()
    assert "p90_ttft_ms by time_scale" in _chart_titles(at)
    _by_label(at.selectbox, "Latency (lower is better)").set_value("p99_e2e_ms").run()
    assert "Pareto front: output_throughput against p99_e2e_ms" in _chart_titles(at)
    assert not at.exception


def test_whatif_page_lists_failed_points_with_their_error_and_draws_the_others(monkeypatch, made):
    at = _app(monkeypatch, made["runs"])
    _by_label(at.selectbox, "Sweep").set_value(str(made["failing"])).run()
    table = at.dataframe[0].value.set_index("point")
    assert len(table) == 4 and (table["status"] == "failed").sum() == 2
    assert all("llama-3.1-70b" in e for e in table.loc[table["status"] == "failed", "error"])
    assert any("2 point(s) not complete" in w.value and "model=llama-3.1-70b,overlap=on (failed)" in w.value for w in at.warning)
    drawn = {name for t in _chart(at, "Pareto front") for name in t["text"]}
    assert drawn == {"model=tiny-llama,overlap=on", "model=tiny-llama,overlap=off"}
    assert _chart(at, "p90_ttft_ms by")[0]["y"] == ["tiny-llama"]


def test_whatif_page_shows_an_error_for_a_broken_or_missing_sweep(monkeypatch, made, tmp_path):
    at = _app(monkeypatch, made["runs"])
    _by_label(at.selectbox, "Sweep").set_value(str(made["broken"])).run()
    assert not at.exception
    assert any("does not open" in e.value and "unreadable" in e.value for e in at.error)
    _by_label(at.text_input, "or another sweep folder").set_value(str(tmp_path / "no-such-sweep")).run()
    assert not at.exception
    assert any("does not open" in e.value and "no sweep.parquet" in e.value for e in at.error)
    assert not at.get("plotly_chart")


@pytest.mark.parametrize("where", ["in the runs dir", "elsewhere"])
def test_a_point_link_opens_its_run_on_the_run_page(monkeypatch, made, where):
    sweep_dir = made["main"] if where == "in the runs dir" else made["one"]
    at = _app(monkeypatch, made["runs"])
    _by_label(at.text_input, "or another sweep folder").set_value(str(sweep_dir)).run()
    table = at.dataframe[0].value
    point, link = table["point"].iloc[-1], table["run"].iloc[-1]
    # What following the link does: the Run page with its query.
    url = urlsplit(link)
    assert url.path == "run"
    (name,) = parse_qs(url.query)["run"]
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S)
    at.query_params["run"] = name
    at.run()
    at.switch_page("views/run.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert _by_label(at.selectbox, "Run").value == name
    summary = json.loads((sweep_dir / "points" / point / "run.json").read_text())["summary"]
    assert {m.label: m.value for m in at.metric}["completed"] == f"{summary['completed']:,}"


def test_the_sweep_picker_follows_what_was_typed(monkeypatch, made):
    at = _app(monkeypatch, made["runs"])
    _by_label(at.text_input, "or another sweep folder").set_value(str(made["one"])).run()
    assert _by_label(at.selectbox, "Sweep").value == str(made["one"])  # the picker names the sweep shown
    assert any(str(made["one"]) in m.value for m in at.markdown)
    _by_label(at.selectbox, "Sweep").set_value(str(made["main"])).run()
    assert _by_label(at.text_input, "or another sweep folder").value == ""  # no stale path beside it
    assert any(str(made["main"]) in m.value for m in at.markdown)
    assert str(made["one"]) in _by_label(at.selectbox, "Sweep").options  # still a click away


def test_runs_page_groups_the_points_of_a_sweep_under_it(monkeypatch, made):
    at = _app(monkeypatch, made["runs"], "views/runs.py")
    assert at.dataframe[0].value.empty  # no run outside the sweeps in this folder
    studies = at.dataframe[1].value.set_index("study")
    assert studies.loc["sweep-main", "points"] == studies.loc["sweep-main", "complete"] == 12
    assert studies.loc["group/sweep-failing", "points"] == 2  # its failed points never made a run folder
    assert (studies["kind"] == "sweep").all()
    (toggle,) = at.toggle
    toggle.set_value(True).run()
    listed = at.dataframe[0].value["run"]
    assert len(listed) == 14 and listed.str.startswith(("sweep-main/points/", "group/sweep-failing/points/")).all()
    assert len(at.dataframe) == 1  # the studies' table gives way to their points
