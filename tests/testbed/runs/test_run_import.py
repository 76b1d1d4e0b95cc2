"""`testbed run import`: real serving runs of other systems as run folders.

Each format is written here as a small file in the exact shape its tool writes (field
names from LLMServingSim's bench/core/recorder.py, vLLM 0.19's vllm/benchmarks/serve.py,
SGLang's python/sglang/bench_serving.py), with times chosen so the expected metrics are
known by hand. The import must give those metrics, a trace.jsonl that replays the same
workload, and a folder that `compare` and the dashboard take; bad files must be one
line naming the file, the line and the field, exit code 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from cli_helpers import assert_clean_error

from testbed.cli import main
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import load_run
from testbed.runs.import_run import import_run
from testbed.runs.importers import detect_import_format
from testbed.traces.formats import load_trace
from testbed.traces.schema import file_sha256

GROUND_TRUTH = Path(__file__).resolve().parents[4] / "shared" / "ground_truth" / "vllm-rtxpro6000-llama-3.1-8b"

# Three requests: (input, output, queued, scheduled, first token, last token), seconds on one clock.
LSS_ROWS = [
    (100, 11, 1000.0, 1000.0, 1000.5, 1001.5),
    (200, 21, 1000.2, 1000.3, 1001.2, 1003.2),
    (50, 5, 1001.0, 1001.1, 1001.3, 1001.7),
]


def _write_lss(folder: Path, rows=LSS_ROWS, meta: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        {
            "request_id": f"bench-{i}",
            "input_toks": i_,
            "output_toks": o,
            "arrival_time": 1.7e9 + q,
            "queued_ts": q,
            "scheduled_ts": s,
            "first_token_ts": f,
            "last_token_ts": last,
        }
        for i, (i_, o, q, s, f, last) in enumerate(rows)
    ]
    path = folder / "requests.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    if meta is not None:
        (folder / "meta.json").write_text(json.dumps(meta))
    return path


LSS_META = {
    "schema_version": 1,
    "model": "meta-llama/Llama-3.1-8B",
    "vllm_version": "0.19.0",
    "engine_kwargs": {"model": "meta-llama/Llama-3.1-8B", "tensor_parallel_size": 1, "max_num_seqs": 128, "max_num_batched_tokens": 2048},
    "kv_cache": {
        "num_gpu_blocks": 1000,
        "block_size": 16,
        "gpu_memory_utilization": 0.9,
        "enable_prefix_caching": True,
        "num_kv_tokens": 16000,
    },
    "hardware": {"device_name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "device_count": 1},
}


def _vllm_bench(**over) -> dict:
    """vllm bench serve --save-result --save-detailed: settings, summary and per-request lists."""
    doc = {
        "date": "20260425-184718",
        "endpoint_type": "vllm",
        "backend": "vllm",
        "label": None,
        "model_id": "meta-llama/Llama-3.1-8B",
        "tokenizer_id": "meta-llama/Llama-3.1-8B",
        "num_prompts": 3,
        "request_rate": 4.0,
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": 3.1,
        "completed": 2,
        "failed": 1,
        "input_lens": [100, 200, 50],
        "output_lens": [4, 3, 0],
        "ttfts": [0.25, 0.5, 0.0],
        "itls": [[0.1, 0.1, 0.1], [0.2, 0.2], []],
        "start_times": [500.0, 500.5, 501.0],
        "generated_texts": ["a b c d", "x y z", ""],
        "errors": ["", "", "Traceback (most recent call last):\nTimeoutError: the server did not answer"],
        "gpu": "H100",  # --metadata gpu=H100
    }
    return doc | over


def _sglang_bench(**over) -> dict:
    doc = {
        "backend": "sglang",
        "dataset_name": "sharegpt",
        "request_rate": float("inf"),
        "max_concurrency": None,
        "duration": 2.0,
        "completed": 2,
        "input_lens": [100, 200],
        "output_lens": [3, 2],
        "ttfts": [0.3, 0.6],
        "itls": [[0.05, 0.05], [0.1]],
        "generated_texts": ["a b c", "x y"],
        "errors": ["", ""],
    }
    return doc | over


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True)


# --- each format ------------------------------------------------------------------------------


def test_llmservingsim_import_gives_its_metrics_and_engine_settings(tmp_path):
    src = _write_lss(tmp_path / "src", meta=LSS_META)
    assert detect_import_format(src) == "llmservingsim"
    res = import_run(src, tmp_path / "run")
    run = load_run(tmp_path / "run")
    s = run.summary
    assert run.status == "complete" and run.meta["mode"] == "imported"
    assert s["completed"] == 3 and s["total_output_tokens"] == 37
    # TTFT = first - queued: 0.5, 1.0, 0.3 s; TPOT = (last - first) / (out - 1): 0.1, 0.1, 0.1 s.
    assert s["mean_ttft_ms"] == pytest.approx(600.0)
    assert s["p50_ttft_ms"] == pytest.approx(500.0)
    assert s["mean_tpot_ms"] == pytest.approx(100.0)
    assert s["mean_e2e_ms"] == pytest.approx((1.5 + 3.0 + 0.7) / 3 * 1000)
    assert s["duration_s"] == pytest.approx(3.2)  # last finish (1003.2) - first arrival (1000.0)
    assert s["mean_itl_ms"] is None and s["cache_hit_rate"] is None  # not in the source: unknown, not zero
    assert s["kv_tokens"] == 16000
    df = run.requests
    assert df["arrival"].tolist() == pytest.approx([0.0, 0.2, 1.0])
    assert df["scheduled"].tolist() == pytest.approx([0.0, 0.3, 1.1])
    assert run.steps.empty and "device_start" in run.steps.columns
    meta = run.meta
    assert meta["model"] == "llama-3.1-8b" and meta["source_model"] == "meta-llama/Llama-3.1-8B"
    assert meta["hardware"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert meta["source"]["format"] == "llmservingsim" and meta["source"]["sha256"] == file_sha256(src)
    assert meta["options"] == {
        "scheduler": "vllm",
        "max_num_seqs": 128,
        "max_num_batched_tokens": 2048,
        "page_size": 16,
        "disable_radix_cache": False,
    }
    assert meta["engine"]["vllm_version"] == "0.19.0"
    assert any("ITL" in m for m in res.missing)
    # The trace beside it: the same arrivals and lengths, in the native format.
    trace = load_trace(res.trace_path)
    assert trace.format == "native" and meta["trace"]["sha256"] == file_sha256(res.trace_path)
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0.0, 0.2, 1.0])
    assert [(r.input_len, r.output_len) for r in trace.requests] == [(100, 11), (200, 21), (50, 5)]


def test_llmservingsim_without_meta_says_so(tmp_path):
    res = import_run(_write_lss(tmp_path / "src"), tmp_path / "run")
    assert any("meta.json" in m for m in res.missing)
    assert load_run(tmp_path / "run").meta["options"] == {"scheduler": "vllm"}


def test_vllm_bench_import_uses_start_times_and_stream_gaps(tmp_path):
    src = tmp_path / "vllm-result.json"
    src.write_text(json.dumps(_vllm_bench()))
    assert detect_import_format(src) == "vllm-bench"
    res = import_run(src, tmp_path / "run")
    run = load_run(tmp_path / "run")
    s, df = run.summary, run.requests
    assert s["completed"] == 2 and s["unfinished"] == 1
    assert df["status"].tolist() == ["finished", "finished", "unfinished"]
    assert "TimeoutError" in df["reason"][2]
    assert s["mean_ttft_ms"] == pytest.approx(375.0)
    assert s["mean_tpot_ms"] == pytest.approx(150.0)  # 0.3/3 and 0.4/2
    assert s["mean_itl_ms"] == pytest.approx(0.7 / 5 * 1000)
    assert list(df["token_times"][0]) == pytest.approx([0.25, 0.35, 0.45, 0.55])
    assert run.meta["engine"]["gpu"] == "H100" and run.meta["engine"]["request_rate"] == 4.0
    assert run.meta["options"] == {"scheduler": "vllm"}
    trace = load_trace(res.trace_path)
    assert [(r.arrival_s, r.input_len, r.output_len) for r in trace.requests] == [(0.0, 100, 4), (0.5, 200, 3)]


def test_vllm_bench_appended_results_take_the_last_or_the_entry(tmp_path):
    src = tmp_path / "appended.json"
    first = _vllm_bench(ttfts=[1.0, 1.0, 0.0])
    src.write_text(json.dumps(first) + "\n" + json.dumps(_vllm_bench()) + "\n")
    import_run(src, tmp_path / "last")
    assert load_run(tmp_path / "last").summary["mean_ttft_ms"] == pytest.approx(375.0)
    import_run(src, tmp_path / "first", entry=1)
    assert load_run(tmp_path / "first").summary["mean_ttft_ms"] == pytest.approx(1000.0)


def test_sglang_bench_import_draws_arrivals_it_lacks(tmp_path):
    src = tmp_path / "sglang.jsonl"
    src.write_text(json.dumps(_sglang_bench()) + "\n")
    assert detect_import_format(src) == "sglang-bench"
    res = import_run(src, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.summary["mean_ttft_ms"] == pytest.approx(450.0)
    assert run.summary["mean_e2e_ms"] == pytest.approx((0.4 + 0.7) / 2 * 1000)
    assert run.requests["arrival"].tolist() == [0.0, 0.0]  # an infinite rate: all at once
    assert any("infinite" in m for m in res.missing)
    assert run.meta["options"] == {"scheduler": "sglang"}
    # A finite rate: Poisson arrivals drawn with the seed, the same for the same seed.
    src.write_text(json.dumps(_sglang_bench(request_rate=2.0)) + "\n")
    a = import_run(src, tmp_path / "a", seed=3)
    b = import_run(src, tmp_path / "b", seed=3)
    ta, tb = load_trace(a.trace_path), load_trace(b.trace_path)
    assert [r.arrival_s for r in ta.requests] == [r.arrival_s for r in tb.requests]
    assert ta.requests[1].arrival_s > 0


# --- the imported run against a sim of its trace ----------------------------------------------


@pytest.mark.slow
def test_imported_run_compares_with_a_sim_of_its_trace_without_force(tmp_path, capsys):
    src = _write_lss(tmp_path / "src", meta=LSS_META)
    assert main(["run", "import", str(src), "--format", "llmservingsim", "--out", str(tmp_path / "real")]) == 0
    out = capsys.readouterr().out
    assert "imported, llmservingsim" in out and "missing:" in out
    trace = tmp_path / "real" / "trace.jsonl"
    opts = dict(scheduler="vllm", model="llama-3.1-8b", max_num_seqs=128, max_num_batched_tokens=2048, page_size=16, kv_tokens=16000)
    replay(str(trace), ReplayOptions(**opts, hardware="cpu"), out=tmp_path / "sim")
    assert main(["compare", str(tmp_path / "real"), str(tmp_path / "sim"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["differences"] == [] and doc["metrics"]["mean_ttft_ms"]["a"] == pytest.approx(600.0)
    # vLLM stamped the run's TTFT from its engine's intake of each request (queued_ts), so the sim's
    # is taken from its own scheduler's intake, not from the arrival.
    assert load_run(tmp_path / "real").meta["ttft_from"] == "queued" and doc["ttft_from"] == "queued"
    sim = load_run(tmp_path / "sim")
    from_intake = ((sim.requests["first_token"] - sim.requests["queued"]) * 1000).mean()
    assert doc["metrics"]["mean_ttft_ms"]["b"] == pytest.approx(from_intake)
    assert from_intake < sim.summary["mean_ttft_ms"]  # on a CPU's speed, the second request came during a step
    assert main(["compare", str(tmp_path / "real"), str(tmp_path / "sim")]) == 0
    assert "from when each run's scheduler took the request in" in capsys.readouterr().out
    # A run of a testbed that recorded no intake cannot be measured so: refused, saying why.
    requests = sim.requests.drop(columns=["queued"])
    requests.to_parquet(tmp_path / "sim" / "requests.parquet")
    assert main(["compare", str(tmp_path / "real"), str(tmp_path / "sim")]) == 2
    assert "records no intake times" in capsys.readouterr().err
    # A sim with other engine settings than the run stated is refused, saying which.
    replay(str(trace), ReplayOptions(**(opts | {"max_num_seqs": 64})), out=tmp_path / "sim64")
    assert main(["compare", str(tmp_path / "real"), str(tmp_path / "sim64")]) == 2
    assert "max_num_seqs: A 128, B 64" in capsys.readouterr().err


def test_imported_run_is_listed_by_the_dashboard_with_its_scheduler(tmp_path):
    from dashboard.runs_index import scan_runs

    src = tmp_path / "r.json"
    src.write_text(json.dumps(_vllm_bench()))
    runs = tmp_path / "runs"
    import_run(src, runs / "real")
    replay(str(runs / "real" / "trace.jsonl"), ReplayOptions(scheduler="vllm"), out=runs / "sim")
    rows = {r["name"]: r for r in scan_runs(runs).to_dict("records")}
    assert rows["real"]["status"] == "complete", rows["real"]["error"]
    assert rows["real"]["mode"] == "imported" and rows["real"]["scheduler"] == "vllm"
    assert rows["real"]["mean_ttft_ms"] == pytest.approx(375.0) and pd.isna(rows["real"]["cache_hit_rate"])
    assert rows["sim"]["scheduler"] == "vllm"


@pytest.mark.skipif(not GROUND_TRUTH.is_dir(), reason="the shared ground truth is not beside the checkout")
def test_the_ground_truth_run_imports_to_its_published_figures(tmp_path):
    """The README of ../shared/ground_truth gives the figures its definitions reproduce."""
    import_run(GROUND_TRUTH / "requests.jsonl", tmp_path / "run")
    s = load_run(tmp_path / "run").summary
    assert s["completed"] == 300
    assert (round(s["mean_ttft_ms"], 1), round(s["p50_ttft_ms"], 1), round(s["p90_ttft_ms"], 1)) == (7097.2, 9442.7, 16852.7)
    assert (round(s["mean_tpot_ms"], 1), round(s["p50_tpot_ms"], 1), round(s["p90_tpot_ms"], 1)) == (32.5, 33.4, 36.5)
    assert round(s["mean_e2e_ms"], 1) == 28200.7


# --- bad files ----------------------------------------------------------------------------------


def _lss_line(**over) -> str:
    row = {
        "request_id": "bench-0",
        "input_toks": 10,
        "output_toks": 3,
        "arrival_time": 1.0,
        "queued_ts": 5.0,
        "scheduled_ts": 5.1,
        "first_token_ts": 5.2,
        "last_token_ts": 5.4,
    }
    return json.dumps(row | over)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, text, needles",
    [
        ("bad-json.jsonl", _lss_line() + "\n{not json\n", ["bad-json.jsonl:2:", "invalid JSON"]),
        (
            "neg-len.jsonl",
            _lss_line() + "\n" + _lss_line(input_toks=-4) + "\n",
            ["neg-len.jsonl:2:", "field 'input_toks'", "integer from 1 to"],
        ),
        (
            "no-first.jsonl",
            _lss_line() + "\n" + json.dumps({"input_toks": 4, "output_toks": 2, "queued_ts": 1.0, "scheduled_ts": 1.1}) + "\n",
            ["no-first.jsonl:2:", "field 'first_token_ts'", "missing"],
        ),
        ("order.jsonl", _lss_line(first_token_ts=4.0) + "\n", ["order.jsonl:1:", "field 'first_token_ts'", "before scheduled_ts"]),
        ("text.jsonl", _lss_line(last_token_ts="late") + "\n", ["text.jsonl:1:", "field 'last_token_ts'", "must be a number"]),
        (
            "no-detail.json",
            json.dumps(
                {
                    k: v
                    for k, v in _vllm_bench().items()
                    if k not in ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors")
                }
            ),
            ["no-detail.json:1:", "field 'start_times'", "--save-detailed"],
        ),
        ("short.json", json.dumps(_vllm_bench(ttfts=[0.1, 0.2])), ["short.json:1:", "field 'ttfts'", "has 2 entries, input_lens has 3"]),
        ("itl.json", json.dumps(_vllm_bench(itls=[[0.1, "x"], [], []])), ["itl.json:1:", "field 'itls[0][1]'", "must be a number"]),
        (
            "sg.jsonl",
            json.dumps({k: v for k, v in _sglang_bench().items() if k not in ("ttfts",)}) + "\n",
            ["sg.jsonl:1:", "field 'ttfts'", "--output-details"],
        ),
        (
            "other.jsonl",
            json.dumps({"arrival": 0.0, "input_len": 5, "output_len": 2}) + "\n",
            ["other.jsonl:1:", "unrecognized run format"],
        ),
        ("empty.jsonl", "\n\n", ["empty.jsonl", "empty file"]),
    ],
)
def test_a_bad_file_is_one_line_naming_file_line_and_field(tmp_path, name, text, needles):
    src = tmp_path / name
    src.write_text(text)
    proc = _cli("run", "import", str(src), "--out", str(tmp_path / "run"))
    assert_clean_error(proc, *needles)
    assert not (tmp_path / "run" / "run.json").exists()


@pytest.mark.slow
def test_forced_format_that_does_not_fit_is_one_line(tmp_path):
    src = tmp_path / "r.jsonl"
    src.write_text(_lss_line() + "\n")
    assert_clean_error(
        _cli("run", "import", str(src), "--format", "vllm-bench", "--out", str(tmp_path / "run")), "r.jsonl:1:", "field 'start_times'"
    )
    assert_clean_error(_cli("run", "import", str(tmp_path / "nope.json"), "--out", str(tmp_path / "run")), "nope.json", "no such file")
