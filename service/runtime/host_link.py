"""The connections between the session host and its workers: :mod:`multiprocessing.connection`
over a Unix socket, authenticated with the host's key, with bounds on how long the socket's
blocking reads and writes may take.

The host listens with ``Listener(address, "AF_UNIX", authkey=key)``. A worker does not connect
with ``Client(address, authkey=key)``, which has no timeout: against a host that accepts
nothing (hung, or stopped), its connect and its handshake's reads block for ever, and with
them the worker's inference thread (tests/service/runtime/test_session_host.py: a host that
does not answer must make a call fail within its timeout, not hang). :func:`connect` does what
``Client`` does, bounded: the connect under a socket timeout, then the same handshake,
``answer_challenge`` and ``deliver_challenge`` (both documented in Python's multiprocessing
docs, "Listeners and Clients"), under the socket's own send and receive timeouts. The one step
the docs do not describe is making a ``Connection`` from the socket's file descriptor (the
class and its methods are documented, its constructor is not): ``Connection(handle)``, as
``Client`` and ``Pipe`` themselves make theirs, and as typeshed declares it. The messages after
the handshake are those of any ``Connection``: no cost on the way of a batch.
"""

from __future__ import annotations

import os
import socket
import struct
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

__all__ = ["connect", "socket_of", "timeval"]


def timeval(seconds: float) -> bytes:
    """``seconds`` as the ``struct timeval`` that ``SO_SNDTIMEO`` and ``SO_RCVTIMEO`` take
    (0: no limit)."""
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1e6))


def _bound(sock: socket.socket, seconds: float) -> None:
    """Send and receive timeouts of the socket itself (0: none), which bound the blocking reads
    and writes of a ``Connection`` on it."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval(seconds))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval(seconds))


def socket_of(connection: Connection) -> socket.socket:
    """A socket on a duplicate of ``connection``'s descriptor, for its options and ``shutdown``
    (closing it leaves ``connection`` open)."""
    return socket.socket(fileno=os.dup(connection.fileno()))


def connect(address: str, key: bytes, timeout_s: float) -> Connection:
    """A connection to the listener at ``address`` (a Unix socket), authenticated both ways
    with ``key`` as ``Client`` does, in at most about ``timeout_s`` for the connect and for
    each read and write of the handshake; then without a limit (the callers poll).

    Raises ``OSError`` (a timeout among them), ``EOFError`` or
    ``multiprocessing.AuthenticationError``.
    """
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.settimeout(timeout_s)
        sock.connect(address)
        sock.settimeout(None)  # blocking again, as Connection reads it; bounded by the system:
        _bound(sock, timeout_s)
        connection = Connection(sock.detach())
    except OSError:
        sock.close()
        raise
    try:
        answer_challenge(connection, key)
        deliver_challenge(connection, key)
        with socket_of(connection) as same:
            _bound(same, 0.0)
    except BaseException:
        connection.close()
        raise
    return connection
