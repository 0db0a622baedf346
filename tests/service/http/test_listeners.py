"""The ports smso-serve binds before it serves: a port that cannot be had is one line that
says which, why, and how to choose another (ports that are free now)."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from service.core.settings import Settings
from service.http.listeners import bind_ports, worker_listeners


@pytest.fixture
def taken() -> Iterator[list[int]]:
    """Two ports on loopback that another socket listens on."""
    socks = []
    for _ in range(2):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        socks.append(sock)
    yield [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()


def _refusal(**settings: Any) -> str:
    with pytest.raises(OSError, match="cannot listen on") as refused:
        bind_ports(Settings(**settings))
    message = str(refused.value)
    assert "\n" not in message
    return message


def _bindable(port: int) -> bool:
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def test_a_taken_http_port_says_how_to_choose_another(taken):
    message = _refusal(port=taken[0], grpc_port=0)
    assert message.startswith(f"cannot listen on 127.0.0.1:{taken[0]} (HTTP): ")
    assert "another smso-serve may already be running" in message
    (suggested,) = re.findall(r"SMSO_PORT=(\d+) make serve, or smso-serve --port (\d+)$", message)
    assert suggested[0] == suggested[1]
    assert _bindable(int(suggested[0]))
    assert "gRPC" not in message


def test_a_taken_grpc_port_says_how_to_choose_another_or_turn_grpc_off(taken):
    with socket.socket() as free:  # a port nobody listens on, for HTTP
        free.bind(("127.0.0.1", 0))
        http = free.getsockname()[1]
    message = _refusal(port=http, grpc_port=taken[1])
    assert message.startswith(f"cannot listen on 127.0.0.1:{taken[1]} (gRPC): ")
    assert re.search(r"SMSO_GRPC_PORT=\d+ make serve, or smso-serve --grpc-port \d+", message)
    assert "SMSO_GRPC_PORT=0 or --grpc-port 0 turns gRPC off" in message
    assert "SMSO_PORT=" not in message


def test_both_ports_taken_are_one_line_with_two_free_ports(taken):
    """Another smso-serve with the same settings holds both: both named at once."""
    message = _refusal(port=taken[0], grpc_port=taken[1])
    assert message.startswith(
        f"cannot listen on 127.0.0.1:{taken[0]} (HTTP) and 127.0.0.1:{taken[1]} (gRPC): "
    )
    (http, grpc) = re.findall(r"SMSO_PORT=(\d+) SMSO_GRPC_PORT=(\d+) make serve", message)[0]
    assert f"smso-serve --port {http} --grpc-port {grpc}" in message
    assert http != grpc
    assert all(_bindable(int(port)) for port in (http, grpc))
    assert not {int(http), int(grpc)} & set(taken)


def test_a_host_that_is_not_this_machines_says_so():
    message = _refusal(host="192.0.2.1", port=0, grpc_port=0)  # TEST-NET-1: nobody's address
    assert "'192.0.2.1' is no address of this machine" in message
    assert "SMSO_HOST or --host" in message


def test_the_bound_socket_is_not_yet_listening_and_the_grpc_port_is_let_go():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        grpc = free.getsockname()[1]
    listener = bind_ports(Settings(port=0, grpc_port=grpc))
    try:
        assert listener.get_inheritable()  # for the worker processes of --workers
        assert not listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        assert _bindable(grpc)
    finally:
        listener.close()


def _accepted(sock: socket.socket) -> int:
    """How many connections ``sock`` has queued (accepting and closing each)."""
    sock.setblocking(False)
    count = 0
    while True:
        try:
            connection, _ = sock.accept()
        except BlockingIOError:
            return count
        connection.close()
        count += 1


def test_the_workers_sockets_share_the_port_and_the_kernel_shares_the_connections():
    listeners = worker_listeners(bind_ports(Settings(host="127.0.0.1", port=0, grpc_port=0)), 2)
    try:
        port = listeners[0].getsockname()[1]
        assert [sock.getsockname()[1] for sock in listeners] == [port, port]
        assert all(sock.get_inheritable() for sock in listeners)
        assert not _bindable(port)  # only these sockets share it
        for sock in listeners:
            sock.listen(128)
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(64)]
        counts = [_accepted(sock) for sock in listeners]
        for client in clients:
            client.close()
        assert sum(counts) == 64
        assert min(counts) > 0  # by a hash of each client's port: 2**-63 odds of none
    finally:
        for sock in listeners:
            sock.close()


def test_a_port_that_another_process_shares_out_is_refused(taken: list[int]):
    """A plain bind (:func:`bind_ports`) refuses a port that others hold with
    ``SO_REUSEPORT`` even where they let anyone share it, as another smso-serve's workers do."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        message = _refusal(port=other.getsockname()[1], grpc_port=0)
    assert "Address already in use" in message
