"""testbed calibrate and --profile: a real (small) sweep on this machine's engine, then a sim on it."""

from __future__ import annotations

import gc
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from engine.model_runner import ModelRunner
from scheduler.core.forward_plan import ForwardMode, synthetic_plan
from simulator.costs.profile_cost import ProfileCostModel, ProfileError
from simulator.profiles import profile_fit as pf
from testbed.calibrate import CalibrationConfig, calibrate
from testbed.errors import ConfigError
from testbed.options import ReplayOptions, resolved_options
from testbed.replay import replay

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def _collect_before_each_engine():
    """calibrate builds an engine (its CPU KV pool is 1 GiB) for the forwards and one for each
    replay; one it is done with stays in a reference cycle until Python's cycle collector runs,
    so they piled up (5 GB at the peak, 1.6 GB with a collection before each build). Measures
    nothing differently: the collection runs before the engine exists."""
    build = ModelRunner.__init__

    def collect_then_build(self, *args, **kwargs):
        gc.collect()
        build(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ModelRunner, "__init__", collect_then_build)
        yield
    gc.collect()  # the last one, for the files after this one


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("profile") / "cpu-tiny.json"
    cfg = CalibrationConfig(
        model="tiny-llama",
        reps=1,
        extend_tokens=[16, 128, 512],
        extend_prefixes=[0, 256],
        extend_batches=[1, 2],
        decode_batches=[1, 4, 16],
        decode_lens=[32, 256],
        cpu_trace_requests=30,
        replay_time_scales=[1.0, 3.0],
    )
    phases = []
    calibrate(cfg, out, progress=lambda phase, done, total: phases.append(phase))
    gc.collect()  # its last engine, for the tests after it
    assert {"forward", "replay", "replay overlap"} <= set(phases), "progress is reported for every sweep"
    return out


@pytest.mark.slow
def test_profile_holds_measurements_fit_and_holdout_error(profile_path):
    p = json.loads(profile_path.read_text())
    assert p["format"] == "testbed-profile" and p["model"] == "tiny-llama"
    m = p["measurements"]
    assert len(m["extend"]) == 3 * 2 * 2 and all(x["median_s"] > 0 for x in m["extend"])
    assert any(x["ragged"] for x in m["decode"]) and all(x["median_s"] > 0 for x in m["decode"])
    assert {x["stage"] for x in m["cpu"]} == {"schedule", "launch", "process"}
    # Every forward of the calibration replay, timed in place, with its cost features.
    fw = m["replay_forwards"]
    assert {x["mode"] for x in fw} == {"extend", "decode"} and all(x["seconds"] > 0 for x in fw)
    assert len(fw) == len(m["cpu"]) // 3
    # Two replays (a burst and a load a third as heavy): each prefilled all 30 requests.
    assert sum(x["batch_size"] for x in fw if x["mode"] != "decode") >= 2 * 30
    assert all(x["max_seq_len"] * x["batch_size"] >= x["prefix_tokens"] + x["num_tokens"] for x in fw)
    assert p["holdout"]["replay_decode"]["points"] == sum(x["mode"] == "decode" for x in fw)
    assert set(p["fit"]) == {"extend", "decode", "cpu", "cpu_overlap", "overlap_forward"}
    assert all(v >= 0 for k, v in p["fit"]["extend"].items())  # non-negative: extrapolates sanely
    assert p["holdout"]["extend"]["points"] > 0 and p["holdout"]["extend"]["median_rel_err"] >= 0


