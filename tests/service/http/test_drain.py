"""Stopping to listen without resetting the connections the kernel had already queued."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable

import pytest
import uvicorn

from service.http.drain import CloseWhenDraining, DrainingServer, close_listeners

REQUEST = b"GET / HTTP/1.1\r\nHost: test\r\n\r\n"


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


def test_close_listeners_accepts_the_backlog_and_then_refuses():
    """Connections queued (handshake done, request sent, never accepted) come back accepted,
    with their request readable; once closed, the port refuses new connections."""
    sock = _listener()
    address = sock.getsockname()
    clients = [socket.create_connection(address) for _ in range(3)]
    for client in clients:
        client.sendall(REQUEST)
    queued = close_listeners([sock], close=[sock])
    try:
        assert len(queued) == 3
        for conn in queued:
            conn.setblocking(True)
            assert conn.recv(1024) == REQUEST
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(address, timeout=5)
    finally:
        for s in [*clients, *queued]:
            s.close()


def test_close_listeners_drains_but_the_port_listens_while_another_process_holds_it():
    """With several workers each holds the listening socket: the one closing takes what was
    queued, and the others (here a duplicate descriptor) go on accepting."""
    sock = _listener()
    other = socket.socket(fileno=os.dup(sock.fileno()))
    address = sock.getsockname()
    first = socket.create_connection(address)
    queued = close_listeners([sock], close=[sock])
    later = socket.create_connection(address, timeout=5)  # still listening: queued for `other`
    try:
        assert len(queued) == 1
        conn, _ = other.accept()
        conn.close()
    finally:
        for s in [first, later, *queued, other]:
            s.close()


def _event_loops() -> list[Callable[[], asyncio.AbstractEventLoop]]:
    """asyncio's loop, and uvloop's (what uvicorn picks when it is installed)."""
    loops: list[Callable[[], asyncio.AbstractEventLoop]] = [asyncio.new_event_loop]
    try:
        import uvloop
    except ImportError:
        return loops
    return [*loops, uvloop.new_event_loop]


async def _hello(scope, receive, send) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]}
    )
    await send({"type": "http.response.body", "body": b"hello"})


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize("loop_factory", _event_loops(), ids=lambda f: f.__module__.split(".")[0])
def test_a_request_queued_when_the_server_stops_is_answered_not_reset(loop_factory):
    """The clients connect and send while the event loop is busy (so nothing accepts them),
    then the server shuts down: each still gets its answer, not a reset. Closing the listening
    socket outright would reset all three."""
    drained: list[bool] = []
    app = CloseWhenDraining(_hello, draining=lambda: bool(drained))
    config = uvicorn.Config(app, lifespan="off", log_level="warning", timeout_keep_alive=5)
    server = DrainingServer(config, on_drain=lambda: drained.append(True))
    sock = _listener()
    clients: list[socket.socket] = []

    async def scenario() -> None:
        config.load()
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        # no await from here to shutdown's first one: the loop accepts nothing meanwhile
        for _ in range(3):
            client = socket.create_connection(sock.getsockname())
            client.sendall(REQUEST)
            clients.append(client)
        await server.shutdown(sockets=[sock])

    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(scenario())
        assert drained == [True]
        for client in clients:
            answer = _read_all(client)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            assert b"connection: close" in answer.lower()
            assert answer.endswith(b"hello")
    finally:
        for client in clients:
            client.close()
        sock.close()


def test_a_second_ctrl_c_cuts_the_keep_alive_wait_short():
    """With an idle keep-alive connection open the drain waits up to the keep-alive timeout
    (here ten minutes) for it; ``force_exit`` (a second Ctrl-C) ends that wait."""
    app = CloseWhenDraining(_hello, draining=lambda: False)
    config = uvicorn.Config(app, lifespan="off", log_config=None, timeout_keep_alive=600)
    server = DrainingServer(config, on_drain=lambda: None)
    sock = _listener()

    async def scenario() -> None:
        config.load()
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        writer.write(REQUEST)
        await reader.readuntil(b"hello")  # answered; the connection stays open, idle
        server.should_exit = server.force_exit = True
        try:
            await asyncio.wait_for(server.shutdown(sockets=[sock]), 60)
        finally:
            writer.close()

    try:
        asyncio.run(scenario())
    finally:
        sock.close()
