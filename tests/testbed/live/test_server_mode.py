"""replay --mode server against a server that streams at once (testbed/live/instant_server.py): the
run folder a user reads, the faults a server has, and the bad input a user gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error

from testbed.live.instant_server import STATE, BackgroundServer, Faults, make_app
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import load_run
from testbed.runs.metrics import failure_counts
from testbed.traces.formats import load_trace
from testbed.traces.schema import Trace, TraceRequest

TRACE = "traces/a.json"


def _trace(tmp_path, n: int = 12, output_len: int = 6, shared: bool = False) -> str:
    reqs = [
        TraceRequest(0.02 * i, 40 + i, output_len, block_hashes=[1, 2, 3 + i] if shared else None, block_size=16, rid=f"q{i}")
        for i in range(n)
    ]
    path = tmp_path / "t.jsonl"
    Trace(reqs).write(path)
    return str(path)


def test_every_request_streams_its_length_into_a_server_run_folder(tmp_path):
    with BackgroundServer(make_app()) as srv:
        result = replay(TRACE, ReplayOptions(mode="server", url=srv.url, max_requests=40, time_scale=0.05), out=tmp_path / "run")
        bodies = srv.app[STATE].bodies
    run = load_run(tmp_path / "run")
    assert run.meta["mode"] == "server" and run.status == "complete"
    assert run.meta["server"]["url"] == srv.url and run.meta["server"]["model"] == "instant"
    req = run.requests
    assert (req["status"] == "finished").all() and len(req) == 40
    assert (req["output_tokens"] == req["max_new_tokens"]).all()
    assert (req["first_token"] > req["arrival"]).all() and (req["finish"] >= req["first_token"]).all()
    assert result.summary["completed"] == 40 and result.summary["mean_ttft_ms"] > 0
    assert result.summary["send_lag_p50_ms"] >= 0
    # What the server cannot tell the client is unknown, not zero.
    assert result.summary["num_retractions"] is None and result.summary["cache_hit_rate"] is None
    # The requests went as the benchmarks send them: token ids, exactly max_tokens, streamed with usage.
    trace = load_trace(TRACE)
    for body in bodies:
        assert isinstance(body["prompt"], list) and all(isinstance(t, int) for t in body["prompt"])
        assert body["ignore_eos"] is True and body["min_tokens"] == body["max_tokens"] and body["stream"] is True
        assert body["stream_options"]["include_usage"] is True
    assert sorted(len(b["prompt"]) for b in bodies) == sorted(r.input_len for r in trace.requests[:40])
    # The steps table holds the server's /metrics, read once a second (and once at the end).
    assert len(run.steps) >= 1 and set(run.steps["mode"]) == {"scrape"}


def test_requests_that_share_prefix_hashes_share_leading_ids(tmp_path):
    with BackgroundServer(make_app()) as srv:
        replay(_trace(tmp_path, n=4, shared=True), ReplayOptions(mode="server", url=srv.url, max_requests=4), out=tmp_path / "run")
        prompts = [b["prompt"] for b in srv.app[STATE].bodies]
    prompts.sort(key=len)
    # Hash ids 1 and 2 are the first 32 tokens of each (16-token blocks), then their own.
    assert all(p[:32] == prompts[0][:32] for p in prompts)
    assert len({tuple(p[32:40]) for p in prompts}) == 4


def test_a_closed_loop_sends_each_request_when_its_client_is_free(tmp_path):
    with BackgroundServer(make_app()) as srv:
        result = replay(_trace(tmp_path), ReplayOptions(mode="server", url=srv.url, concurrency=3), out=tmp_path / "run")
    req = load_run(tmp_path / "run").requests.sort_values("arrival")
    assert result.summary["completed"] == 12
    assert (req["arrival"].iloc[:3] < 0.05).all()  # the first three at once
    # Each later one after some earlier one finished.
    for _, r in req.iloc[3:].iterrows():
        assert (req["finish"] <= r["arrival"] + 1e-3).sum() >= 1
    assert "send_lag_p50_ms" not in result.summary  # (no trace times to be late against)


@pytest.mark.parametrize(
    "faults, timeout, kind",
    [(Faults(fail_every=3), None, "http 503"), (Faults(reset_every=3), None, "connection"), (Faults(stall_every=3), 1.0, "timeout")],
    ids=["http-error", "reset", "stall"],
)
def test_failed_requests_are_recorded_by_kind_and_the_run_goes_on(tmp_path, faults, timeout, kind):
    with BackgroundServer(make_app(faults)) as srv:
        result = replay(_trace(tmp_path), ReplayOptions(mode="server", url=srv.url, request_timeout=timeout), out=tmp_path / "run")
    run = load_run(tmp_path / "run")
    failed = run.requests[run.requests["reason"].str.startswith("failed: ")]
    assert len(failed) == 4 and result.summary["failed"] == 4 and result.summary["completed"] == 8
    assert (failed["status"] == "unfinished").all()
    kinds = failure_counts(run.requests)
    assert kinds == {kind: 4} or (kind == "connection" and sum(kinds.values()) == 4), kinds
    assert run.status == "complete"


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True, text=True, timeout=timeout)


def test_a_run_where_every_request_failed_exits_2_and_its_folder_says_failed(tmp_path):
    with BackgroundServer(make_app(Faults(fail_every=1))) as srv:
        proc = _cli("replay", _trace(tmp_path, n=3), "--mode", "server", "--url", srv.url, "--out", str(tmp_path / "run"), "-q")
    assert_clean_error(proc, "every request failed", "http 503")
    assert load_run(tmp_path / "run").status == "failed"


def test_no_server_or_not_an_openai_one_is_one_line_before_anything_runs(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _cli("replay", TRACE, "--mode", "server", "--url", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "none"))
    assert_clean_error(proc, "--url", "no server answers there")
    assert not (tmp_path / "none").exists()
    from aiohttp import web

    async def hello(request):
        return web.Response(text="hello")

    plain = web.Application()
    plain.router.add_get("/", hello)
    with BackgroundServer(plain) as srv:
        proc = _cli("replay", TRACE, "--mode", "server", "--url", srv.url)
    assert_clean_error(proc, "not an OpenAI-compatible server")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--mode", "server"], "--mode server needs --url"),
        (["--url", "http://127.0.0.1:1"], "for --mode server"),
        (["--mode", "server", "--url", "127.0.0.1:8000"], "http://"),
    ],
)
def test_server_options_given_wrong_are_one_line(args, needle):
    assert_clean_error(_cli("replay", TRACE, *args), needle)


def test_served_model_must_be_one_the_server_lists(tmp_path):
    with BackgroundServer(make_app()) as srv:
        proc = _cli("replay", TRACE, "--mode", "server", "--url", srv.url, "--served-model", "other")
    assert_clean_error(proc, "--served-model other", "instant")


def test_a_server_run_compares_with_a_sim_of_the_same_trace(tmp_path):
    from testbed.runs.compare import compare_runs, differences

    trace = _trace(tmp_path)
    with BackgroundServer(make_app()) as srv:
        replay(trace, ReplayOptions(mode="server", url=srv.url), out=tmp_path / "server")
    replay(trace, ReplayOptions(mode="sim", model="tiny-llama"), out=tmp_path / "sim")
    a, b = load_run(tmp_path / "server"), load_run(tmp_path / "sim")
    # The server's own settings (its scheduler, pool) are not differences; its model name is.
    assert [d for d in differences(a, b) if not d.startswith("model:")] == []
    rows = {r.name: r for r in compare_runs(a, b)}
    assert rows["completed"].a == rows["completed"].b == 12


VLLM_PYTHON = Path(__file__).resolve().parents[3] / ".conformance-vllm-venv" / "bin" / "python"
_CHECK_WITH_VLLM = """
import json, sys
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
for line in sys.stdin:
    body = json.loads(line)
    kind = ChatCompletionRequest if "messages" in body else CompletionRequest
    req = kind.model_validate(body)
    params = req.to_sampling_params(max_tokens=body["max_tokens"], default_sampling_params={}) if kind is CompletionRequest else None
    print(kind.__name__, req.max_tokens, req.min_tokens, req.ignore_eos, req.stream_options.continuous_usage_stats,
          None if params is None else (params.max_tokens, params.min_tokens, params.ignore_eos))
