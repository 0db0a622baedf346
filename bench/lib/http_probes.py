"""What an HTTP server does with a client that breaks the rules, probed over raw sockets: a
body that stops arriving, a head that is too large, headers that never end, and a request sent
on an idle keep-alive connection just after the server was told to stop (SIGTERM).

Each probe gives a :class:`Probe`: what came back (the status line, the body's first bytes, or
how the connection ended) and after how long, for :mod:`bench.front_end` to set servers side
by side.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import time
from urllib.parse import urlsplit

#: How long a probe waits for the server to answer or close, at most.
PATIENCE_S = 15.0


@dataclasses.dataclass(frozen=True)
class Probe:
    """A probe's outcome: ``status`` (0: no response), the response body's first bytes,
    ``ended`` (``"answered"``, ``"closed"``: EOF with nothing, ``"reset"``, ``"waiting"``: still
    open after :data:`PATIENCE_S`) and ``seconds`` from the probe's last send."""

    status: int
    body: str
    ended: str
    seconds: float


def _connect(base: str) -> socket.socket:
    url = urlsplit(base)
    conn = socket.create_connection((url.hostname or "127.0.0.1", url.port or 80), timeout=5)
    conn.settimeout(PATIENCE_S)
    return conn


def _read_response(conn: socket.socket, started: float) -> Probe:
    """One response (or the connection's end) read from ``conn``."""
    data = body = b""
    ended = "answered"
    try:
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                ended = "closed"
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")[1:]
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        while ended == "answered" and len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
    except TimeoutError:
        ended = "waiting"
    except ConnectionResetError:
        ended = "reset"
    seconds = time.perf_counter() - started
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    if not body and b"\r\n\r\n" in data:
        body = data.partition(b"\r\n\r\n")[2]
    if status == 0 and ended == "answered":
        ended = "closed"
    return Probe(status, body[:120].decode("utf-8", "replace"), ended, round(seconds, 2))


def slow_body(base: str, path: str = "/classify") -> Probe:
    """A POST that announces 100,000 bytes of body, sends 100 and then nothing."""
    with _connect(base) as conn:
        head = f"POST {path} HTTP/1.1\r\nHost: probe\r\nContent-Type: image/jpeg\r\n"
        conn.sendall(f"{head}Content-Length: 100000\r\n\r\n".encode() + b"\xff" * 100)
        return _read_response(conn, time.perf_counter())


def large_head(base: str) -> Probe:
    """A GET with one header of 70,000 bytes (past a 64 KiB bound on the head)."""
    with _connect(base) as conn:
        conn.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: probe\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
        )
        return _read_response(conn, time.perf_counter())


def many_headers(base: str) -> Probe:
    """A GET with 150 header fields (past a bound of 100)."""
    fields = "".join(f"X-F{i}: v\r\n" for i in range(150))
    with _connect(base) as conn:
        conn.sendall(f"GET /healthz HTTP/1.1\r\nHost: probe\r\n{fields}\r\n".encode())
        return _read_response(conn, time.perf_counter())


def unfinished_head(base: str) -> Probe:
    """A request line and one header, then nothing: the head never ends."""
    with _connect(base) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: probe\r\n")
        return _read_response(conn, time.perf_counter())


def request_after_sigterm(base: str, pid: int, delay_s: float = 0.3) -> Probe:
    """One request answered on a keep-alive connection; SIGTERM to ``pid`` (the server);
    ``delay_s`` later a second request on the same connection, idle until then: answered, or
    lost (``closed``/``reset``)."""
    request = b"GET /healthz HTTP/1.1\r\nHost: probe\r\n\r\n"
    with _connect(base) as conn:
        conn.sendall(request)
        first = _read_response(conn, time.perf_counter())
        if first.status != 200:
            return first
        os.kill(pid, signal.SIGTERM)
        time.sleep(delay_s)
        try:
            conn.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            return Probe(0, "", "reset", 0.0)
        return _read_response(conn, time.perf_counter())
