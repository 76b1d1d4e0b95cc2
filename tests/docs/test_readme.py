"""Every command of README.md's ```bash blocks runs as written, in README order, in a fresh folder.

A new user copies them one after the other; so does this test (fast ones as written, slow
ones with fewer requests, a few skipped with the reason below). A README command that
breaks fails it, and so does an entry below that no longer matches a README command.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from engine_helpers import save_hf_model

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
LINKED = ("traces", "profiles", "benchmarks", "ground_truth")  # what the commands read from the repository


@dataclass(frozen=True)
class Way:
    """How the test runs a README command: as written plus `append`, with `replace` applied; or
    not at all, for the reason `skip`."""

    append: tuple[str, ...] = ()
    replace: tuple[tuple[str, str], ...] = ()
    skip: str | None = None


FEWER = ("--max-requests", "4")  # a real run of the example trace on 2 CPU cores: ~8 s to start, ~2 s a request
# README command (as written, continuation lines joined, comment dropped) -> how it runs here.
WAYS: dict[str, Way] = {
    "make demo": Way(skip="installs the package into .venv, where this suite already runs; its replay is the next command"),
    "make test": Way(skip="runs this suite"),
    "testbed replay ../shared/traces/mooncake/conversation_trace.jsonl --policy lpm --time-scale 4": Way(append=("--max-requests", "500")),
    "testbed replay traces/a.json --mode real": Way(append=("--max-requests", "2")),
    "testbed replay traces/a.json --mode real --model /path/to/hf-folder": Way(
        append=("--max-requests", "2"), replace=(("/path/to/hf-folder", "{hf}"),)
    ),
    "testbed replay traces/a.json --mode real --model qwen2.5-0.5b --load-format dummy --kv-tokens 20000 --max-requests 2": Way(
        skip="a 0.5B model in float32 on the CPU: over a minute; tests/engine/test_engine_replay.py runs a bundled config with dummy weights"
    ),
    "testbed calibrate --model tiny-llama --hardware cpu": Way(
        skip="a minute or two of real measurements; tests/testbed/test_calibrate.py runs the command on a smaller grid. The bundled "
        "profile stands in at the path it writes, for the commands after it"
    ),
    # The calibrate -> sim -> compare recipe, with fewer requests on both sides (compare needs the same options).
    "testbed replay traces/a.json --mode sim --model tiny-llama --profile runs/profiles/tiny-llama-cpu.json --out runs/a-sim": Way(
        append=FEWER
    ),
    "testbed replay traces/a.json --mode real --out runs/a-real": Way(append=FEWER),
    "testbed dashboard": Way(append=("--port", "{port}")),
    "testbed dashboard --runs runs --port 8600": Way(replace=(("8600", "{port}"),)),
    "testbed sweep traces/a.json --grid policy=fcfs,lpm --grid chunked-prefill-size=256,8192 --grid kv-tokens=8000,none "
    "--grid time-scale=0.1,0.5 --out runs/sweep-a": Way(append=FEWER),
    "testbed sweep traces/a.json --grid policy=fcfs,lpm --grid chunked-prefill-size=256,8192 --grid kv-tokens=8000,none "
    "--grid time-scale=0.1,0.5 --out runs/sweep-a --resume": Way(append=FEWER),
    "testbed capacity traces/a.json --slo p90_ttft_ms=500 --slo p90_tpot_ms=50": Way(append=FEWER),
    "testbed capacity traces/a.json --slo p90_ttft_ms=200 --grid policy=fcfs,lpm --grid overlap=on,off": Way(append=FEWER),
    # Each replay once, not three times (the median of one); --repeat 1 as gpu_profile.py below: 16 s -> 6 s.
    ".venv/bin/python benchmarks/sim_speed.py": Way(append=("--max-requests", "300", "--repeat", "1")),
    ".venv/bin/python benchmarks/sim_breakdown.py": Way(append=("--max-requests", "300")),
    # A pool for its 2 requests of at most 32 tokens, not the default 1 GiB for each of its two engines
    # (2.7 GB at the peak, 0.6 GB so).
    ".venv/bin/python benchmarks/engine_throughput.py": Way(append=("-n", "2", "--lo", "8", "--hi", "16", "--kv-tokens", "4096")),
    ".venv/bin/python benchmarks/fidelity.py": Way(skip="about 12 minutes of real runs and calibration"),
    ".venv/bin/python benchmarks/sweep_speed.py": Way(append=("--max-requests", "30", "--workers", "1")),
    "testbed replay traces/a.json --mode real --scheduler vllm": Way(append=FEWER),
    "pip install -e '.[aiconfigurator]'": Way(skip="installs into the environment this suite runs in; the test extra includes it"),
    # Writes to runs/ here: as written it makes the bundled profile again (the same tables, a new date).
    "testbed calibrate --source aiconfigurator --system h100_sxm --backend sglang --model llama-3.1-8b --tp 1 "
    "--out profiles/h100_sxm-sglang-llama-3.1-8b-tp1.json": Way(replace=(("--out profiles/", "--out runs/"),)),
    ".venv/bin/python benchmarks/gpu_profile.py": Way(append=("--max-requests", "200", "--repeat", "1")),
    # The whole default file takes minutes on 2 cores: one group of it here (tests/testbed/validate/test_validate.py checks the rest).
    "testbed validate": Way(append=("--filter", "system=h100_sxm,backend=sglang,tp_size=8,isl=1024")),
    "testbed validate --filter system=h200_sxm,backend=vllm --out runs/validate": Way(
        replace=(("backend=vllm", "backend=vllm,model_path=nvidia/Llama-3.1-8B-Instruct-FP8"),)
    ),
    "testbed validate --points none --runs ../shared/ground_truth": Way(),
    # testbed serve runs in the background (as the README's "in another terminal") for the commands after it.
    "testbed serve --port 8000": Way(replace=(("8000", "{serve_port}"),)),
    "testbed replay traces/a.json --mode server --url http://127.0.0.1:8000 --out runs/a-server": Way(
        append=FEWER, replace=(("8000", "{serve_port}"),)
    ),
    "testbed replay traces/a.json --mode server --url http://my-vllm-host:8000 --concurrency 16 --out runs/a-vllm": Way(
        skip="needs a vLLM server (tests/testbed/live/ check the client against testbed serve and a stub server)"
    ),
    # Two rates for a second each against the instant server only (testbed serve's own run is the README's above).
    ".venv/bin/python benchmarks/server_send_lag.py": Way(append=("--seconds", "1", "--rates", "10,100", "--no-serve")),
    "bash benchmarks/gpu_check.sh": Way(
        skip="a CUDA machine's checks (docs/gpu-check.md); on a CPU it would repeat engine tests this suite runs"
    ),
    # SGLang's oracle lives in its own venv (SGLang's wheel, ~3 min to build): CI runs `make conformance`
    # before this suite (.ci/run); tests/scheduler/sglang/test_sglang_rules.py states the rules it found as our own tests.
    "make conformance": Way(skip="CI runs it before this suite, in its own venv (.ci/run)"),
    'make conformance CONFORMANCE_ARGS="--seed 1 --scenarios 3000"': Way(
        skip="3,000 scenarios on each oracle: about 5 minutes; CI runs the 500 of make conformance"
    ),
    ".conformance-venv/bin/python -m conformance --list-expected": Way(skip="needs .conformance-venv, which make conformance builds"),
}
# What the command's output must show beyond exit code 0 (the command as written -> text).
EXPECT = {
    "testbed compare runs/a-real runs/a-sim": "rel. err",
    # The figure the README states beside the import block (TTFT mean; the others come with it).
    "testbed compare runs/pro6000-real runs/pro6000-sim --by-arrival 10": "-7.0%",
    "testbed sweep traces/a.json --grid policy=fcfs,lpm --grid chunked-prefill-size=256,8192 --grid kv-tokens=8000,none "
    "--grid time-scale=0.1,0.5 --out runs/sweep-a --resume": "16 complete (16 resumed), 0 failed",
}


def readme_commands() -> list[str]:
    """The commands of README.md's bash blocks, in order: continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S):
        for line in re.sub(r"\\\n\s*", "", block).splitlines():
            command = re.split(r"\s#", line, maxsplit=1)[0].strip()
            if command:
                commands.append(" ".join(command.split()))
    return commands


