"""The addresses smso-serve listens on: its sockets, bound before the server starts, and the
line that says where to go once they accept connections.

smso-serve binds the HTTP port itself, and checks that the gRPC port is free, rather than leave
it to uvicorn (which logs a failed bind and exits with status 3) or to grpcio: a port that cannot
be had is one line (:func:`bind_ports`) naming each such port, why, and how to choose another.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from service.core.settings import Settings

__all__ = ["BACKLOG", "base_url", "bind_ports", "where_to_go", "worker_listeners"]

#: Connections the kernel queues on the listening socket until the server accepts them
#: (uvicorn's default, given to the server too, so that the queue is the same before it starts
#: and after).
BACKLOG = 2048

#: Where other ports are suggested from, when a port cannot be had.
_SUGGESTED_FROM = 8080
#: The errors that another port cures (taken, or below 1024 without the privilege).
_PORT_ERRORS = frozenset({errno.EADDRINUSE, errno.EACCES})
#: Each door's port: its environment variable and its flag.
_PORT_SETTINGS = {"HTTP": ("SMSO_PORT", "--port"), "gRPC": ("SMSO_GRPC_PORT", "--grpc-port")}


@dataclass(frozen=True)
class _Refused:
    """A port that could not be bound."""

    door: str  # "HTTP" or "gRPC", a key of _PORT_SETTINGS
    port: int
    error: OSError

    @property
    def reason(self) -> str:
        return self.error.strerror or str(self.error)


def bind_ports(settings: Settings) -> socket.socket:
    """The HTTP port's socket, bound (not yet listening; inheritable, for the worker processes
    of ``--workers``), once the gRPC port (unless 0) has been bound and let go as well. The
    app's lifespan binds the gRPC port later with ``SO_REUSEPORT`` (for the workers to share
    it), which would not refuse a port that another process of the same user holds with that
    option too; a plain bind here does.

    Raises ``OSError`` with one line: each port that cannot be had and why, whether another
    smso-serve may hold it, and the settings that choose others (ports free now, suggested)."""
    refused: list[_Refused] = []
    listener = None
    try:
        listener = _bind(settings.host, settings.port)
    except OSError as error:
        if error.errno not in _PORT_ERRORS:  # the host, not the port: the gRPC one fails alike
            raise OSError(_bad_host(settings.host, settings.port, error)) from None
        refused.append(_Refused("HTTP", settings.port, error))
    if settings.grpc_port:
        try:
            _bind(settings.host, settings.grpc_port).close()
        except OSError as error:
            refused.append(_Refused("gRPC", settings.grpc_port, error))
    if refused or listener is None:  # (None: the HTTP port is among those refused)
        if listener is not None:
            listener.close()
        raise OSError(_cannot_listen(settings, refused))
    listener.set_inheritable(True)
    return listener


def worker_listeners(first: socket.socket, count: int) -> list[socket.socket]:
    """``count`` sockets bound to ``first``'s address, ``first`` among them (bound, not yet
    listening; inheritable): one for each worker process of ``--workers``.

    All of them carry ``SO_REUSEPORT``, so once they listen the kernel hands each new
    connection to one of them by a hash of the client's address and port: every worker gets
    its share. On one shared listening socket, a worker woken for a burst of connections
    accepts until none is left (uvicorn's event loop does), and one worker could hold all 16
    of a load's connections while another idled. ``first`` was bound without the option
    (:func:`bind_ports`), so a process that already held the port with it was refused then;
    setting it after the bind lets only these sockets share the port, and a plain bind by
    anyone else is still refused.

    The trade: a worker that exits keeps its socket, held by the supervisor for the worker
    started in its place, and the connections the kernel hashes to it meanwhile wait in its
    queue for that one instead of going to the others. Raises ``OSError`` with one line, all
    of them (``first`` too) closed, where the address cannot be shared."""
    host, port = first.getsockname()[:2]
    sockets = [first]
    try:
        first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        for _ in range(count - 1):
            sockets.append(_bind(host, port, shared=True))
            sockets[-1].set_inheritable(True)
    except OSError as error:
        for sock in sockets:
            sock.close()
        reason = error.strerror or str(error)
        raise OSError(f"cannot share port {port} among {count} workers: {reason}") from None
    return sockets


def _bind(host: str, port: int, shared: bool = False) -> socket.socket:
    """A socket bound to ``host:port``; ``shared``: with ``SO_REUSEPORT``, beside others that
    have it (:func:`worker_listeners`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _bad_host(host: str, port: int, error: OSError) -> str:
    reason = error.strerror or str(error)
    message = f"cannot listen on {host}:{port}: {reason}"
    if isinstance(error, socket.gaierror) or error.errno == errno.EADDRNOTAVAIL:
        message += (
            f" ({host!r} is no address of this machine; choose one with SMSO_HOST or --host: "
            "127.0.0.1 for this machine only, 0.0.0.0 for every address)"
        )
    return message


def _cannot_listen(settings: Settings, refused: list[_Refused]) -> str:
    """``cannot listen on 127.0.0.1:8000 (HTTP): Address already in use; another smso-serve
    may already be running. Choose another port: SMSO_PORT=8080 make serve, or smso-serve
    --port 8080``, for every port refused (one line)."""
    where = " and ".join(f"{settings.host}:{r.port} ({r.door})" for r in refused)
    reasons = "; ".join(dict.fromkeys(r.reason for r in refused))
    message = f"cannot listen on {where}: {reasons}"
    if any(r.error.errno == errno.EADDRINUSE for r in refused):
        message += "; another smso-serve may already be running"
    taken = {settings.port, settings.grpc_port}
    others = _free_ports(settings.host, len(refused), avoid=taken)
    chosen = list(zip(refused, others, strict=True))
    variables = " ".join(f"{_PORT_SETTINGS[r.door][0]}={port}" for r, port in chosen)
    flags = " ".join(f"{_PORT_SETTINGS[r.door][1]} {port}" for r, port in chosen)
    what = "other ports" if len(refused) > 1 else "another port"
    message += f". Choose {what}: {variables} make serve, or smso-serve {flags}"
    if any(r.door == "gRPC" for r in refused):
        message += " (SMSO_GRPC_PORT=0 or --grpc-port 0 turns gRPC off)"
    return message


def _free_ports(host: str, count: int, avoid: set[int]) -> list[int]:
    """``count`` ports from :data:`_SUGGESTED_FROM` up that can be bound on ``host`` now (the
    first ones past ``avoid`` where fewer are free among the next hundred)."""
    candidates = [p for p in range(_SUGGESTED_FROM, _SUGGESTED_FROM + 100) if p not in avoid]
    free = []
    for port in candidates:
        try:
            _bind(host, port).close()
        except OSError:
            continue
        free.append(port)
        if len(free) == count:
            return free
    return (free + [p for p in candidates if p not in free])[:count]


def base_url(settings: Settings, listener: socket.socket) -> str:
    """The service's URL: ``http://127.0.0.1:8000``. A wildcard host (``0.0.0.0``, ``::``)
    listens everywhere but is no address to open: the loopback one is named instead."""
    shown = _shown_host(settings.host)
    port = listener.getsockname()[1]
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def _shown_host(host: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def where_to_go(settings: Settings, listener: socket.socket) -> str:
    """For the start-up line: the service's address and where its API docs are (or why not)."""
    host, shown, base = settings.host, _shown_host(settings.host), base_url(settings, listener)
    everywhere = f" (listening on {host or 'every address'})" if shown != host else ""
    grpc = settings.grpc_port
    where = f"[{shown}]:{grpc}" if ":" in shown else f"{shown}:{grpc}"
    doors = f"{base}{everywhere}, gRPC on {where}" if grpc else f"{base}{everywhere}, no gRPC"
    if settings.api_key is None or settings.docs_public:
        return f"{doors} - API docs at {base}/docs"
    return f"{doors} - API docs closed (SMSO_API_KEY is set; SMSO_DOCS_PUBLIC=true opens /docs)"
