"""``max_buffered_bytes`` counts the body bytes a server holds, as they arrive: a client that
declares a large body and sends nothing holds nothing, so it cannot lock others out, while a
body that arrives is counted and one that cannot fit is still refused at once."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import numpy as np
import pytest
from starlette.types import Message, Receive, Scope, Send

from service.core.errors import ServiceError
from service.limits.bodies import BodyBudget, BufferedBytes
from tests.service.conftest import png
from tests.service.test_server import real_server

MiB = 2**20


def scope(length: int) -> Scope:
    return {"type": "http", "headers": [(b"content-length", str(length).encode())]}


async def nothing(message: Message) -> None:
    pass


def test_a_declared_body_that_never_arrives_holds_nothing():
    """Four requests that declare 80 of a budget of 100 and send nothing: another request's
    body still fits (each used to reserve its declared length before its first byte)."""
    buffered = BufferedBytes(100)
    silent = asyncio.Event()  # never set: the silent clients' bodies never come

    async def reader(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()

    async def silent_receive() -> Message:
        await silent.wait()
        raise AssertionError("unreachable")  # pragma: no cover

    async def real_receive() -> Message:
        return {"type": "http.request", "body": b"x" * 80, "more_body": False}

    async def scenario() -> list[int]:
        middleware = BodyBudget(reader, lambda: buffered)
        waiting = [
            asyncio.create_task(middleware(scope(80), silent_receive, nothing)) for _ in range(4)
        ]
        await asyncio.sleep(0.01)  # each is now waiting for its first byte
        held = [buffered.held]
        await middleware(scope(80), real_receive, nothing)  # fits: nothing else is held
        held.append(buffered.held)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        held.append(buffered.held)
        return held

    assert asyncio.run(scenario()) == [0, 0, 0]


def test_bytes_are_counted_as_they_arrive_and_refused_past_the_budget():
    buffered = BufferedBytes(100)
    seen: list[int] = []
    chunks = [b"x" * 40, b"x" * 40, b"x" * 40]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        for _ in chunks:
            await receive()
            seen.append(buffered.held)

    async def receive() -> Message:
        return {"type": "http.request", "body": chunks[len(seen)], "more_body": True}

    buffered.take(10)  # another request's body
    middleware = BodyBudget(app, lambda: buffered)
    with pytest.raises(ServiceError) as refused:  # a chunked body: no length declared
        asyncio.run(middleware({"type": "http", "headers": []}, receive, nothing))
    assert refused.value.status == 503
    assert seen == [50, 90]  # the third chunk would pass the budget
    assert buffered.held == 10  # given back when the request ended


def test_a_declared_body_larger_than_what_is_free_is_refused_before_it_is_read():
    buffered = BufferedBytes(100)
    buffered.take(50)
    read: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        read.append(await receive())

    async def receive() -> Message:
        return {"type": "http.request", "body": b"x" * 60, "more_body": False}

    with pytest.raises(ServiceError):
        asyncio.run(BodyBudget(app, lambda: buffered)(scope(60), receive, nothing))
    assert read == []
    assert buffered.held == 50


def silent_uploads(port: int, count: int, declared: int) -> list[socket.socket]:
    """``count`` connections that each declare a body of ``declared`` bytes and send none."""
    head = (
        f"POST /classify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {declared}\r\n"
        "Content-Type: multipart/form-data; boundary=b\r\n\r\n"
    ).encode()
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(head)
        held.append(sock)
    return held


@pytest.mark.slow
def test_silent_64_mib_uploads_do_not_lock_out_real_ones(shipped_model):
    """Four of them took the whole default budget (256 MiB): every real upload got 503 for
    the 30 s of their deadline."""
    # one worker: its budget is the server's (each worker has its own)
    args = ("--workers", "1", "--grpc-port", "0", "--log-level", "warning")
    with real_server(shipped_model, *args) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        held = silent_uploads(port, 4, 64 * MiB)
        try:
            time.sleep(0.5)  # the server has read their heads and waits for their bodies
            image = png(np.zeros((28, 28), np.uint8))
            codes = [
                httpx.post(
                    f"{base}/classify", files=[("file", ("a.png", image, "image/png"))]
                ).status_code
                for _ in range(5)
            ]
        finally:
            for sock in held:
                sock.close()
    assert codes == [200] * 5, codes