"""


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="the vLLM oracle's venv (make conformance builds it) is absent")
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_the_request_body_is_one_vllms_own_request_model_takes(tmp_path, endpoint):
    with BackgroundServer(make_app()) as srv:
        replay(_trace(tmp_path, n=3), ReplayOptions(mode="server", url=srv.url, endpoint=endpoint), out=tmp_path / "run")
        bodies = srv.app[STATE].bodies
    lines = "".join(json.dumps(b) + "\n" for b in bodies)
    proc = subprocess.run([str(VLLM_PYTHON), "-c", _CHECK_WITH_VLLM], input=lines, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = proc.stdout.split("\n")[:-1]
    assert len(rows) == 3
    for row in rows:
        kind, max_tokens, min_tokens, ignore_eos, continuous, params = row.split(" ", 5)
        assert kind == ("ChatCompletionRequest" if endpoint == "chat" else "CompletionRequest")
        assert max_tokens == min_tokens == "6" and ignore_eos == "True" and continuous == "True"
        if endpoint == "completions":
            assert params == "(6, 6, True)", params


def test_ctrl_c_leaves_a_readable_folder_marked_incomplete(tmp_path):
    import signal
    import time

    with BackgroundServer(make_app(Faults(stall_every=2))) as srv:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "testbed",
                "replay",
                _trace(tmp_path),
                "--mode",
                "server",
                "--url",
                srv.url,
                "--out",
                str(tmp_path / "run"),
                "-q",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(3)  # every other request stalls: the run cannot end by itself
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    run = load_run(tmp_path / "run")
    assert run.status == "incomplete"
    assert (run.requests["status"] == "finished").sum() == 6  # the ones that did not stall
    assert (run.requests["status"] == "unfinished").sum() == 6
