"""Each dashboard page in streamlit's AppTest, on run folders made here: what a user sees.

The app runs as `testbed dashboard` runs it (dashboard/app.py with `--runs DIR`),
each page reached through st.navigation as a click in the sidebar would.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from dashboard_helpers import BROKEN, INCOMPLETE, NOT_A_RUN, RETRACT, RUNS, make_runs, make_trace, status, summary
from streamlit.testing.v1 import AppTest

from dashboard.runs_index import comparable_pair, loadable, scan_runs
from testbed.runs.by_arrival import by_arrival
from testbed.runs.cli import fmt_metric, fmt_rel_err
from testbed.runs.compare import STATS, compare_runs
from testbed.runs.folder import load_run
from testbed.runs.metrics import LATENCIES

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
TIMEOUT_S = 60  # a cold first run imports plotly and pandas on a shared 2-core machine


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("dash-app")
    return make_runs(d / "runs", make_trace(d / "trace.json"))


def _app(monkeypatch, runs_dir: Path, page: str | None = None) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", "--runs", str(runs_dir)])
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S).run()
    if page is not None:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _chart_titles(at: AppTest) -> list[str]:
    return [json.loads(el.proto.spec)["layout"]["title"]["text"] for el in at.get("plotly_chart")]


def _by_label(widgets, label: str):
    (w,) = [w for w in widgets if w.label == label]
    return w


# --- Runs -----------------------------------------------------------------------------------


def test_runs_page_lists_every_run_with_run_json_numbers(monkeypatch, runs):
    at = _app(monkeypatch, runs["sim-fcfs"].parent)
    assert at.title[0].value == "Runs"
    table = at.dataframe[0].value.set_index("run")
    assert sorted(table.index) == sorted(runs)
    for name in [*RUNS, RETRACT, INCOMPLETE]:
        s, row = summary(runs[name]), table.loc[name]
        assert row["status"] == status(runs[name])
        assert row["completed"] == s["completed"]
        assert row["TTFT mean (ms)"] == s["mean_ttft_ms"] and row["TTFT p99 (ms)"] == s["p99_ttft_ms"]
        assert row["TPOT mean (ms)"] == s["mean_tpot_ms"] and row["TPOT p99 (ms)"] == s["p99_tpot_ms"]
        assert row["req/s"] == s["request_throughput"] and row["output tok/s"] == s["output_throughput"]
    assert table.loc["sim-lpm", "policy"] == "lpm" and table.loc["sim-fcfs", "mode"] == "sim"
    assert not table.loc["sim-no-overlap", "overlap"] and table.loc["sim-fcfs", "overlap"]


def test_runs_page_shows_broken_folders_and_incomplete_runs(monkeypatch, runs):
    at = _app(monkeypatch, runs["sim-fcfs"].parent)
    errors = [e.value for e in at.error]
    assert any(BROKEN in e and "bad JSON" in e for e in errors)
    assert any(NOT_A_RUN in e and "not a run folder" in e for e in errors)
    assert any(INCOMPLETE in w.value and "incomplete" in w.value for w in at.warning)
    table = at.dataframe[0].value.set_index("run")
    assert table.loc[BROKEN, "status"] == "error" and "bad JSON" in table.loc[BROKEN, "error"]
    assert table.loc[INCOMPLETE, "status"] == "incomplete"


def test_runs_page_filters(monkeypatch, runs):
    at = _app(monkeypatch, runs["sim-fcfs"].parent)
    _by_label(at.text_input, "Filter").set_value("lpm").run()
    assert list(at.dataframe[0].value["run"]) == ["sim-lpm"]
    _by_label(at.text_input, "Filter").set_value("").run()
    _by_label(at.multiselect, "Status").set_value(["incomplete"]).run()
    assert list(at.dataframe[0].value["run"]) == [INCOMPLETE]


def test_runs_page_opens_and_compares_the_selected_rows(monkeypatch, runs):
    at = _app(monkeypatch, runs["sim-fcfs"].parent)
    names = list(at.dataframe[0].value["run"])
    pick = [names.index("sim-lpm"), names.index("sim-no-overlap")]
    # What clicking the rows' checkboxes does (AppTest cannot click inside a data grid).
    at.session_state["runs_table"] = {"selection": {"rows": pick, "columns": [], "cells": []}}
    at.run()
    _by_label(at.button, "Compare selected").click().run()
    assert at.title[0].value == "Compare"
    assert _by_label(at.multiselect, "Runs (the first is the reference A)").value == ["sim-lpm", "sim-no-overlap"]
    at.switch_page("views/runs.py").run()
    at.session_state["runs_table"] = {"selection": {"rows": [names.index(RETRACT)], "columns": [], "cells": []}}
    at.run()
    _by_label(at.button, "Open in Run").click().run()
    assert at.title[0].value == "Run" and _by_label(at.selectbox, "Run").value == RETRACT


def test_runs_page_on_an_empty_dir(monkeypatch, tmp_path):
    at = _app(monkeypatch, tmp_path)
    assert "No run folders" in at.info[0].value


# --- Run ------------------------------------------------------------------------------------


def test_run_page_shows_the_run_in_depth(monkeypatch, runs):
    at = _app(monkeypatch, runs["sim-fcfs"].parent, "views/run.py")
    _by_label(at.selectbox, "Run").set_value(RETRACT).run()
    s = summary(runs[RETRACT])
    percentiles = at.dataframe[0].value
    for metric in LATENCIES:
        for stat in STATS:
            assert percentiles.loc[f"{metric.upper()} (ms)", stat] == s[f"{stat}_{metric}_ms"]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["completed"] == f"{s['completed']:,}" and metrics["retractions"] == str(s["num_retractions"])
    assert _chart_titles(at) == [
        "Latency CDFs",
        "Throughput and queues over time",
        "Batch composition",
        f"KV cache (pool {s['kv_tokens']:,} tokens)",
        "Retractions",
        "Step timeline: CPU and device",
    ]
    (download,) = at.get("download_button")
    assert "Perfetto" in download.label and f"{s['num_steps']:,} steps" in download.help


def test_run_page_timeline_window_and_overlap(monkeypatch, runs):
    at = _app(monkeypatch, runs["sim-fcfs"].parent, "views/run.py")
    _by_label(at.selectbox, "Run").set_value("sim-fcfs").run()
    _by_label(at.selectbox, "Steps shown").set_value(20).run()
    _by_label(at.slider, "First step").set_value(101).run()
    (timeline,) = [json.loads(el.proto.spec) for el in at.get("plotly_chart") if "timeline" in el.proto.spec]
    steps = load_run(runs["sim-fcfs"]).steps
    schedule = next(t for t in timeline["data"] if t["name"] == "schedule")
    assert len(schedule["base"]) == 20
    assert schedule["base"][0] == pytest.approx(steps["schedule_start"].iloc[100] * 1000)
    assert any("Overlap on" in c.value for c in at.caption)


def test_run_page_keeps_its_run_across_page_switches(monkeypatch, runs):
    at = _app(monkeypatch, runs["sim-fcfs"].parent, "views/run.py")
    _by_label(at.selectbox, "Run").set_value("sim-lpm").run()
    at.switch_page("views/compare.py").run()
    at.switch_page("views/run.py").run()
    assert _by_label(at.selectbox, "Run").value == "sim-lpm"


def test_run_page_without_retractions_draws_no_empty_retraction_chart(monkeypatch, runs):
    at = _app(monkeypatch, runs["sim-fcfs"].parent, "views/run.py")
    _by_label(at.selectbox, "Run").set_value("sim-fcfs").run()
    assert summary(runs["sim-fcfs"])["num_retractions"] == 0
    assert "Retractions" not in _chart_titles(at)
    assert any("No request was retracted" in c.value for c in at.caption)


def test_run_page_marks_an_incomplete_run(monkeypatch, runs):
    at = _app(monkeypatch, runs["sim-fcfs"].parent, "views/run.py")
    _by_label(at.selectbox, "Run").set_value(INCOMPLETE).run()
    assert any("incomplete" in w.value for w in at.warning)
    assert {m.label: m.value for m in at.metric}["completed"] == str(summary(runs[INCOMPLETE])["completed"])


# --- Compare --------------------------------------------------------------------------------


def test_compare_page_overlays_runs_with_testbed_compare_errors(monkeypatch, runs):
    at = _app(monkeypatch, runs["sim-fcfs"].parent, "views/compare.py")
    _by_label(at.multiselect, "Runs (the first is the reference A)").set_value(["sim-fcfs", "sim-no-overlap", "sim-lpm"]).run()
    table = at.dataframe[0].value
    a = load_run(runs["sim-fcfs"])
    for name in ("sim-no-overlap", "sim-lpm"):
        rows = compare_runs(a, load_run(runs[name]))
        assert table[f"rel. err {name}"].tolist() == [fmt_rel_err(r.rel_err) for r in rows]
        # As `testbed compare` prints them: 1,654.4, 44.70%, 300.
        assert table[name].tolist() == [fmt_metric(r.b, percent=r.name == "cache_hit_rate") for r in rows]
    assert table["sim-fcfs"].tolist() == [fmt_metric(r.a, percent=r.name == "cache_hit_rate") for r in rows]
    assert table.loc[table["metric"] == "cache hit rate", "sim-fcfs"].item().endswith("%")
    assert "." not in table.loc[table["metric"] == "completed requests", "sim-fcfs"].item()
    assert _chart_titles(at) == ["Error by arrival group", "Latency CDFs", "Latency percentiles"]
    # Different options are compared anyway, and said.
    warnings = [w.value for w in at.warning]
    assert any("sim-lpm" in w and "policy: A fcfs, B lpm" in w for w in warnings)
    assert any("sim-no-overlap" in w and "overlap: A True, B False" in w for w in warnings)
    assert any("rel. err" in c.value for c in at.code)  # the CLI's own table


def test_compare_page_shows_the_error_by_arrival_group(monkeypatch, runs):
    at = _app(monkeypatch, runs["sim-fcfs"].parent, "views/compare.py")
    _by_label(at.multiselect, "Runs (the first is the reference A)").set_value(["sim-fcfs", "sim-no-overlap"]).run()
    _by_label(at.number_input, "Groups of consecutive arrivals").set_value(4).run()
    assert not at.exception, [e.value for e in at.exception]
    (chart,) = [
        json.loads(el.proto.spec) for el in at.get("plotly_chart") if "arrival" in json.loads(el.proto.spec)["layout"]["title"]["text"]
    ]
    ttft, tpot = chart["data"]
    groups = by_arrival(load_run(runs["sim-fcfs"]), load_run(runs["sim-no-overlap"]), 4, "arrival")
    assert len(ttft["x"]) == 4 and ttft["x"] == [f"{g.first}-{g.last}" for g in groups]
    assert ttft["y"] == pytest.approx([g.ttft_err * 100 for g in groups])
    assert tpot["y"] == pytest.approx([g.tpot_err * 100 for g in groups])
    assert any(c.value.startswith("by arrival:") and "in 4 groups" in c.value for c in at.code)


def test_compare_page_opens_on_two_complete_runs_of_one_workload(monkeypatch, runs):
    at = _app(monkeypatch, runs["sim-fcfs"].parent, "views/compare.py")
    chosen = _by_label(at.multiselect, "Runs (the first is the reference A)").value
    assert chosen == comparable_pair(loadable(scan_runs(runs["sim-fcfs"].parent)))
    assert all(status(runs[name]) == "complete" for name in chosen) and INCOMPLETE not in chosen


@pytest.mark.slow
def test_compare_page_asks_when_no_two_runs_share_a_trace(monkeypatch, tmp_path):
    """Two runs of different traces compare nothing: the page picks none and says why."""
    from testbed.options import ReplayOptions
    from testbed.replay import replay

    for name, arrival_gap in (("a", 0.1), ("b", 0.2)):
        trace = tmp_path / f"{name}.jsonl"
        trace.write_text("".join(f'{{"arrival": {i * arrival_gap}, "input_len": 50, "output_len": 5}}\n' for i in range(5)))
        replay(str(trace), ReplayOptions(), out=tmp_path / "runs" / name)
    at = _app(monkeypatch, tmp_path / "runs", "views/compare.py")
    assert _by_label(at.multiselect, "Runs (the first is the reference A)").value == []
    assert any("No two runs here replayed the same trace" in i.value for i in at.info)
    assert not at.dataframe  # no table of two unrelated runs


# --- tables as the CLI prints numbers ----------------------------------------------------------


def _formats(element) -> dict[str, str]:
    """Column -> the number format the browser applies (what AppTest can see of it)."""
    config = json.loads(element.proto.columns)
    return {name: c.get("type_config", {}).get("format") for name, c in config.items()}


def test_tables_show_thousands_separators_and_percentages(monkeypatch, runs):
    at = _app(monkeypatch, runs["sim-fcfs"].parent)
    f = _formats(at.dataframe[0])
    assert f["TTFT mean (ms)"] == f["TPOT p99 (ms)"] == "%,.2f" and f["output tok/s"] == "%,.0f"
    assert f["KV tokens"] == f["completed"] == "%,d" and f["cache hit rate"] == "percent"
    at.switch_page("views/run.py").run()
    assert set(_formats(at.dataframe[0]).values()) == {"%,.2f"}


# --- What-if --------------------------------------------------------------------------------


@pytest.mark.slow
def test_whatif_page_runs_sims_that_land_as_run_folders(monkeypatch, tmp_path, runs):
    runs_dir = tmp_path / "runs"  # starts empty: the page makes it
    trace = runs["sim-fcfs"].parent.parent / "trace.json"
    at = _app(monkeypatch, runs_dir, "views/whatif.py")
    _by_label(at.text_input, "or another trace file").set_value(str(trace))
    _by_label(at.number_input, "Max requests (0: all)").set_value(20)
    _by_label(at.multiselect, "Policy").set_value(["fcfs", "lpm"])
    _by_label(at.text_input, "Chunk size (tokens)").set_value("8192, 64").run()
    assert not at.error
    (button,) = [b for b in at.button if b.label.startswith("Run ")]
    assert button.label == "Run 4 simulations"
    button.click().run()
    assert not at.exception and not at.error
    made = sorted(p for p in runs_dir.iterdir() if p.name.startswith("whatif-trace-"))
    assert len(made) == 4
    assert all(status(p) == "complete" and summary(p)["completed"] == 20 for p in made)
    results = at.dataframe[0].value
    assert results["what-if"].tolist() == ["fcfs, chunk 8192", "fcfs, chunk 64", "lpm, chunk 8192", "lpm, chunk 64"]
    assert sorted(results["run"]) == [p.name for p in made]
    assert results["TTFT mean (ms)"].tolist() == [summary(runs_dir / n)["mean_ttft_ms"] for n in results["run"]]
    assert _chart_titles(at) == ["Latency CDFs", "Latency percentiles"]
    # The new runs are runs like any other: the Runs page lists them.
    at.switch_page("views/runs.py").run()
    assert sorted(at.dataframe[0].value["run"]) == [p.name for p in made]


@pytest.mark.slow
def test_whatif_page_runs_both_schedulers_and_says_what_it_skips(monkeypatch, tmp_path, runs):
    runs_dir = tmp_path / "runs"
    trace = runs["sim-fcfs"].parent.parent / "trace.json"
    at = _app(monkeypatch, runs_dir, "views/whatif.py")
    _by_label(at.text_input, "or another trace file").set_value(str(trace))
    _by_label(at.number_input, "Max requests (0: all)").set_value(20)
    _by_label(at.multiselect, "Policy").set_value(["fcfs", "lpm"])
    _by_label(at.multiselect, "Scheduler").set_value(["sglang", "vllm"]).run()
    assert not at.error
    assert [i.value for i in at.info] == [
        "skipped lpm, vllm: --policy lpm is SGLang's; --scheduler vllm orders its queue by fcfs or priority"
    ]
    (button,) = [b for b in at.button if b.label.startswith("Run ")]
    assert button.label == "Run 3 simulations"
    button.click().run()
    assert not at.exception and not at.error
    assert at.dataframe[0].value["what-if"].tolist() == ["fcfs, sglang", "fcfs, vllm", "lpm, sglang"]
    made = sorted(p for p in runs_dir.iterdir() if p.name.startswith("whatif-trace-"))
    assert sorted(json.loads((p / "run.json").read_text())["options"]["scheduler"] for p in made) == ["sglang", "sglang", "vllm"]


def test_whatif_page_refuses_what_cannot_run(monkeypatch, runs):
    at = _app(monkeypatch, runs["sim-fcfs"].parent, "views/whatif.py")
    _by_label(at.text_input, "Load scale").set_value("1, fast").run()
    assert any("'fast'" in e.value for e in at.error)
    (button,) = [b for b in at.button if b.label.startswith("Run ")]
    assert button.disabled


# --- an imported run (another engine's: no steps) -------------------------------------------


def test_imported_run_opens_on_the_run_and_compare_pages(monkeypatch, tmp_path):
    from testbed.options import ReplayOptions
    from testbed.replay import replay
    from testbed.runs.import_run import import_run

    rows = [(80 + 10 * i, 8 + i, 0.2 * i, 0.2 * i + 0.01, 0.2 * i + 0.1, 0.2 * i + 0.1 + 0.02 * (7 + i)) for i in range(12)]
    src = tmp_path / "requests.jsonl"
    keys = ("input_toks", "output_toks", "queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
    src.write_text("".join(json.dumps(dict(zip(keys, r))) + "\n" for r in rows))
    runs_dir = tmp_path / "runs"
    import_run(src, runs_dir / "real")
    replay(str(runs_dir / "real" / "trace.jsonl"), ReplayOptions(scheduler="vllm"), out=runs_dir / "sim")
    at = _app(monkeypatch, runs_dir, "views/run.py")
    _by_label(at.selectbox, "Run").set_value("real").run()
    assert not at.exception, [e.value for e in at.exception]
    assert {m.label: m.value for m in at.metric}["completed"] == "12"
    assert at.dataframe[0].value.loc["TTFT (ms)", "mean"] == pytest.approx(summary(runs_dir / "real")["mean_ttft_ms"])
    at.switch_page("views/compare.py").run()
    _by_label(at.multiselect, "Runs (the first is the reference A)").set_value(["real", "sim"]).run()
    assert not at.exception and not [w for w in at.warning if "differ" in w.value]
    assert "rel. err sim" in at.dataframe[0].value.columns
    # The imported run's TTFT runs from vLLM's intake of each request, and the page says both are measured so.
    assert any("took the request in (vLLM's queued_ts)" in c.value for c in at.caption)
