"""The one server launcher: a server in a subprocess on a free loopback port, ready, then stopped.

:class:`Server` runs a command (``{port}`` in it replaced by a free port) in a process group of
its own, from the repository's root, waits until ``ready`` answers 200 (:meth:`~Server.pause`
and :meth:`~Server.resume` stop and continue all its processes: the group, and descendants that
left it) and, on :meth:`~Server.stop`
(or at the end of its ``with``), sends SIGTERM to the group, then SIGKILL to whatever outlived
the leader (a worker left running would keep the port, and the GPU, from the next server).
Its output goes to ``log`` (a file) or to this process's. The servers:

* :func:`smso_serve`: the real server, ``smso-serve`` as ``python -m service.cli``, with
  ``SMSO_*`` settings over this environment (warnings only and no gRPC unless asked);
* :func:`standin`: the same server on the GPU-like stand-in backend (``bench.standin``);
* :func:`bare`: a bare FastAPI app on the same uvicorn that only reads requests
  (:mod:`bench.lib.bare`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import httpx

from bench.lib import ROOT
from bench.lib.procfs import CpuMeter, group_pids, rss_mib, wait_idle

HOST = "127.0.0.1"


def free_port() -> int:
    """A loopback port free now (the OS's pick)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, process: subprocess.Popen[Any], timeout_s: float = 300) -> None:
    """Until ``url`` answers 200; raises if ``process`` exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s:.0f} s")


class Server:
    """``command`` on a free port, ready when constructed: ``base`` (its URL), ``port``,
    ``process``, ``ready_s`` (seconds from start until ``ready`` answered)."""

    def __init__(
        self,
        command: Sequence[str],
        ready: str = "/readyz",
        env: Mapping[str, str] | None = None,
        log: Path | IO[Any] | None = None,
        timeout_s: float = 300,
        stop_s: float = 60,
    ) -> None:
        self.port = free_port()
        self.base = f"http://{HOST}:{self.port}"
        self.stop_s = stop_s
        self._log = log.open("w") if isinstance(log, Path) else None
        output = self._log if isinstance(log, Path) else log
        start = time.perf_counter()
        self.process = subprocess.Popen(
            [part.replace("{port}", str(self.port)) for part in command],
            cwd=ROOT,
            env=os.environ if env is None else env,
            stdout=output,
            stderr=None if output is None else subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_ready(f"{self.base}{ready}", self.process, timeout_s)
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.perf_counter() - start

    @property
    def pid(self) -> int:
        return self.process.pid

    def pause(self) -> None:
        """SIGSTOP to every process of the server (:func:`~bench.lib.procfs.group_pids`: its
        group, and descendants that lead groups of their own): none runs (nor takes the
        cores) until :meth:`resume`. Its sockets stay open; connections wait."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT to every process of the server, after :meth:`pause`."""
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals, pids: Sequence[int] | None = None) -> None:
        for pid in group_pids(self.pid) if pids is None else pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def settle(self) -> None:
        """Wait until the server has finished what a load left it (requests the load
        generator gave up on at its end, batches in flight): :func:`~bench.lib.procfs.wait_idle`.
        A server paused mid-batch can fail on resuming (PyTriton's Triton did, on ResNet-18)."""
        wait_idle(self.pid)

    def meter(self) -> CpuMeter:
        """A :class:`~bench.lib.procfs.CpuMeter` of the server's processes (its group and
        descendants): their CPU and the machine's busy cores while its ``with`` block runs."""
        return CpuMeter(self.pid)

    def rss_mib(self) -> dict[str, float]:
        """The server process's ``VmRSS`` and ``VmHWM`` (its peak) in MiB."""
        return rss_mib(self.pid)

    def stop(self) -> int:
        """SIGTERM to the group (unless the server has exited already); once the server has
        exited, or after ``stop_s``, SIGKILL to what is left of the group, and of the
        processes the server had started outside it. Its exit status."""
        processes = group_pids(self.pid)
        self._signal(signal.SIGCONT, processes)  # a paused server would not see the SIGTERM
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=self.stop_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self._signal(signal.SIGKILL, [pid for pid in processes if pid != self.pid])
        code = self.process.wait(timeout=20)
        if self._log is not None:
            self._log.close()
        return code

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def server_env(settings: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment, a server's defaults here (warnings only, no gRPC port), ``settings``."""
    defaults = {"SMSO_LOG_LEVEL": "warning", "SMSO_GRPC_PORT": "0"}
    return dict(os.environ) | defaults | dict(settings or {})


def smso_serve(
    *args: str,
    settings: Mapping[str, str] | None = None,
    log: Path | IO[Any] | None = None,
    ready: str = "/readyz",
    timeout_s: float = 300,
    stop_s: float = 60,
    module: str = "service.cli",
) -> Server:
    """``smso-serve ARGS --port PORT`` with ``settings`` (``SMSO_*``) in its environment."""
    command = [sys.executable, "-m", module, *args, "--port", "{port}"]
    return Server(command, ready, server_env(settings), log, timeout_s, stop_s)


def standin(*args: str, settings: Mapping[str, str] | None = None) -> Server:
    """:func:`smso_serve` on the GPU-like stand-in backend (``python -m bench.standin``)."""
    return smso_serve(*args, settings=settings, module="bench.standin")


def bare() -> Server:
    """The bare app (:mod:`bench.lib.bare`) on uvicorn, as the service runs."""
    command = [sys.executable, "-m", "uvicorn", "--factory", "bench.lib.bare:create_app"]
    command += ["--port", "{port}", "--log-level", "warning"]
    return Server(command, "/docs")
