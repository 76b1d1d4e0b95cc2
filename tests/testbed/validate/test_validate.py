"""`testbed validate`, run as a user runs it: real rows of AIConfigurator's silicon_sample.csv,
the real kernel database, the real simulator.

A small points file made of real rows (a vLLM Llama-3.1-70B fp8 point and a vLLM gpt-oss-120b point it
can simulate, and points it cannot: TRT-LLM, disaggregated) gives table rows, the skipped points by
reason and the summary line in the issue's form; --out writes every point as CSV and an HTML page.
Bad input (a missing column, an unknown filter column or value, an unreadable number) is one line
naming it, exit 2.
"""

from __future__ import annotations

import csv
import dataclasses
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error

from testbed.validate.points import MeasuredPoint, bundled_model_of, default_points_path, load_points
from testbed.validate.simulate import PointSimulator

REPO = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "testbed.cli", "validate"]
SUMMARY = re.compile(
    r"^validate: (\d+) points, (\d+) skipped, TTFT median \S+ p90 \S+, TPOT median \S+ p90 \S+ "
    r"\(AIConfigurator: TTFT median \S+ p90 \S+, TPOT median \S+ p90 \S+\)",
    re.M,
)


def _testbed(*args) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def silicon() -> tuple[list[str], list[dict]]:
    with open(default_points_path(), newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _row(rows: list[dict], **match) -> dict:
    return next(r for r in rows if all(r[k] == v for k, v in match.items()))


@pytest.fixture(scope="module")
def small_file(silicon, tmp_path_factory) -> Path:
    header, rows = silicon
    chosen = [
        _row(
            rows,
            system="h200_sxm",
            backend="vllm",
            model_path="meta-llama/Llama-3.1-70B",
            mode="agg",
            isl="1024",
            osl="1024",
            batch_size="8",
            tp_size="2",
        ),
        _row(rows, backend="trtllm", mode="agg"),
        _row(rows, mode="disagg"),
        _row(rows, model_path="openai/gpt-oss-120b", mode="agg", backend="vllm", system="h200_sxm"),
    ]
    path = tmp_path_factory.mktemp("validate") / "points.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(chosen)
    return path


def test_hugging_face_ids_of_a_bundled_architecture_find_its_config():
    assert bundled_model_of("meta-llama/Llama-3.1-8B-Instruct") == "llama-3.1-8b"
    assert bundled_model_of("nvidia/Llama-3.1-8B-Instruct-FP8") == "llama-3.1-8b"
    assert bundled_model_of("Qwen/Qwen3-32B") == "qwen3-32b"
    assert bundled_model_of("moonshotai/Kimi-K2.5") == bundled_model_of("nvidia/Kimi-K2.5-NVFP4") == "kimi-k2.5"
    assert bundled_model_of("Qwen/Qwen3.5-397B-A17B") == "qwen3.5-397b-a17b"
    assert bundled_model_of("zhipuai/GLM-5") == bundled_model_of("zai-org/GLM-5-FP8") == "glm-5"
    # Mixtures of experts ship too, and their points are skipped with the reason.
    assert bundled_model_of("deepseek-ai/DeepSeek-R1") == "deepseek-r1"
    assert bundled_model_of("Qwen/Qwen3-235B-A22B-FP8") == "qwen3-235b-a22b"
    # Dated releases of one architecture: Qwen's 2507 tunes.
    assert bundled_model_of("Qwen/Qwen3-30B-A3B-Instruct-2507") == "qwen3-30b-a3b"
    assert bundled_model_of("Qwen/Qwen3-235B-A22B-Thinking-2507-FP8") == "qwen3-235b-a22b"
    assert bundled_model_of("Qwen/Qwen3-8B-2507-Coder") is None  # another model: no config of it ships


def test_every_row_of_the_default_file_is_read_and_each_skip_says_why():
    points = load_points(default_points_path())
    assert len(points) == 5221
    reasons = [p.skip_reason() for p in points]
    assert all(r is None or ": " in r for r in reasons)
    assert sum(r is None for r in reasons) > 100  # dense vLLM/SGLang agg points it can simulate
    assert any(r and r.startswith("backend trtllm") for r in reasons) and any(r and r.startswith("disagg") for r in reasons)
    # A mixture of experts is simulated from the database's MoE kernels where its experts share the attention's
    # TP: with GQA attention (Qwen3-235B-A22B) and with MLA (DeepSeek-R1, whose rows label its one fp8-block
    # checkpoint fp8 GEMMs beside fp8_block experts), and with sliding windows and sinks (gpt-oss).
    agg = [p for p in points if p.mode == "agg" and p.backend == "sglang"]
    qwen = [p.skip_reason() for p in agg if p.model == "qwen3-235b-a22b"]
    assert qwen and all(r is None for r in qwen)
    deepseek = [p for p in agg if p.model == "deepseek-r1" and p.system == "h200_sxm" and p.tp == 8 and p.attention_dp == 1]
    assert deepseek and all(p.skip_reason() is None and p.quantization == "fp8_block" for p in deepseek)
    # Kimi-K2.5 (moonshotai's id) is the bundled kimi-k2.5: its NVFP4 vLLM points without attention DP pass.
    kimi = [p for p in points if p.model_path == "moonshotai/Kimi-K2.5" and p.mode == "agg" and p.precision == "fp4"]
    assert len(kimi) == 97 and {p.model for p in kimi} == {"kimi-k2.5"}
    assert all(p.skip_reason() is None and p.quantization == "nvfp4" for p in kimi if p.attention_dp == 1)
    # GLM-5 (zhipuai's id, the bundled glm-5): its fp8 rows served zai-org/GLM-5-FP8, one 128x128-block checkpoint.
    glm = [p for p in points if p.model_path == "zhipuai/GLM-5" and p.mode == "agg"]
    assert len(glm) == 86 and all(p.model == "glm-5" and p.skip_reason() is None for p in glm)
    assert {(p.precision, p.quantization) for p in glm} == {("fp8", "fp8_block"), ("fp4", "nvfp4")}
    # gpt-oss-120b's vLLM rows (228, on H100, H200 and B200) say nvfp4 GEMMs and experts; vLLM serves its one
    # checkpoint as stored, MXFP4 experts beside bf16 attention: no --quantization, grouped as mxfp4.
    gpt_oss = [p for p in points if p.mode == "agg" and p.model == "gpt-oss-120b" and p.backend == "vllm"]
    assert len(gpt_oss) == 228 and {(p.gemm_quant, p.moe_quant) for p in gpt_oss} == {("nvfp4", "nvfp4")}
    assert all(p.skip_reason() is None and p.quantization is None and p.group[3] == "mxfp4" for p in gpt_oss)
    # Expert parallelism over the attention's TP GPUs (vLLM's -tp N --enable-expert-parallel) is priced from the
    # database's EP kernels; EP ranks beside attention over other GPUs are skipped with that reason.
    ep = [p for p in points if p.mode == "agg" and p.moe_ep > 1 and p.backend in ("vllm", "sglang") and p.model is not None]
    over_tp = [p for p in ep if (p.moe_tp or 1) * p.moe_ep == p.tp and p.attention_dp == 1]
    assert over_tp and all(p.skip_reason() is None for p in over_tp if p.model == "minimax-m2.5")
    # (the file has no point of fewer expert GPUs than attention ones: one made from a priced one)
    fewer = dataclasses.replace(over_tp[0], moe_tp=1, moe_ep=over_tp[0].tp // 2)
    assert f"{over_tp[0].tp // 2} expert ranks of 1 GPUs beside attention over {over_tp[0].tp} x 1 GPUs" in (fewer.skip_reason() or "")
    # Attention data parallelism is simulated: its rows' experts go over the tp x dp GPUs.
    dp = [p for p in points if p.mode == "agg" and p.attention_dp > 1 and p.backend == "vllm"]
    assert len(dp) == 97 and all(p.skip_reason() is None for p in dp)
    # Dense rows that write 0 for no expert parallelism (Qwen3-32B fp8 on the H100) run without it.
    zero_ep = [p for p in points if p.row.get("moe_ep_size") == "0" and p.mode == "agg" and p.backend == "vllm" and p.model == "qwen3-32b"]
    assert zero_ep and all(p.moe_ep == 1 and p.skip_reason() is None for p in zero_ep)
    # Weight formats are priced from their own GEMM tables: NVFP4 Llama-3.1-70B on B200, block-fp8 Llama-3.1-8B on H200.
    fp4 = [
        p
        for p in points
        if p.system == "b200_sxm" and p.backend == "vllm" and p.model_path == "meta-llama/Llama-3.1-70B" and p.precision == "fp4"
    ]
    block = [
        p
        for p in points
        if p.system == "h200_sxm"
        and p.backend == "sglang"
        and p.gemm_quant == "fp8_block"
        and p.model_path == "meta-llama/Llama-3.1-8B-Instruct"
    ]
    assert len(fp4) == 60 and all(p.skip_reason() is None and p.quantization == "nvfp4" for p in fp4)
    assert len(block) == 46 and all(p.skip_reason() is None and p.group[3] == "fp8_block" for p in block)


@pytest.mark.slow
def test_an_fp8_checkpoint_runs_its_own_fp8_format_whatever_the_row_calls_it():
    points = load_points(default_points_path())
    qwen = [p for p in points if p.model_path == "Qwen/Qwen3-235B-A22B-FP8" and p.mode == "agg" and p.backend in ("vllm", "sglang")]
    # The checkpoint is stored in 128x128-block fp8 (its config.json); vLLM's rows say fp8, SGLang's fp8_block.
    assert {p.backend: p.gemm_quant for p in qwen} == {"vllm": "fp8", "sglang": "fp8_block"}
    assert {p.quantization for p in qwen} == {"fp8_block"}
    # A bf16 checkpoint quantized online keeps the row's format (per-tensor fp8 for vLLM's --quantization fp8).
    online = [p for p in points if p.model_path == "Qwen/Qwen3-32B" and p.precision == "fp8" and p.backend == "vllm"]
    assert online and {p.quantization for p in online} == {"fp8"}


def test_a_small_file_gives_a_group_row_the_skips_and_the_summary_line(small_file, tmp_path):
    proc = _testbed("--points", small_file, "--out", tmp_path / "out", "-q")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    m = SUMMARY.search(out)
    assert m, out
    assert (int(m.group(1)), int(m.group(2))) == (4, 2)  # the summary counts the skipped, never drops them
    assert re.search(r"^h200_sxm\s+vllm\s+meta-llama/Llama-3.1-70B\s+fp8\s+1\s", out, re.M), out
    assert re.search(r"^h200_sxm\s+vllm\s+openai/gpt-oss-120b\s+mxfp4\s+1\s", out, re.M), out
    for skipped in ("skipped 1: backend trtllm", "skipped 1: disagg"):
        assert skipped in out, out
    assert "simulated as the client of: inferencemax 2 points\n" in out, out  # InferenceMAX 1k/1k and 1k/8k points
    with open(tmp_path / "out" / "points.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    simulated = {r["model_path"]: r for r in rows if not r["skipped"]}
    assert set(simulated) == {"meta-llama/Llama-3.1-70B", "openai/gpt-oss-120b"}
    assert float(simulated["openai/gpt-oss-120b"]["sim_tpot_ms"]) > 0
    r = simulated["meta-llama/Llama-3.1-70B"]
    assert float(r["sim_ttft_ms"]) > 0 and float(r["sim_tpot_ms"]) > 0 and r["kernels"].startswith("h200_sxm vllm")
    assert r["harness"] == "inferencemax" and float(r["sim_seconds"]) > 0
    # Its errors are what the table summarises: (sim - measured) / measured.
    assert float(r["sim_tpot_err"]) == pytest.approx(float(r["sim_tpot_ms"]) / float(r["measured_tpot_ms"]) - 1)
    html = (tmp_path / "out" / "validate.html").read_text()
    assert "plotly" in html.lower() and "Absolute relative error by group" in html


@pytest.mark.slow
def test_the_simulated_point_is_near_what_was_measured(small_file):
    """The 70B fp8 point at 8 clients on two H200s: TPOT is decode-bound and priced from the
    database's kernels, so it lands near the measurement. Its TTFT depends on how the clients'
    requests line up (--phase; the validate table gives the figures): bounded here by physics,
    at least one prompt's prefill and at most the whole wave's."""
    p = next(p for p in load_points(small_file) if p.skip_reason() is None)
    sim = PointSimulator()
    try:
        got = sim.simulate(p)
    finally:
        sim.close()
    assert 0.7 < got.tpot_ms / p.tpot_ms < 1.3
    one_prompt = PointSimulator()
    try:
        alone = one_prompt.simulate(MeasuredPoint(**{**p.__dict__, "concurrency": 1})).ttft_ms
    finally:
        one_prompt.close()
    assert alone <= got.ttft_ms <= 1.5 * p.concurrency * alone


@pytest.mark.slow
def test_the_prefix_cache_left_off_for_random_prompts_changes_nothing(small_file):
    """Validate replays points with the prefix cache off (it never hits on prompts that share
    nothing, and costs time): the same figures as with the engines' default, cache on."""
    vllm = next(p for p in load_points(small_file) if p.skip_reason() is None)
    sglang = next(
        p
        for p in load_points(default_points_path())
        if p.skip_reason() is None and p.backend == "sglang" and p.concurrency == 16 and p.tp == 8
    )
    sim = PointSimulator()
    try:
        for p in (vllm, sglang):
            assert sim.simulate(p, prefix_cache=True) == sim.simulate(p, prefix_cache=False)
    finally:
        sim.close()


@pytest.mark.slow
def test_a_measured_request_decodes_beside_the_prefills_of_requests_sent_after_it():
    """A prefill-heavy point (Qwen3-32B on two H100s, vLLM, 4,096 tokens in, 128 out, 64 clients):
    while a measured request decodes, the clients whose requests finish send new ones, and their
    prefills share its steps, as in the benchmark's steady state. Its TPOT is then far above a pure
    decode step's and near the measured 140 ms (76 ms when the measured wave was the last)."""
    p = next(
        p
        for p in load_points(default_points_path())
        if p.system == "h100_sxm"
        and p.backend == "vllm"
        and p.model_path == "Qwen/Qwen3-32B"
        and p.precision == "unstated"
        and (p.isl, p.osl) == (4096, 128)
        and p.concurrency == 64
        and p.tp == 2
    )
    sim = PointSimulator()
    try:
        got = sim.simulate(p)
        decode_only = sim.simulate(MeasuredPoint(**{**p.__dict__, "isl": 1}))
    finally:
        sim.close()
    assert got.tpot_ms > 3 * decode_only.tpot_ms
    assert 0.8 < got.tpot_ms / p.tpot_ms < 1.2


@pytest.mark.slow
def test_a_point_measured_faster_than_its_kernels_allow_is_flagged(silicon, tmp_path):
    """The 70B point on two H200s costs about what its kernels say (its bound lies near, not past, 1);
    the same row with TTFT and TPOT a third of what was measured cannot be run by any schedule of
    those kernels: points.csv gives its kernel_bound, and validate names it on its own line."""
    header, rows = silicon
    real = _row(
        rows,
        system="h200_sxm",
        backend="vllm",
        model_path="meta-llama/Llama-3.1-70B",
        mode="agg",
        isl="1024",
        osl="1024",
        batch_size="8",
        tp_size="2",
    )
    too_fast = {
        **real,
        "id": "too-fast",
        "silicon_ttft_ms": str(float(real["silicon_ttft_ms"]) / 3),
        "silicon_tpot_ms": str(float(real["silicon_tpot_ms"]) / 3),
    }
    points = tmp_path / "points.csv"
    with open(points, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows([real, too_fast])
    done = _testbed("--points", points, "--no-aiconfigurator", "-q", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "out" / "points.csv", newline="") as f:
        bound = {r["id"]: float(r["kernel_bound"]) for r in csv.DictReader(f)}
    assert 0.8 < bound[real["id"]] < 1.1
    assert bound["too-fast"] == pytest.approx(3 * bound[real["id"]], rel=0.01)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("faster than their kernels"))
    assert "1 point was measured" in line and "h200_sxm vllm meta-llama/Llama-3.1-70B fp8 (1)" in line


@pytest.mark.slow
def test_more_clients_wait_longer(small_file):
    """The same point at 4x the clients: every step carries more decodes, so TPOT grows."""
    p = next(p for p in load_points(small_file) if p.skip_reason() is None)
    busier = MeasuredPoint(**{**p.__dict__, "concurrency": 4 * p.concurrency})
    sim = PointSimulator()
    try:
        assert sim.simulate(busier).tpot_ms > sim.simulate(p).tpot_ms
    finally:
        sim.close()


@pytest.mark.slow
def test_bad_points_files_and_filters_are_one_line(small_file, tmp_path):
    header = small_file.read_text().splitlines()[0].split(",")
    no_isl = tmp_path / "no_isl.csv"
    no_isl.write_text(",".join(c for c in header if c != "isl") + "\n")
    assert_clean_error(_testbed("--points", no_isl), str(no_isl), "isl", "missing column")
    lines = small_file.read_text().splitlines()
    col = header.index("silicon_ttft_ms")
    bad = lines[1].split(",")
    bad[col] = "fast"
    bad_file = tmp_path / "bad.csv"
    bad_file.write_text("\n".join([lines[0], ",".join(bad)]) + "\n")
    assert_clean_error(_testbed("--points", bad_file), f"{bad_file}:2", "silicon_ttft_ms", "fast")
    assert_clean_error(_testbed("--points", small_file, "--filter", "colour=red"), "unknown column 'colour'", "system")
    assert_clean_error(_testbed("--points", small_file, "--filter", "system=tpu_v9"), "system=tpu_v9", "h200_sxm")
    assert_clean_error(_testbed("--points", tmp_path / "absent.csv"), "absent.csv")


GROUND_TRUTH = REPO.parent / "shared" / "ground_truth"


@pytest.mark.slow
@pytest.mark.skipif(not (GROUND_TRUTH / "vllm-rtxpro6000-llama-3.1-8b" / "requests.jsonl").is_file(), reason="needs ../shared/ground_truth")
def test_a_real_run_is_replayed_with_its_settings_and_its_errors_printed(tmp_path):
    out_dir = tmp_path / "validate out"  # a space in it: the printed compare command quotes it
    proc = _testbed("--points", "none", "--runs", GROUND_TRUTH, "--out", out_dir)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "vllm-rtxpro6000-llama-3.1-8b: llama-3.1-8b on rtx_pro_6000_server x1" in out
    # The GPU's own attention timings of the run's model lie beside the run: they price decode batches,
    # and decode rows beside a prefill chunk.
    assert "decode and mixed batches' attention from ops-rtxpro6000-llama-3.1-8b/attention.csv" in out
    real = re.search(r"^real \(ms\)\s+([\d,.]+)\s+([\d,.]+)", out, re.M)
    err = re.search(r"^error\s+([+-][\d.]+)%\s+([+-][\d.]+)%\s+([+-][\d.]+)%\s+([+-][\d.]+)%", out, re.M)
    assert real and err, out
    assert float(real.group(1).replace(",", "")) == pytest.approx(7097.2, abs=0.1)  # the run's measured mean TTFT
    # The sim's folder sits beside the imported real one: `testbed compare` takes the pair.
    name = "vllm-rtxpro6000-llama-3.1-8b"
    assert (out_dir / "runs" / name / "real" / "run.json").is_file() and (out_dir / "runs" / name / "sim" / "run.json").is_file()
    # ... and the output says how to see where in the run the error lies; the command runs as printed.
    pair = out_dir / "runs" / name
    hint = f"where in the run: testbed compare {shlex.quote(str(pair / 'real'))} {shlex.quote(str(pair / 'sim'))} --by-arrival 10"
    assert hint in out.splitlines()
    compare = subprocess.run(
        [sys.executable, "-m", "testbed.cli", *shlex.split(hint.split(": ", 1)[1])[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert compare.returncode == 0 and "by arrival: the 300 requests both runs finished" in compare.stdout, compare.stderr
    assert all(abs(float(e)) < 60 for e in err.groups())  # the table's figures are the ones the README quotes
    # TPOT mean: the database's decode attention alone (small KV caches read from the L2) gives -6.5%,
    # and with mixed forwards priced as their parts -9.9%; the queue multiplies it in TTFT (-15.2%).
    assert abs(float(err.group(4))) < 5, out
    assert abs(float(err.group(1))) < 10, out


@pytest.mark.slow
def test_runs_alone_or_nothing(tmp_path):
    assert_clean_error(_testbed("--points", "none"), "--points none", "--runs")
    assert_clean_error(_testbed("--points", "none", "--runs", tmp_path / "absent"), "absent", "no such folder")
    assert_clean_error(_testbed("--points", "none", "--runs", tmp_path), "neither a run folder")


@pytest.mark.slow
def test_ctrl_c_stops_the_workers_and_says_so():
    """A long validate stopped with Ctrl-C: exit 130 and one line, no worker left running, no folder left behind."""
    import signal
    import tempfile
    import time

    tmp = tempfile.mkdtemp(prefix="ctrl-c-")
    proc = subprocess.Popen(
        [*CLI, "--filter", "system=h200_sxm,backend=vllm", "-q", "-j", "2"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, "TMPDIR": tmp},
    )
    time.sleep(8)  # the workers are simulating points
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert children, "no worker processes to stop"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and err.strip() == "testbed: interrupted", err
    time.sleep(0.5)
    assert not [c for c in children if Path(f"/proc/{c}").exists()], "a worker outlived the command"
    assert not list(Path(tmp).iterdir()), "the points' folders were left behind"