def test_every_way_of_running_is_for_a_readme_command():
    commands = readme_commands()
    assert len(commands) >= 20, commands
    stale = [c for c in [*WAYS, *EXPECT] if c not in commands]
    assert not stale, f"not README commands (any more): {stale}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run_dashboard(args: list[str], cwd: Path, env: dict, port: int) -> None:
    """Start it, see it serve, stop it with Ctrl-C: exit code 0."""
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"the dashboard ended: {proc.communicate()}"
            try:
                with urllib.request.urlopen(f"http://localhost:{port}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the dashboard never answered"
            time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert f"http://localhost:{port}" in out


def _start_server(args: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    """Start `testbed serve` and wait until it listens (its first line)."""
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("testbed serve:"), f"testbed serve did not start: {line}{proc.stderr.read()[-3000:]}"
    return proc


@pytest.mark.slow
def test_readme_commands_run_as_written(tmp_path):
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} (the shared traces the README uses) is absent")
    root = tmp_path / "repo"  # the README's commands run from the repository root, beside ../shared
    root.mkdir()
    (tmp_path / "shared").symlink_to(SHARED)
    for name in LINKED:
        (root / name).symlink_to(REPO / name)
    (root / ".venv").symlink_to(Path(sys.executable).parents[1])  # `.venv/bin/python benchmarks/...`
    hf = tmp_path / "hf-folder"
    save_hf_model("llama", hf, max_position_embeddings=4096)  # the example trace's prompts fit
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    failures = []
    servers: list[subprocess.Popen] = []  # `testbed serve`, left running for the commands after it
    serve_port = _free_port()
    for command in readme_commands():
        way = WAYS.get(command, Way())
        if way.skip:
            if "calibrate" in command:  # its profile, for the recipe's next commands
                (root / "runs" / "profiles").mkdir(parents=True, exist_ok=True)
                shutil.copy(REPO / "profiles" / "cpu-tiny-llama.json", root / "runs" / "profiles" / "tiny-llama-cpu.json")
            continue
        port = _free_port()
        line = command
        for old, new in way.replace:
            line = line.replace(old, new)
        args = [a.format(hf=hf, port=port, serve_port=serve_port) for a in [*line.split(), *way.append]]
        if args[:2] == ["testbed", "dashboard"]:
            _run_dashboard(args, root, env, port)
            continue
        if args[:2] == ["testbed", "serve"]:
            servers.append(_start_server(args, root, env))
            continue
        proc = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=600)
        output = proc.stdout + proc.stderr
        if proc.returncode != 0 or "Traceback" in output or EXPECT.get(command, "") not in output:
            failures.append(f"$ {' '.join(args)}\nexit {proc.returncode}\n{output[-3000:]}")
    for server in servers:  # Ctrl-C: it drains and ends with 0
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=60)
        if server.returncode != 0:
            failures.append(f"testbed serve ended with {server.returncode}\n{err[-3000:]}")
    assert not failures, "\n\n".join(failures)
