"""`testbed sweep --ray ADDRESS`: the same sweep on a Ray instance this test starts (2 CPUs)
gives the same sweep.parquet and the same run folders as local processes.

Ray takes a while to start on a small machine: one small sweep (2 points, 20 requests).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed.studies.sweep import load_sweep
from testbed.traces.gen import GenConfig, generate_trace

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "testbed.cli"]


@pytest.fixture(scope="module")
def ray_address():
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def _sweep(trace: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    args = ["sweep", trace, "--grid", "policy=fcfs,lpm", "--max-requests", 20, "--out", out, "-q", *extra]
    proc = subprocess.run([*CLI, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    return proc


@pytest.mark.slow
def test_ray_sweep_equals_local_sweep(ray_address, tmp_path):
    trace = tmp_path / "t.json"
    generate_trace(
        GenConfig(num_requests=20, rate=20.0, input_len="uniform:50,300", output_len="uniform:10,60", system_prompts=2, shared_fraction=0.8)
    ).write(trace)
    _sweep(trace, tmp_path / "local", "--workers", "2")
    proc = _sweep(trace, tmp_path / "ray", "--ray", ray_address)
    assert "Ray (2 CPUs)" in proc.stdout
    local, local_meta = load_sweep(tmp_path / "local")
    on_ray, ray_meta = load_sweep(tmp_path / "ray")
    assert list(on_ray["status"]) == ["complete", "complete"]
    # Everything but the wall clock is equal: options, metrics, point names and folders.
    assert on_ray.drop(columns="wall_s").equals(local.drop(columns="wall_s"))
    assert ray_meta == local_meta
    for point in local["run_dir"]:
        for name in ("requests.parquet", "steps.parquet"):
            assert (tmp_path / "ray" / point / name).read_bytes() == (tmp_path / "local" / point / name).read_bytes()
