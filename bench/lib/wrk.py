"""``wrk``, a C load generator (Debian's ``wrk`` package), driving one route with one body.

    result = drive(url, body, connections=16, seconds=10)   # -> WrkResult

One ``wrk`` thread (``-t1``) keeps ``connections`` requests in flight, each the same body (a
Lua script sets the method, headers and body, and prints the latency percentiles as JSON when
it is done). It costs a small fraction of a core per request, so the server, not the
generator, is what is measured.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.lib.payloads import Body

__all__ = ["WrkResult", "available", "drive"]

_SCRIPT = """
wrk.method = "POST"
local f = assert(io.open("{body}", "rb"))
wrk.body = f:read("*a")
f:close()
{headers}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nWRK-JSON {{"requests": %d, "duration_us": %d, "errors": %d, "status_errors": %d, '
    .. '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d}}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


@dataclass(frozen=True)
class WrkResult:
    """What one ``wrk`` run measured: latencies in milliseconds."""

    requests: int
    seconds: float
    errors: int  # connection errors and timeouts
    status_errors: int  # answers other than 2xx/3xx
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds


def available() -> bool:
    return shutil.which("wrk") is not None


def drive(url: str, body: Body, connections: int, seconds: int) -> WrkResult:
    """``wrk -t1 -c connections -d seconds`` posting ``body`` to ``url`` (``RuntimeError``
    with wrk's own message if it fails)."""
    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "body"
        data.write_bytes(body.data)
        headers = "\n".join(
            f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in body.headers.items()
        )
        script = Path(scratch) / "post.lua"
        script.write_text(_SCRIPT.format(body=data, headers=headers))
        done = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", str(script), url],
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {(done.stderr or done.stdout)[-500:]}")
    out = done.stdout
    line = next(line for line in out.splitlines() if line.startswith("WRK-JSON "))
    fields = json.loads(line.removeprefix("WRK-JSON "))
    return WrkResult(
        requests=fields["requests"],
        seconds=fields["duration_us"] / 1e6,
        errors=fields["errors"],
        status_errors=fields["status_errors"],
        p50_ms=fields["p50_us"] / 1e3,
        p90_ms=fields["p90_us"] / 1e3,
        p99_ms=fields["p99_us"] / 1e3,
        max_ms=fields["max_us"] / 1e3,
    )
