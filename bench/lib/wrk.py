"""``wrk``, a C load generator (Debian's ``wrk`` package), driving one route.

    result = drive(url, bodies, connections=16, seconds=10)   # -> WrkResult
    figures = load(url, bodies, connections=16, seconds=10)   # -> a load's figures (dict)

One ``wrk`` thread (``-t1``) keeps ``connections`` requests in flight on keep-alive
connections. Request i posts ``bodies[i % len(bodies)]`` with that body's headers: a Lua
script reads every body once, formats each request once (``wrk.format``) and hands them out in
turn, so the generator does no per-request work beyond sending and parsing; when it is done the
script prints the counts and latency percentiles as JSON.

What the generator itself costs is measured, not assumed: its CPU time (user + system, from
``wait4``'s resource usage of the ``wrk`` process) per answered request is ``client_cpu_ms``,
to be read beside the server's. Under a tenth of the server's, the server is what is measured.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.payloads import Body

__all__ = ["WrkResult", "available", "drive", "load"]

#: Seconds after which wrk counts a request as timed out (its default, 2 s, is shorter than a
#: loaded compute-bound server's tail).
TIMEOUT_S = 60

_SCRIPT = """
local bodies = {{{bodies}}}
local requests = {{}}
local i = 0
init = function(args)
  for k, entry in ipairs(bodies) do
    local f = assert(io.open(entry.path, "rb"))
    local data = f:read("*a")
    f:close()
    requests[k] = wrk.format("POST", nil, entry.headers, data)
  end
end
request = function()
  i = i % #requests + 1
  return requests[i]
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nWRK-JSON {{"requests": %d, "duration_us": %d, "errors": %d, "status_errors": %d, '
    .. '"p50_us": %d, "p90_us": %d, "p95_us": %d, "p99_us": %d, "max_us": %d, '
    .. '"mean_us": %d}}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(95),
    latency:percentile(99), latency.max, latency.mean))
end
"""


@dataclass(frozen=True)
class WrkResult:
    """What one ``wrk`` run measured: latencies in milliseconds, its own CPU in seconds."""

    requests: int  # answers of any status
    seconds: float
    errors: int  # connection errors and timeouts
    status_errors: int  # answers other than 2xx/3xx
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float = float("nan")
    p95_ms: float = float("nan")
    cpu_s: float = float("nan")  # the wrk process's user + system time

    @property
    def answered(self) -> int:
        """Answers with a 2xx/3xx status."""
        return self.requests - self.status_errors

    @property
    def requests_per_s(self) -> float:
        return self.answered / self.seconds

    @property
    def client_cpu_ms(self) -> float:
        """The generator's CPU per answered request, in milliseconds."""
        return 1e3 * self.cpu_s / self.answered if self.answered else float("nan")


def available() -> bool:
    return shutil.which("wrk") is not None


def _lua_string(text: str) -> str:
    return json.dumps(text)  # a JSON string of ASCII text is a Lua string literal


def script(paths: Sequence[Path], bodies: Sequence[Body]) -> str:
    """The Lua script that posts the body in ``paths[k]`` with ``bodies[k]``'s headers, in turn."""
    entries = []
    for path, body in zip(paths, bodies, strict=True):
        headers = ", ".join(
            f"[{_lua_string(k)}] = {_lua_string(v)}" for k, v in body.headers.items()
        )
        entries.append(f"{{path = {_lua_string(str(path))}, headers = {{{headers}}}}}")
    return _SCRIPT.format(bodies=", ".join(entries))


def drive(url: str, bodies: Body | Sequence[Body], connections: int, seconds: int) -> WrkResult:
    """``wrk -t1 -c connections -d seconds`` posting ``bodies`` in turn to ``url``
    (``RuntimeError`` with wrk's own message if it fails)."""
    found = [bodies] if isinstance(bodies, Body) else list(bodies)
    if not found:
        raise ValueError("wrk needs at least one body to send")
    with tempfile.TemporaryDirectory(prefix="bench-wrk-") as scratch:
        folder = Path(scratch)
        paths = [folder / f"body-{k}" for k in range(len(found))]
        for path, body in zip(paths, found, strict=True):
            path.write_bytes(body.data)
        lua = folder / "post.lua"
        lua.write_text(script(paths, found))
        out, err = folder / "stdout", folder / "stderr"
        command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", f"--timeout={TIMEOUT_S}s"]
        with out.open("wb") as stdout, err.open("wb") as stderr:
            process = subprocess.Popen(
                [*command, "-s", str(lua), url], stdout=stdout, stderr=stderr
            )
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
        text, problems = out.read_text(), err.read_text()
    if process.returncode != 0:
        raise RuntimeError(f"wrk failed ({process.returncode}): {(problems or text)[-500:]}")
    line = next((line for line in text.splitlines() if line.startswith("WRK-JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary: {(problems or text)[-500:]}")
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
        mean_ms=fields["mean_us"] / 1e3,
        p95_ms=fields["p95_us"] / 1e3,
        cpu_s=usage.ru_utime + usage.ru_stime,
    )


def figures(result: WrkResult) -> dict[str, Any]:
    """``result`` as a load's figures (the keys :func:`bench.lib.load.summary` gives, less the
    list of latencies, which wrk keeps to itself), with the generator's CPU per request."""
    outcomes = {"2xx": result.answered}
    if result.status_errors:
        outcomes["other status"] = result.status_errors
    if result.errors:
        outcomes["socket errors"] = result.errors
    counts = {
        "requests": result.answered,
        "failures": result.status_errors + result.errors,
        "outcomes": outcomes,
        "seconds": result.seconds,
        "driver": "wrk",
    }
    if not result.answered:
        return counts
    return counts | {
        "requests_per_second": result.requests_per_s,
        "mean_ms": result.mean_ms,
        "p50_ms": result.p50_ms,
        "p90_ms": result.p90_ms,
        "p95_ms": result.p95_ms,
        "p99_ms": result.p99_ms,
        "max_ms": result.max_ms,
        "client_cpu_ms_per_request": result.client_cpu_ms,
    }


def load(url: str, bodies: Body | Sequence[Body], connections: int, seconds: int) -> dict[str, Any]:
    """:func:`drive`, as a load's figures (:func:`figures`); a server that cannot be reached
    (it died: wrk could not connect) is a load that answered nothing, with wrk's reason in
    ``error``, so that a comparison goes on without it."""
    try:
        return figures(drive(url, bodies, connections, seconds))
    except RuntimeError as error:
        reason = str(error)
        return {
            "requests": 0,
            "failures": 1,
            "outcomes": {"not reached": 1},
            "seconds": float(seconds),
            "driver": "wrk",
            "error": reason,
        }
