"""How late `replay --mode server` sends: the lag between a request's trace time and its send time.

    python benchmarks/server_send_lag.py [--seconds 2] [--rates 10,100,300] [--no-serve]

Open-loop traces of short requests (32 prompt tokens, 2 output tokens) at each rate, for
--seconds each, sent to two servers on this machine: testbed/live/instant_server.py (streams at
once: the client alone) and `testbed serve` (tiny-llama on the CPU engine; at the higher rates it
falls behind, and its queue grows, but the sends must still go out on time). Prints p50 and p99 of
the lag per server and rate (the run summary's send_lag_p50_ms / send_lag_p99_ms).
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testbed.live.instant_server import BackgroundServer, make_app  # noqa: E402
from testbed.options import ReplayOptions  # noqa: E402
from testbed.replay import replay  # noqa: E402
from testbed.traces.schema import Trace, TraceRequest  # noqa: E402


def lag(url: str, rate: float, seconds: float, work: Path) -> tuple[float, float, int]:
    n = max(1, int(rate * seconds))
    trace = work / f"rate-{rate:g}.jsonl"
    Trace([TraceRequest(i / rate, 32, 2, rid=f"r{i}") for i in range(n)]).write(trace)
    r = replay(str(trace), ReplayOptions(mode="server", url=url, request_timeout=600), out=work / f"run-{rate:g}-{abs(hash(url))}")
    return r.summary["send_lag_p50_ms"], r.summary["send_lag_p99_ms"], n


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rates", default="10,100,300")
    p.add_argument("--no-serve", action="store_true", help="only the instant server")
    a = p.parse_args()
    rates = [float(x) for x in a.rates.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with BackgroundServer(make_app()) as srv:
            for rate in rates:
                rows.append(("instant server", rate, *lag(srv.url, rate, a.seconds, work)))
        if not a.no_serve:
            port = _port()
            cmd = [sys.executable, "-m", "testbed", "serve", "--port", str(port), "--kv-tokens", "200000"]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
            try:
                assert proc.stdout.readline().startswith("testbed serve:")
                for rate in rates:
                    rows.append(("testbed serve (tiny-llama, CPU)", rate, *lag(f"http://127.0.0.1:{port}", rate, a.seconds, work)))
            finally:
                proc.send_signal(signal.SIGINT)
                proc.wait(120)
    print(f"{'server':<34}{'req/s':>7}{'requests':>10}{'lag p50 (ms)':>14}{'lag p99 (ms)':>14}")
    for server, rate, p50, p99, n in rows:
        print(f"{server:<34}{rate:>7g}{n:>10}{p50:>14.2f}{p99:>14.2f}")


if __name__ == "__main__":
    main()
