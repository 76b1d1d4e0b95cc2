"""replay --prefill-replicas P --decode-replicas D (testbed/pd_replay.py): the run folder of a PD
cluster with either scheduler, a slower link showing in TTFT, and bad input as one line."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import assert_clean_error

from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import load_run

TRACE = "traces/a.json"


@pytest.mark.parametrize("scheduler", ["sglang", "vllm"])
def test_a_pd_run_folder_says_where_each_request_prefilled_and_decoded(tmp_path, scheduler):
    opts = ReplayOptions(prefill_replicas=2, decode_replicas=2, kv_link="rdma", scheduler=scheduler, max_requests=60)
    result = replay(TRACE, opts, out=tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.status == "complete"
    req = run.requests.sort_values("index")
    assert (req["status"] == "finished").all() and (req["output_tokens"] == req["max_new_tokens"]).all()
    assert req["instance"].tolist() == [i % 2 for i in range(60)]  # the prefill instance: round robin
    assert set(req["decode_instance"]) == {2, 3}  # decode instances are numbered after the prefill ones
    # TTFT counts the transfer: the first token comes after the KV has crossed.
    transfer_end = req["kv_transfer_start"] + req["kv_transfer_s"]
    assert (req["first_token"] >= transfer_end - 1e-12).all() and (req["kv_transfer_s"] > 10e-6).all()
    assert (req["kv_transfer_start"] > req["arrival"]).all() and (req["decode_held_s"] == 0).all()
    # Taken in by its decode instance, which reserves its KV before its prefill goes out and crosses.
    assert (req["arrival"] <= req["queued"]).all() and (req["queued"] <= req["kv_transfer_start"]).all()
    steps = run.steps
    assert dict(steps.groupby("instance")["role"].first()) == {0: "prefill", 1: "prefill", 2: "decode", 3: "decode"}
    assert set(steps[steps["role"] == "prefill"]["mode"]) == {"extend"}  # a prefill instance never decodes
    assert np.all(np.diff(steps["schedule_start"].to_numpy()) >= 0)
    cluster = run.meta["cluster"]
    assert (cluster["prefill_replicas"], cluster["decode_replicas"], cluster["kv_link"]["name"]) == (2, 2, "rdma")
    assert cluster["kv_bytes_per_token"] == 131072  # llama-3.1-8b: 2 x 32 layers x 8 KV heads x 128 x 2 bytes
    assert run.meta["options"]["prefill_replicas"] == 2 and run.meta["options"]["kv_link"] == "rdma"
    s = result.summary
    assert [(x["instance"], x["role"], x["requests"]) for x in s["instances"]] == [
        (0, "prefill", 30),
        (1, "prefill", 30),
        (2, "decode", int((req["decode_instance"] == 2).sum())),
        (3, "decode", int((req["decode_instance"] == 3).sum())),
    ]
    assert s["kv_transfer_p50_ms"] == pytest.approx(np.percentile(req["kv_transfer_s"] * 1e3, 50))
    assert s["kv_transfer_p99_ms"] >= s["kv_transfer_p50_ms"] > 0 and s["kv_transfer_mean_ms"] > 0
    assert s["decode_kv_holds"] == 0 and s["load_imbalance"] >= 1.0
    assert s["kv_transferred_gb"] == pytest.approx((req["input_tokens"] * 131072).sum() / 1e9)
    assert s["num_steps"] == len(steps)


def test_a_tight_decode_pool_holds_requests_back_and_the_summary_counts_them(tmp_path):
    """3,000 KV tokens a decode instance: with SGLang's 512 reserved decode tokens a request, a few
    requests at a time; the others wait there, and their prefill with them."""
    opts = ReplayOptions(prefill_replicas=1, decode_replicas=1, kv_tokens=3000, max_requests=40, time_scale=0.25)
    result = replay(TRACE, opts, out=tmp_path / "run")
    req = load_run(tmp_path / "run").requests
    held = req[req["decode_held_s"] > 0]
    assert result.summary["decode_kv_holds"] == len(held) > 10 and (req["status"] == "finished").all()
    assert result.summary["decode_held_mean_ms"] == pytest.approx(held["decode_held_s"].mean() * 1e3)
    # A held request's prefill waits too: its transfer starts after its wait at the decode instance.
    assert (held["kv_transfer_start"] > held["arrival"] + held["decode_held_s"]).all()


def test_a_run_without_pd_records_no_pd_layout(tmp_path):
    replay(TRACE, ReplayOptions(max_requests=5), out=tmp_path / "run")
    meta = load_run(tmp_path / "run").meta
    assert (meta["options"]["prefill_replicas"], meta["options"]["decode_replicas"]) == (None, None)
    assert "cluster" not in meta


def test_a_slower_link_shows_in_ttft(tmp_path):
    """The same requests over NVLink and over 25 Gb/s TCP: every transfer 144x the bytes' time,
    and TTFT later by about the difference (a request joins its decode instance at its next
    schedule, so each one's differs by up to a decode step; here 0.94x on average)."""
    common = dict(prefill_replicas=1, decode_replicas=1, max_requests=30, time_scale=4.0)
    fast = replay(TRACE, ReplayOptions(kv_link="nvlink", **common), out=tmp_path / "nvlink")
    slow = replay(TRACE, ReplayOptions(kv_link="tcp", **common), out=tmp_path / "tcp")
    f, s = (load_run(r.run_dir).requests.sort_values("index") for r in (fast, slow))
    assert (s["kv_transfer_s"] > 50 * f["kv_transfer_s"]).all()
    gain = (s["first_token"] - s["arrival"]) - (f["first_token"] - f["arrival"])
    longer = s["kv_transfer_s"] - f["kv_transfer_s"]
    assert (gain > 0).all() and gain.mean() == pytest.approx(longer.mean(), rel=0.2)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", "replay", TRACE, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--prefill-replicas", "2"], "needs both sides"),
        (["--decode-replicas", "2"], "--decode-replicas 2 without --prefill-replicas"),
        (["--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link", "infiniband"], "--kv-link infiniband"),
        (["--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link", "50,fast"], "numbers"),
        (["--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link", "0,10"], "bandwidth"),
        (["--kv-link", "tcp"], "is for a PD run"),
        (["--prefill-replicas", "1", "--decode-replicas", "1", "--replicas", "2"], "one layout"),
        (["--prefill-replicas", "1", "--decode-replicas", "1", "--concurrency", "4"], "open loop"),
        (["--prefill-replicas", "1", "--decode-replicas", "1", "--mode", "real"], "simulated"),
        (["--prefill-replicas", "0", "--decode-replicas", "1"], "--prefill-replicas"),
    ],
)
def test_bad_pd_options_are_one_line(args, needle):
    assert_clean_error(_cli(*args), needle)
