"""End to end in a real browser: `testbed dashboard` on a free port, headless Chromium over the
DevTools protocol, the plotly charts rendered, a screenshot, the Perfetto download; Ctrl-C stops
the dashboard cleanly.

Also the script that makes the README's screenshots (docs/dashboard-*.png), from runs of traces/a.json:

    .venv/bin/python tests/dashboard/test_dashboard_browser.py --runs runs --run a-sim-fcfs --compare a-real,a-sim-tiny-llama-cpu

`--pages whatif` makes only that one (the What-if page opens the newest sweep in --runs); `--pages cluster
--cluster-run NAME` shoots the Instances section of a cluster run (docs/dashboard-cluster.png).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import pytest
from websockets.sync.client import connect

from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.traces.gen import GenConfig, generate_trace

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--remote-debugging-port=0",  # the port it picks is written to DevToolsActivePort
)
WIDTH, HEIGHT = 1400, 1000
RUNS_WIDTH = 2000  # the Runs table is wide
START_TIMEOUT_S = 60
RENDER_TIMEOUT_S = 60
CHART_JS = "document.querySelectorAll('.js-plotly-plot .main-svg').length"
TRACES_JS = "document.querySelectorAll('.js-plotly-plot g.trace').length"
# The KV chart's two stacked series as the browser holds them (plotly keeps figure data on the div).
KV_JS = """(() => {
  const gd = [...document.querySelectorAll('.js-plotly-plot')].find(g => (g.layout.title.text || '').includes('KV cache'));
  if (!gd) return null;
  const y = name => Array.from(gd._fullData.find(t => t.name === name).y);  // decoded (data may hold base64)
  return {used: y('KV used'), cached: y('KV evictable cache')};
})()"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, check, timeout_s: float, interval_s: float = 0.25):
    """check()'s first truthy value, polling; TimeoutError naming what never happened."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout_s} s")
        time.sleep(interval_s)


def _http(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def stop_group(proc: subprocess.Popen) -> None:
    """Stop the process group proc leads (started with start_new_session): SIGTERM, so that its
    leader reaps its children, then SIGKILL to whatever is left; reap proc."""
    if proc.poll() is None:
        _killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    _killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class DevTools:
    """The few DevTools protocol calls these tests need, over one page target's websocket."""

    def __init__(self, ws) -> None:
        self.ws = ws  # a websockets.sync connection
        self.next_id = 0

    def send(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:  # events arrive in between; skip them
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def resize(self, width: int, height: int) -> None:
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def screenshot(self) -> bytes:
        return base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])


