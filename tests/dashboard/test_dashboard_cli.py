"""`testbed dashboard`: its options and refusals (tests/dashboard/test_dashboard_browser.py starts it for real)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.dashboard_cli import app_path, streamlit_command

REPO = Path(__file__).resolve().parents[2]


def _testbed(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


def test_dashboard_command_is_registered():
    p = _testbed("dashboard", "--help")
    assert p.returncode == 0
    assert "--runs" in p.stdout and "--port" in p.stdout


def test_streamlit_gets_the_app_the_port_and_the_runs_dir(tmp_path):
    cmd = streamlit_command(tmp_path, 8123)
    assert cmd[:5] == [sys.executable, "-m", "streamlit", "run", str(app_path())] and app_path().is_file()
    assert cmd[cmd.index("--server.port") + 1] == "8123"
    assert cmd[cmd.index("--server.headless") + 1] == "true"
    assert cmd[cmd.index("--") :] == ["--", "--runs", str(tmp_path)]  # what dashboard/settings.py reads


@pytest.mark.slow
def test_refuses_a_file_as_runs_dir_and_a_bad_port(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    p = _testbed("dashboard", "--runs", str(f))
    assert p.returncode == 2 and "not a directory" in p.stderr and "Traceback" not in p.stderr
    p = _testbed("dashboard", "--port", "70000")
    assert p.returncode == 2 and "port" in p.stderr


@pytest.mark.slow
def test_a_missing_runs_folder_and_a_busy_port_are_one_line_errors(tmp_path):
    from cli_helpers import assert_clean_error

    assert_clean_error(_testbed("dashboard", "--runs", str(tmp_path / "nope")), "--runs", "no such folder")
    with socket.socket() as listener:
        listener.bind(("localhost", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert_clean_error(_testbed("dashboard", "--runs", str(tmp_path), "--port", str(port)), f"--port {port}", "in use")
