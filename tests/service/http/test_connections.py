"""What service.http.connections takes from uvicorn beyond its public API, checked on the
installed uvicorn: the read deadlines of its protocol, and what the drain asks of a running
server. A new uvicorn that changes any of it fails here (pyproject.toml pins the tested one)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from service.http.connections import (
    ServerConfig,
    TimedHttpProtocol,
    event_loop_servers,
    open_connections,
    serve_accepted,
)
from tests.service.test_server import real_server

REQUEST = b"GET / HTTP/1.1\r\nHost: test\r\n\r\n"
#: generous: a bound on a loaded machine's pauses, never a measurement
PATIENCE_S = 20.0


async def _hello(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]}
    )
    await send({"type": "http.response.body", "body": b"hello"})


def _serve(
    scenario: Callable[[uvicorn.Server, tuple[str, int]], Awaitable[None]], **bounds: Any
) -> None:
    """Run ``scenario(server, address)`` against a started uvicorn server on ``ServerConfig``
    (``bounds``: its read deadlines), then stop the server as a signal would."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = ServerConfig(_hello, lifespan="off", log_config=None, **bounds)
    server = uvicorn.Server(config)

    async def run() -> None:
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                assert not serving.done(), "the server did not start"
                await asyncio.sleep(0.01)
            await scenario(server, sock.getsockname())
        finally:
            server.should_exit = True
            await asyncio.wait_for(serving, PATIENCE_S)

    try:
        asyncio.run(run())
    finally:
        sock.close()


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    return await asyncio.wait_for(reader.read(), PATIENCE_S)


def test_the_config_makes_uvicorn_use_the_timed_protocol():
    config = ServerConfig(_hello, log_config=None, header_timeout_s=1, body_timeout_s=2)
    config.load()
    assert config.http_protocol_class is TimedHttpProtocol
    assert (config.header_timeout_s, config.body_timeout_s) == (1, 2)


def test_connections_that_do_not_finish_their_headers_are_closed():
    """A silent connection and one whose headers stop half-way are closed by the header
    deadline, with nothing sent; a request that arrives whole is answered meanwhile."""

    async def scenario(server: uvicorn.Server, address: tuple[str, int]) -> None:
        silent, silent_writer = await asyncio.open_connection(*address)
        partial, partial_writer = await asyncio.open_connection(*address)
        partial_writer.write(b"GET / HTTP/1.1\r\nHost: te")
        whole, whole_writer = await asyncio.open_connection(*address)
        whole_writer.write(REQUEST)
        try:
            answer = await asyncio.wait_for(whole.readuntil(b"hello"), PATIENCE_S)
            assert answer.startswith(b"HTTP/1.1 200")
            assert await _closed(silent) == b""
            assert await _closed(partial) == b""
        finally:
            for writer in (silent_writer, partial_writer, whole_writer):
                writer.close()

    _serve(scenario, header_timeout_s=0.3, body_timeout_s=60)


def test_a_body_that_does_not_arrive_in_time_closes_the_connection():
    """Headers in time, then a body that stops: closed by the body deadline."""

    async def scenario(server: uvicorn.Server, address: tuple[str, int]) -> None:
        reader, writer = await asyncio.open_connection(*address)
        writer.write(b"POST / HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\nabcd")
        try:
            assert await _closed(reader) == b""
        finally:
            writer.close()

    _serve(scenario, header_timeout_s=60, body_timeout_s=0.3)


def test_what_the_drain_takes_from_a_running_server():
    """The event loop's servers listen on the server's socket, the open connections are
    counted (an idle one too) and a connection accepted by hand is served like the others."""

    async def scenario(server: uvicorn.Server, address: tuple[str, int]) -> None:
        listening = [sock.getsockname() for s in event_loop_servers(server) for sock in s.sockets]
        assert listening == [address]
        assert open_connections(server) == 0
        _, idle = await asyncio.open_connection(*address)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PATIENCE_S
        while open_connections(server) == 0:
            assert loop.time() < deadline, "the open connection was never counted"
            await asyncio.sleep(0.01)
        assert open_connections(server) == 1
        idle.close()

        with socket.socket() as other:  # a listener of our own, its connection served above
            other.bind(("127.0.0.1", 0))
            other.listen()
            reader, writer = await asyncio.open_connection(*other.getsockname())
            conn, _ = other.accept()
            conn.setblocking(False)
            await serve_accepted(server, conn)
            writer.write(REQUEST)
            answer = await asyncio.wait_for(reader.readuntil(b"hello"), PATIENCE_S)
            assert answer.startswith(b"HTTP/1.1 200")
            writer.close()

    _serve(scenario, header_timeout_s=60, body_timeout_s=60)