@pytest.mark.slow
def test_profile_cost_model_prices_plans_like_the_measurements(profile_path):
    cost = ProfileCostModel.load(profile_path)
    p = json.loads(profile_path.read_text())
    small = synthetic_plan(ForwardMode.EXTEND, [0], [16], with_rows=False)
    big = synthetic_plan(ForwardMode.EXTEND, [256], [512], with_rows=False)
    assert 0 < cost.forward_time(small) < cost.forward_time(big)
    d1 = synthetic_plan(ForwardMode.DECODE, [32], [1], with_rows=False)
    d16 = synthetic_plan(ForwardMode.DECODE, [256] * 16, [1] * 16, with_rows=False)
    assert 0 < cost.forward_time(d1) < cost.forward_time(d16)
    # The fit prices the shapes calibrate measured as measured, taken together: the median ratio over
    # every extend point (one point alone, timed while the machine was busy, has been 8.9x off).
    ratios = []
    for x in p["measurements"]["extend"]:
        b, n, prefix = x["batch_size"], x["num_tokens"], x["prefix_len"]
        plan = synthetic_plan(ForwardMode.EXTEND, [prefix] * b, [n // b] * b, with_rows=False)
        ratios.append(cost.forward_time(plan) / x["median_s"])
    assert len(ratios) >= 5 and 0.5 < statistics.median(ratios) < 2.0, ratios


@pytest.mark.slow
def test_profile_prices_a_mixed_plan_as_its_prefill_and_decodes_in_one_forward(profile_path):
    """--enable-mixed-chunk plans: the extend fit prices the decode rows as one-token
    extends on their contexts: more than the prefill alone, less than both forwards."""
    cost = ProfileCostModel.load(profile_path)
    prefill = synthetic_plan(ForwardMode.EXTEND, [0], [256], with_rows=False)
    decode = synthetic_plan(ForwardMode.DECODE, [255] * 8, [1] * 8, with_rows=False)
    mixed = synthetic_plan(ForwardMode.MIXED, [0] + [255] * 8, [256] + [1] * 8, with_rows=False)
    t = cost.forward_time(mixed)
    assert cost.forward_time(prefill) < t < cost.forward_time(prefill) + cost.forward_time(decode)


@pytest.mark.slow
def test_with_overlap_the_profile_prices_forwards_and_cpu_as_the_overlapped_replay_measured(profile_path):
    p = json.loads(profile_path.read_text())
    ov = p["fit"]["overlap_forward"]
    assert set(ov) == {"extend", "decode"} and all(m["fixed_s"] >= 0 and m["per_req_s"] >= 0 for m in ov.values())
    plain, overlapped = ProfileCostModel.load(profile_path), ProfileCostModel.load(profile_path, overlap=True)
    ext = synthetic_plan(ForwardMode.EXTEND, [256], [512], with_rows=False)
    dec = synthetic_plan(ForwardMode.DECODE, [256] * 4, [1] * 4, with_rows=False)
    for plan, m in ((ext, ov["extend"]), (dec, ov["decode"])):
        assert overlapped.forward_time(plan) == pytest.approx(plain.forward_time(plan) + m["fixed_s"] + m["per_req_s"] * plan.batch_size)
    cpu = p["fit"]["cpu_overlap"]["schedule"]
    assert overlapped.cpu_time("schedule", 4, 4) == pytest.approx(cpu["base_s"] + 4 * cpu["per_req_s"] + 4 * cpu["per_token_s"])


@pytest.mark.slow
def test_sim_with_a_profile_runs_and_records_it(profile_path, tmp_path):
    out = tmp_path / "run"
    result = replay(str(REPO / "traces" / "a.json"), ReplayOptions(model="tiny-llama", profile=str(profile_path), max_requests=40), out=out)
    meta = json.loads((out / "run.json").read_text())
    assert result.status == "complete" and meta["cost_model"].startswith("profile:")
    assert meta["summary"]["kv_tokens"] == json.loads(profile_path.read_text())["engine"]["kv_tokens"]


@pytest.mark.slow
def test_a_profile_of_another_model_is_refused(profile_path, tmp_path):
    with pytest.raises(ConfigError, match="calibrated for tiny-llama"):
        replay(str(REPO / "traces" / "a.json"), ReplayOptions(model="llama-3.1-8b", profile=str(profile_path)), out=tmp_path / "r")


@pytest.mark.slow
def test_a_profile_of_an_older_version_is_refused(profile_path, tmp_path):
    old = json.loads(profile_path.read_text()) | {"version": 1}
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(ProfileError, match="version 1.*testbed calibrate"):
        ProfileCostModel.load(tmp_path / "old.json")


def test_cli_bad_profile_exits_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed.cli",
            "replay",
            str(REPO / "traces" / "a.json"),
            "--model",
            "tiny-llama",
            "--profile",
            str(bad),
            "-q",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 2 and "bad JSON" in proc.stderr and "Traceback" not in proc.stderr


def test_fit_recovers_a_known_cost_and_leaves_out_starved_replay_forwards():
    """Forwards priced by a known roofline-shaped law, grid and replay, plus three replay
    forwards starved 10x by another process: the fit prices the law, not the starvation."""
    from testbed.calibrate_fit import fit_profile

    def dec_t(bs, kv):
        return 1e-3 + 2e-5 * bs + 1e-7 * kv

    def ext_t(tokens):
        return 5e-4 + 1e-5 * tokens

    grid_ext = [{"batch_size": 1, "num_tokens": n, "prefix_len": 0, "median_s": ext_t(n)} for n in (16, 64, 256, 1024)]
    grid_dec = [
        {"batch_size": b, "sum_seq_len": b * s, "max_seq_len": s, "median_s": dec_t(b, b * s)} for b in (1, 4, 16, 64) for s in (64, 512)
    ]
    replay_fw = [
        {
            "mode": "decode",
            "batch_size": b,
            "num_tokens": b,
            "prefix_tokens": b * 200,
            "attention_pairs": b * 201.0,
            "max_seq_len": 201,
            "seconds": dec_t(b, b * 201) * (10 if b in (5, 9, 13) else 1),
        }
        for b in range(1, 40)
    ]
    replay_fw += [
        {
            "mode": "extend",
            "batch_size": 1,
            "num_tokens": n,
            "prefix_tokens": 0,
            "attention_pairs": n * (n + 1) / 2,
            "max_seq_len": n,
            "seconds": ext_t(n),
        }
        for n in (100, 300, 700)
    ]
    cpu = [
        {"stage": st, "num_reqs": b, "num_tokens": b, "seconds": 1e-5 * b} for st in ("schedule", "launch", "process") for b in (1, 2, 4)
    ]
    fitted, errors = fit_profile(grid_ext, grid_dec, cpu, replay_fw)
    assert errors["replay_decode"]["outliers"] == 3 and errors["replay_extend"]["outliers"] == 0
    d = pf.LinearFit.from_dict(pf.DECODE_FEATURES, fitted["decode"])
    for b, s in ((2, 100), (32, 800), (128, 1500)):  # the last is past the measured batches
        assert d.predict(pf.decode_features(b, b * s, s)) == pytest.approx(dec_t(b, b * s), rel=0.02)
    e = pf.LinearFit.from_dict(pf.EXTEND_FEATURES, fitted["extend"])
    assert e.predict(pf.extend_features([0], [2048], fitted["extend"]["knee"])) == pytest.approx(ext_t(2048), rel=0.05)


@pytest.mark.slow
def test_refit_fits_again_from_the_measurements_alone(profile_path, tmp_path):
    original = json.loads(profile_path.read_text())
    broken = original | {"fit": {}, "holdout": {}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(broken))
    proc = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "calibrate", "--refit", "--out", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    again = json.loads(path.read_text())
    assert again["fit"] == original["fit"] and again["measurements"] == original["measurements"]
    (tmp_path / "none.json").write_text(json.dumps({"format": "testbed-profile"}))
    proc = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "calibrate", "--refit", "--out", str(tmp_path / "none.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "no measurements" in proc.stderr and "Traceback" not in proc.stderr


# --- the command ------------------------------------------------------------------------------


@pytest.mark.slow
def test_calibrate_command_prints_the_engine_once_and_writes_a_profile_a_sim_defaults_to(tmp_path, monkeypatch, capsys):
    """`testbed calibrate` with its defaults (a smaller grid, so that the test is quick): the profile goes
    to runs/profiles/, never over the bundled one; its hardware is a spec and its engine's overlap is
    what a default real run here has, which a sim with the profile then takes."""
    import functools

    import testbed.calibrate
    from testbed.cli import main

    bundled = (REPO / "profiles" / "cpu-tiny-llama.json").read_bytes()
    small = functools.partial(
        CalibrationConfig,
        extend_tokens=[16, 128],
        extend_prefixes=[0],
        extend_batches=[1],
        decode_batches=[1, 4],
        decode_lens=[32],
        cpu_trace_requests=20,
    )
    monkeypatch.setattr(testbed.calibrate, "CalibrationConfig", small)
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", "--model", "tiny-llama", "--reps", "1", "-q"]) == 0
    out = capsys.readouterr().out
    assert out.count("real engine:") == 1, out
    cpu_lines = [line for line in out.splitlines() if line.strip().startswith("CPU ")]
    assert len(cpu_lines) == 3 and all(" us a request + " in line and "{" not in line for line in cpu_lines), out
    path = tmp_path / "runs" / "profiles" / "tiny-llama-cpu.json"
    profile = json.loads(path.read_text())
    assert profile["hardware"] == "cpu" and profile["engine"]["overlap"] is False
    assert (REPO / "profiles" / "cpu-tiny-llama.json").read_bytes() == bundled
    opts = resolved_options(ReplayOptions(model="tiny-llama", profile=str(path)))
    assert (opts.overlap, opts.hardware) == (False, "cpu")
    assert resolved_options(ReplayOptions(model="tiny-llama", profile=str(path), overlap=True)).overlap is True


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--hardware", "cpu-2core"], "cpu-2core"),  # a free label is not a spec: one meaning of --hardware
        (["--refit"], "--refit"),
    ],
)
def test_calibrate_refuses_before_measuring(args, needle):
    from cli_helpers import assert_clean_error

    proc = subprocess.run([sys.executable, "-m", "testbed", "calibrate", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert_clean_error(proc, needle)


def test_the_bundled_profile_sims_what_a_default_real_cpu_run_does():
    opts = resolved_options(ReplayOptions(model="tiny-llama", profile=str(REPO / "profiles" / "cpu-tiny-llama.json")))
    real = resolved_options(ReplayOptions(mode="real", device="cpu"))
    assert (opts.overlap, opts.hardware) == (real.overlap, real.hardware) == (False, "cpu")