@contextmanager
def dashboard(runs_dir: Path, port: int) -> Iterator[subprocess.Popen]:
    """`testbed dashboard --runs runs_dir --port port`, up and answering; killed on the way out."""
    testbed = Path(sys.executable).with_name("testbed")
    cmd = [str(testbed)] if testbed.exists() else [sys.executable, "-m", "testbed.cli"]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [*cmd, "dashboard", "--runs", str(runs_dir), "--port", str(port)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    proc.log = log  # type: ignore[attr-defined]
    try:
        wait_until(
            "dashboard health check",
            lambda: proc.poll() is not None or _http(f"http://localhost:{port}/_stcore/health") == "ok",
            START_TIMEOUT_S,
        )
        assert proc.poll() is None, f"testbed dashboard exited: {output(proc)}"
        yield proc
    finally:
        stop_group(proc)
        log.close()


def output(proc: subprocess.Popen) -> str:
    proc.log.seek(0)  # type: ignore[attr-defined]
    return proc.log.read().decode(errors="replace")  # type: ignore[attr-defined]


@contextmanager
def chromium(width: int = WIDTH, height: int = HEIGHT) -> Iterator[DevTools]:
    """Headless Chromium with a fresh profile, and a DevTools session on its page; killed on the way out."""
    profile = Path(tempfile.mkdtemp(prefix="dash-chromium-"))
    proc = subprocess.Popen(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        active = profile / "DevToolsActivePort"
        wait_until("Chromium's DevToolsActivePort", lambda: active.is_file() and active.read_text().strip(), START_TIMEOUT_S)
        port = int(active.read_text().split()[0])
        targets = wait_until(
            "a page target",
            lambda: [t for t in json.loads(_http(f"http://127.0.0.1:{port}/json/list") or "[]") if t["type"] == "page"],
            START_TIMEOUT_S,
        )
        with connect(targets[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=10) as ws:
            devtools = DevTools(ws)
            devtools.send("Page.enable")
            devtools.resize(width, height)
            yield devtools
    finally:
        stop_group(proc)
        shutil.rmtree(profile, ignore_errors=True)


def open_page(devtools: DevTools, url: str, charts: int = 1) -> None:
    """Navigate and wait until Streamlit has drawn at least `charts` plotly charts with data."""
    devtools.send("Page.navigate", url=url)
    wait_until(
        f"{charts} plotly chart(s) at {url}", lambda: devtools.eval(CHART_JS) >= charts and devtools.eval(TRACES_JS) > 0, RENDER_TIMEOUT_S
    )
    wait_until(
        "Streamlit idle", lambda: not devtools.eval("!!document.querySelector('[data-testid=\"stStatusWidget\"]')"), RENDER_TIMEOUT_S
    )
    time.sleep(1.0)  # plotly's transitions


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", png[16:24])


LONG = "sim-long"


def _long_run_on_a_full_pool(tmp_path: Path) -> Path:
    """~15k steps (the charts bin them) on a 3,000-token KV pool the prefix cache keeps full."""
    cfg = GenConfig(
        num_requests=150, rate=1.0, input_len="uniform:50,300", output_len="uniform:60,160", system_prompts=4, shared_fraction=0.9, seed=7
    )
    generate_trace(cfg).write(tmp_path / "long.json")
    opts = ReplayOptions(kv_tokens=3000, model="tiny-llama", hardware="cpu")
    return replay(str(tmp_path / "long.json"), opts, out=tmp_path / "runs" / LONG).run_dir


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian package `chromium`; .ci/run installs it)")
def test_dashboard_renders_charts_in_chromium(tmp_path):
    # Imported here: the helpers beside tests/conftest.py are on the path under pytest only, and this
    # file also runs as the screenshot script (the module docstring).
    from dashboard_helpers import make_runs, make_trace, summary

    runs = make_runs(tmp_path / "runs", make_trace(tmp_path / "trace.json"))
    long_run = _long_run_on_a_full_pool(tmp_path)
    port = free_port()
    with dashboard(tmp_path / "runs", port) as proc, chromium() as devtools:
        open_page(devtools, f"http://localhost:{port}/run?run=sim-fcfs", charts=6)
        assert devtools.eval(CHART_JS) >= 6
        titles = devtools.eval("[...document.querySelectorAll('.js-plotly-plot .gtitle')].map(t => t.textContent)")
        assert "Latency CDFs" in titles and "Step timeline: CPU and device" in titles
        assert summary(runs["sim-fcfs"])["num_retractions"] == 0 and "Retractions" not in titles  # no empty panel
        png = devtools.screenshot()
        assert png_size(png) == (WIDTH, HEIGHT)
        assert len(png) > 30_000, "a blank page compresses to a few kB"
        (tmp_path / "run.png").write_bytes(png)
        # The timeline's download is a Perfetto trace of every step (built by the server on click).
        downloads = tmp_path / "downloads"
        downloads.mkdir()
        devtools.send("Browser.setDownloadBehavior", behavior="allow", downloadPath=str(downloads))
        devtools.eval("[...document.querySelectorAll('button')].find(b => b.innerText.includes('Perfetto')).click()")
        done = downloads / "sim-fcfs.trace.json"
        wait_until("the Perfetto download", lambda: done.is_file() and not list(downloads.glob("*.crdownload")), RENDER_TIMEOUT_S)
        events = [e for e in json.loads(done.read_text())["traceEvents"] if e["ph"] == "X"]
        assert len(events) == 4 * summary(runs["sim-fcfs"])["num_steps"]
        # A long run (binned) on a full KV pool: used and evictable, as drawn, stack to at most the pool.
        open_page(devtools, f"http://localhost:{port}/run?run={LONG}", charts=5)
        kv = devtools.eval(KV_JS)
        assert kv and 0 < len(kv["used"]) == len(kv["cached"]) < summary(long_run)["num_steps"]
        assert max(u + c for u, c in zip(kv["used"], kv["cached"])) == summary(long_run)["kv_tokens"]
        # The Runs page shows the runs and the broken folder's error.
        devtools.send("Page.navigate", url=f"http://localhost:{port}/")
        text = wait_until(
            "the Runs page",
            lambda: (t := devtools.eval("document.body ? document.body.innerText : ''")) and "does not load" in t and t,
            RENDER_TIMEOUT_S,
        )
        assert "broken" in text and "bad JSON" in text
        # Ctrl-C: the terminal sends SIGINT to the whole foreground process group.
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        out = output(proc)
        assert f"dashboard: http://localhost:{port} (runs: {tmp_path / 'runs'})" in out
        assert "Traceback" not in out


# --- the README's screenshots ------------------------------------------------------------------


def _type_into(devtools: DevTools, label: str, text: str) -> None:
    """Replace a Streamlit text input's value, as a person would, and commit it with Enter."""
    devtools.eval(f"(() => {{ const el = document.querySelector('input[aria-label=\"{label}\"]'); el.focus(); el.select(); }})()")
    devtools.send("Input.insertText", text=text)
    for kind in ("keyDown", "keyUp"):
        devtools.send("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13, text="\r")


def _full_page(devtools: DevTools, width: int = WIDTH, max_height: int = 4800) -> bytes:
    """Grow the viewport to the app's content (Streamlit scrolls an inner element), then capture."""
    devtools.resize(width, HEIGHT)
    time.sleep(1.0)
    height = devtools.eval("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    devtools.resize(width, min(max(HEIGHT, int(height) + 40), max_height))
    time.sleep(1.5)  # plotly redraws at the new size
    return devtools.screenshot()


PAGES = ("runs", "run", "compare", "whatif", "cluster")


def _section(devtools: DevTools, heading: str, width: int = WIDTH, max_height: int = 8000) -> bytes:
    """The page from the header `heading` to its end, the viewport grown to the whole page first."""
    devtools.resize(width, HEIGHT)
    time.sleep(1.0)
    height = int(devtools.eval("document.querySelector('[data-testid=\"stMain\"]').scrollHeight"))
    devtools.resize(width, min(height + 40, max_height))
    time.sleep(1.5)  # plotly redraws at the new size
    # From the header's top to the next header's (or the page's end).
    top, bottom = devtools.eval(
        "(() => { const hs = [...document.querySelectorAll('h2')];"
        f" const i = hs.findIndex(h => h.innerText.trim().startsWith({json.dumps(heading)}));"
        " const top = hs[i].getBoundingClientRect().top;"
        " return [top, i + 1 < hs.length ? hs[i + 1].getBoundingClientRect().top : document.body.scrollHeight]; })()"
    )
    clip = dict(x=0, y=max(0, top - 10), width=width, height=bottom - top, scale=1)
    return base64.b64decode(devtools.send("Page.captureScreenshot", format="png", clip=clip)["data"])


def make_screenshots(
    runs_dir: Path,
    out: Path,
    run: str | None,
    compare: list[str],
    whatif_loads: str,
    pages: Sequence[str] = PAGES,
    cluster_run: str | None = None,
) -> None:
    port = free_port()
    out.mkdir(parents=True, exist_ok=True)
    with dashboard(runs_dir, port), chromium() as devtools:
        base = f"http://localhost:{port}"
        if "runs" in pages:
            devtools.send("Page.navigate", url=f"{base}/")
            wait_until(
                "the Runs table", lambda: devtools.eval("!!document.querySelector('[data-testid=\"stDataFrame\"]')"), RENDER_TIMEOUT_S
            )
            time.sleep(2)
            (out / "dashboard-runs.png").write_bytes(_full_page(devtools, width=RUNS_WIDTH, max_height=700))
            devtools.resize(WIDTH, HEIGHT)
        if "run" in pages:
            open_page(devtools, f"{base}/run?run={run}", charts=6)
            (out / "dashboard-run.png").write_bytes(_full_page(devtools))
            devtools.resize(WIDTH, HEIGHT)
        if "compare" in pages:
            open_page(devtools, f"{base}/compare?runs={','.join(compare)}", charts=2)
            (out / "dashboard-compare.png").write_bytes(_full_page(devtools))
            devtools.resize(WIDTH, HEIGHT)
        if "whatif" in pages:
            _whatif_screenshot(devtools, base, out, whatif_loads)
        if "cluster" in pages and cluster_run:
            open_page(devtools, f"{base}/run?run={cluster_run}", charts=7)
            (out / "dashboard-cluster.png").write_bytes(_section(devtools, "Instances"))
            devtools.resize(WIDTH, HEIGHT)


def _whatif_screenshot(devtools: DevTools, base: str, out: Path, whatif_loads: str) -> None:
    """The What-if page after running the load scales, with the newest sweep of the runs dir (if any) opened below."""
    devtools.send("Page.navigate", url=f"{base}/whatif")
    wait_until("the What-if form", lambda: devtools.eval("!!document.querySelector('input[aria-label=\"Load scale\"]')"), RENDER_TIMEOUT_S)
    time.sleep(1)
    _type_into(devtools, "Load scale", whatif_loads)
    n = len(whatif_loads.split(","))
    label = f"Run {n} simulations"
    wait_until(
        label,
        lambda: devtools.eval(f"[...document.querySelectorAll('button')].some(b => b.innerText.trim() === '{label}')"),
        RENDER_TIMEOUT_S,
    )
    devtools.eval(f"[...document.querySelectorAll('button')].find(b => b.innerText.trim() === '{label}').click()")
    # The results' charts by title: a sweep's charts below may be drawn already.
    titles = "[...document.querySelectorAll('.js-plotly-plot .gtitle')].map(t => t.textContent)"
    wait_until("the What-if results", lambda: "Latency percentiles" in devtools.eval(titles) and devtools.eval(TRACES_JS) > 0, 300)
    time.sleep(2)
    (out / "dashboard-whatif.png").write_bytes(_full_page(devtools, max_height=6400))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="Screenshots of each dashboard page for the README")
    p.add_argument("--runs", type=Path, required=True)
    p.add_argument("--out", type=Path, default=REPO / "docs")
    p.add_argument("--run", help="run shown on the Run page")
    p.add_argument("--compare", default="", help="comma-separated runs for the Compare page (the first is A)")
    p.add_argument("--whatif-loads", default="1, 1.5, 2", help="load scales tried on the What-if page")
    p.add_argument("--cluster-run", help="a cluster run (replay --replicas N) whose Instances section is shot")
    p.add_argument("--pages", default=",".join(PAGES), help="comma-separated pages to shoot (default: all)")
    a = p.parse_args()
    pages = a.pages.split(",")
    if "run" in pages and not a.run or "compare" in pages and not a.compare or "cluster" in pages and not a.cluster_run:
        p.error("--run, --compare and --cluster-run are needed for the run, compare and cluster pages")
    make_screenshots(a.runs.resolve(), a.out, a.run, a.compare.split(","), a.whatif_loads, pages, a.cluster_run)