@pytest.mark.parametrize("hook", ["on_message_begin", "on_headers_complete", "on_message_complete"])
def test_the_parser_callbacks_the_deadlines_hook_are_uvicorns(hook: str):
    """The protocol's deadlines are kept by overriding these: uvicorn's protocol must still
    define them (else the override would never be called)."""
    base = TimedHttpProtocol.__mro__[1]
    assert base.__module__ == "uvicorn.protocols.http.httptools_impl"
    assert callable(getattr(base, hook))


def _raw(port: int, data: bytes) -> bytes:
    """What the server answers to ``data`` on a new connection (until it closes it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        with contextlib.suppress(OSError):  # closed under a long send: read its answer
            conn.sendall(data)
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                answer += chunk
    return answer


def test_heads_over_the_bounds_are_414_or_431_in_json_and_memory_stays_bounded(shipped_model):
    """A 20 MB header, 2,000 header fields, an 80 kB query, bytes that are not HTTP: each gets
    the service's JSON error and its connection closed; 30 connections each sending 8 MB of
    unfinished headers raise the server's peak memory by far less than they sent."""
    with real_server(shipped_model, "--grpc-port", "0") as (base, server):
        port = int(base.rsplit(":", 1)[1])
        fields = b"".join(b"X-%d: 1\r\n" % i for i in range(2000))
        cases = {
            b"431": b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n",
            b"414": b"GET /healthz?" + b"q" * 80_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            b"400": b"NOT HTTP AT ALL\r\n\r\n",
        }
        for status, request in cases.items():
            answer = _raw(port, request)
            assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
            assert b"content-type: application/json" in answer
            assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"]
        oip = _raw(port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
        assert isinstance(json.loads(oip.split(b"\r\n\r\n", 1)[1])["error"], str)  # its shape
        ok = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        ok += b"".join(b"X-%d: 1\r\n" % i for i in range(90)) + b"\r\n"
        assert _raw(port, ok).startswith(b"HTTP/1.1 200")
        before = _peak_mib(server.pid)

        def flood(_: int) -> bytes:
            head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (8 * 2**20)
            return _raw(port, head)

        with ThreadPoolExecutor(30) as pool:
            list(pool.map(flood, range(30)))
        assert _peak_mib(server.pid) - before < 64  # they sent 240 MB
        assert httpx.get(f"{base}/healthz").status_code == 200


def _peak_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def test_trailers_a_long_first_header_and_a_split_head_end_are_counted_right(shipped_model):
    """Past the head, a chunked body's trailers are bounded as headers are; a head too long in
    its first header (one read) is 431, not 414; a head whose blank line is split between two
    reads does not count the body that follows as head."""
    with real_server(shipped_model, "--grpc-port", "0") as (base, server):
        port = int(base.rsplit(":", 1)[1])
        before = _peak_mib(server.pid)
        chunked = (
            b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n4\r\n\x89PNG\r\n0\r\nX-Trailer: "
        )
        answer = _raw(port, chunked + b"a" * (16 * 2**20))
        assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
        assert _peak_mib(server.pid) - before < 48
        cookie = b"GET /healthz HTTP/1.1\r\nHost: x\r\nCookie: " + b"c" * 70_000 + b"\r\n\r\n"
        assert _raw(port, cookie).startswith(b"HTTP/1.1 431")
        png = _png()
        head = (
            b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r" % len(png)
        )
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(head)
            time.sleep(0.2)  # two reads: the blank line's last byte comes with the body
            conn.sendall(b"\n" + png)  # a body larger than any head may be
            answer = b""
            with contextlib.suppress(OSError):
                while chunk := conn.recv(65536):
                    answer += chunk
        assert len(png) > 64 * 1024
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]


def _png() -> bytes:
    import io

    import numpy as np
    from PIL import Image

    noise = np.random.default_rng(0).integers(0, 256, (300, 300), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, "PNG")  # about 90 kB: more than a head's 64 KiB
    return buffer.getvalue()
