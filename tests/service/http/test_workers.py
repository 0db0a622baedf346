"""The worker processes of ``smso-serve --workers``: each on its own listening socket, kept
running, replaced when one exits, all stopped when one cannot start, and stopped (listening
sockets first) on request. The workers here are the standard library's own functions, quick
to spawn."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.settings import Settings
from service.http.listeners import bind_ports, worker_listeners
from service.http.workers import STARTUP_FAILURE, Workers

ROOT = Path(__file__).resolve().parents[3]
PATIENCE_S = 60.0  # a bound on a loaded machine's pauses (spawning takes a while), never a measure


def _running(workers: Workers) -> threading.Thread:
    thread = threading.Thread(target=workers.run, daemon=True)  # not the main thread: no signals
    thread.start()
    return thread


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _workers() -> list[multiprocessing.process.BaseProcess]:
    return [child for child in multiprocessing.active_children() if child.name == "smso-worker"]


def _socket_files(pid: int) -> set[str]:
    """The sockets process ``pid`` holds open, as ``/proc`` names them (``socket:[inode]``)."""
    files = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            files.add(os.readlink(fd))
    return {name for name in files if name.startswith("socket:")}


def test_each_worker_serves_its_own_socket_and_stop_closes_them_all():
    listeners = worker_listeners(bind_ports(Settings(host="127.0.0.1", port=0, grpc_port=0)), 2)
    for sock in listeners:
        sock.listen()
    ours = [os.readlink(f"/proc/self/fd/{sock.fileno()}") for sock in listeners]
    workers = Workers(socket.socket.accept, (), 2, listeners=listeners)  # accept(its socket)
    thread = _running(workers)
    _until(lambda: len(_workers()) == 2, "the workers never started")
    children = _workers()
    pids = [child.pid for child in children if child.pid is not None]  # (pid: while alive)
    held = [set(ours) & _socket_files(pid) for pid in pids]
    workers.stop()
    thread.join(PATIENCE_S)
    assert not thread.is_alive()
    assert sorted(held, key=sorted) == sorted(({name} for name in ours), key=sorted)
    assert [sock.fileno() for sock in listeners] == [-1, -1]  # the port refuses connections
    assert [child.exitcode for child in children] == [-15, -15]  # SIGTERM, for them to drain
    assert not workers.failed


def test_the_listening_sockets_are_one_per_worker():
    with (
        socket.socket() as one,
        pytest.raises(ValueError, match="2 workers need 2 listening sockets, not 1"),
    ):
        Workers(socket.socket.accept, (), 2, listeners=[one])


def test_a_worker_that_exits_is_replaced(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING, "service.http.workers")
    workers = Workers(sys.exit, (1,), 1)
    thread = _running(workers)
    try:
        _until(lambda: len(caplog.records) >= 2, "a worker that exited was not replaced")
    finally:
        workers.stop()
        thread.join(PATIENCE_S)
    assert "exited (status 1): starting another" in caplog.records[0].getMessage()
    assert not workers.failed


@pytest.mark.parametrize("count", [1, 2])
def test_a_worker_that_cannot_start_stops_them_all(caplog: pytest.LogCaptureFixture, count: int):
    """Exit status 3 (uvicorn's for a server that failed to start) would recur in a
    replacement: the workers are stopped, none replaced, and ``failed`` says why."""
    caplog.set_level(logging.WARNING, "service.http.workers")
    workers = Workers(sys.exit, (STARTUP_FAILURE,), count)
    thread = _running(workers)
    thread.join(PATIENCE_S)
    assert not thread.is_alive()
    assert workers.failed
    assert [record.getMessage().split()[-1] for record in caplog.records] == ["stopping"]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from ``/proc``: seen from their ``fork`` on)."""
    with contextlib.suppress(OSError):
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def test_a_worker_leaves_sigint_to_the_supervisor_from_its_first_instant():
    """A terminal's Ctrl-C reaches every process of the group. Sent to a worker again and again
    from the moment it exists (its interpreter still starting, then running its target), it
    changes nothing: the worker stops only on the supervisor's SIGTERM, and nothing prints a
    traceback. (Spawned with SIGINT at its default, the first one during start-up is a
    ``KeyboardInterrupt``.) The supervisor runs in a process's main thread, as smso-serve's."""
    script = (
        "import time; from service.http.workers import Workers; "
        "Workers(time.sleep, (600,), 1).run()"
    )
    supervisor = subprocess.Popen(
        [sys.executable, "-c", script], stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        _until(lambda: bool(_children(supervisor.pid)), "no worker")
        first = set(_children(supervisor.pid))
        deadline = time.monotonic() + 1.5  # the start-up (spawn: a fresh interpreter) and after
        while time.monotonic() < deadline:
            for child in _children(supervisor.pid):  # the worker (and spawn's resource tracker)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGINT)
            time.sleep(0.002)
        assert first <= set(_children(supervisor.pid))  # the same worker, not a replacement
        supervisor.send_signal(signal.SIGTERM)
        _, errors = supervisor.communicate(timeout=PATIENCE_S)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
    assert supervisor.returncode == 0
    assert "Traceback" not in errors, errors
