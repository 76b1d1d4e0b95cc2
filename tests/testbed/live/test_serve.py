"""testbed serve with tiny-llama on 127.0.0.1, and replay --mode server against it: what a user of
the server sees (the endpoints, the errors, a client going away, Ctrl-C) and that a trace sent
to it finishes as it does in --mode real."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from cli_helpers import assert_clean_error

from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import load_run
from testbed.traces.schema import Trace, TraceRequest

pytestmark = pytest.mark.slow
# tiny-llama named: on a CUDA machine the default model is llama-3.1-8b (benchmarks/gpu_check.sh runs these there).
SERVE = ["--model", "tiny-llama", "--kv-tokens", "20000", "--max-running-requests", "16"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(port: int, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed", "serve", "--port", str(port), *SERVE, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()  # "testbed serve: ... ready in ..." once it listens
    assert line.startswith("testbed serve:"), line + proc.stderr.read()
    return proc


@pytest.fixture(scope="module")
def server():
    port = _port()
    proc = _start(port)
    yield f"http://127.0.0.1:{port}"
    proc.send_signal(signal.SIGINT)
    proc.wait(30)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _post(url: str, body: bytes | dict) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _running(url: str) -> int:
    text = _get(url + "/metrics")[1]
    return int(float(next(line.split()[-1] for line in text.splitlines() if line.startswith("sglang:num_running_reqs"))))


def _eventually(check, within_s: float = 20.0) -> bool:
    deadline = time.time() + within_s
    while not check():
        if time.time() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_the_endpoints_answer_as_an_openai_server_does(server):
    status, text = _get(server + "/v1/models")
    assert status == 200 and json.loads(text)["data"][0]["id"] == "tiny-llama"
    assert _get(server + "/health")[0] == 200
    status, text = _get(server + "/metrics")
    assert status == 200 and "sglang:num_running_reqs" in text and "sglang:token_usage" in text
    status, body = _post(server + "/v1/completions", {"model": "tiny-llama", "prompt": [5, 6, 7, 8], "max_tokens": 5, "ignore_eos": True})
    assert status == 200 and len(body["choices"][0]["token_ids"]) == 5 and body["usage"]["completion_tokens"] == 5
    status, body = _post(server + "/v1/chat/completions", {"messages": [{"role": "user", "content": "5 6 7 8"}], "max_tokens": 3})
    assert status == 200 and body["object"] == "chat.completion" and body["usage"]["completion_tokens"] <= 3


@pytest.mark.parametrize(
    "body, needle",
    [
        (b"{not json", "not JSON"),
        ({"prompt": [], "max_tokens": 2}, "non-empty list of token ids"),
        ({"prompt": [1, 2, 10**9], "max_tokens": 2}, "vocabulary"),
        ({"prompt": [1, 2, 3], "max_tokens": 100000}, "context length is 4096"),
        ({"prompt": "hello", "max_tokens": 2}, "no tokenizer"),
        ({"prompt": [1, 2], "max_tokens": -1}, "max_tokens must be an integer"),
        ({"prompt": [1, 2], "model": "other"}, "not served here"),
    ],
)
def test_a_bad_request_gets_a_400_with_an_openai_error_object(server, body, needle):
    status, answer = _post(server + "/v1/completions", body)
    assert status == 400 and needle in answer["error"]["message"], answer
    assert _get(server + "/health")[0] == 200  # the server lives on


def test_a_client_that_goes_away_frees_its_request(server):
    body = json.dumps({"prompt": list(range(10, 60)), "max_tokens": 3000, "ignore_eos": True, "stream": True}).encode()
    port = int(server.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        got = b""
        while b"data:" not in got:  # the headers, then the first tokens
            chunk = s.recv(4096)
            assert chunk, "the server closed the stream"
            got += chunk
        assert _eventually(lambda: _running(server) == 1), "/metrics never showed the request running"
    assert _eventually(lambda: _running(server) == 0), "the request of a client that went away still runs"


def test_a_trace_sent_to_it_finishes_as_in_real_mode(server, tmp_path):
    reqs = [TraceRequest(0.05 * i, 20 + 7 * i, 8, rid=f"q{i}") for i in range(8)]
    trace = tmp_path / "t.jsonl"
    Trace(reqs).write(trace)
    result = replay(str(trace), ReplayOptions(mode="server", url=server), out=tmp_path / "server")
    run = load_run(tmp_path / "server")
    assert run.status == "complete" and result.summary["completed"] == 8
    assert (run.requests["output_tokens"] == 8).all()
    assert len(run.steps) >= 1 and (run.steps["mode"] == "scrape").all()
    real = replay(
        str(trace), ReplayOptions(mode="real", model="tiny-llama", kv_tokens=20000, max_running_requests=16), out=tmp_path / "real"
    )
    for key in ("mean_ttft_ms", "mean_tpot_ms"):
        s, r = result.summary[key], real.summary[key]
        # The server adds HTTP and streaming to the same engine and scheduler; on this 2-core machine,
        # beside the test's own real replay and other test files, the two land within a factor of a few.
        assert s > 0 and r > 0 and 0.2 < s / r < 5, (key, s, r)


def test_ctrl_c_lets_the_requests_in_flight_finish(tmp_path):
    port = _port()
    proc = _start(port)
    url = f"http://127.0.0.1:{port}/v1/completions"
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 60, "ignore_eos": True}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    import threading

    answers = []
    t = threading.Thread(target=lambda: answers.append(json.loads(urllib.request.urlopen(req, timeout=60).read())))
    t.start()
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    t.join(60)
    assert proc.wait(60) == 0
    assert answers and answers[0]["usage"]["completion_tokens"] == 60


def test_a_port_in_use_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "testbed", "serve", "--port", str(port), *SERVE], capture_output=True, text=True, timeout=120
        )
    assert_clean_error(proc, f"--port {port}", "cannot listen there")


def test_trace_options_are_refused_by_serve():
    proc = subprocess.run([sys.executable, "-m", "testbed", "serve", "--time-scale", "2"], capture_output=True, text=True, timeout=60)
    assert_clean_error(proc, "--time-scale", "not for testbed serve")


def _folder_with_tokenizer(folder) -> None:
    """A model folder (tiny Llama, vocabulary 512) with a word-level tokenizer of 512 words and a chat template."""
    from engine_helpers import save_hf_model
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    save_hf_model("llama", folder)
    words = {f"w{i}": i for i in range(512)}
    tok = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0")
    fast.chat_template = "{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}w3"
    fast.save_pretrained(folder)


def test_text_prompts_where_the_model_folder_has_a_tokenizer(tmp_path):
    folder = tmp_path / "model"
    _folder_with_tokenizer(folder)
    port = _port()
    proc = _start(port, "--model", str(folder))
    try:
        url = f"http://127.0.0.1:{port}"
        name = json.loads(_get(url + "/v1/models")[1])["data"][0]["id"]
        status, body = _post(url + "/v1/completions", {"model": name, "prompt": "w5 w6 w7", "max_tokens": 4, "ignore_eos": True})
        assert status == 200 and body["usage"]["prompt_tokens"] == 3, body
        text = body["choices"][0]["text"]
        assert len(text.split()) == 4 and all(w.startswith("w") for w in text.split()), text  # decoded by the tokenizer
        status, body = _post(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "w9 w10"}], "max_tokens": 2})
        assert status == 200 and body["usage"]["prompt_tokens"] == 5, body  # w1 w9 w10 w2 w3: the template's
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
