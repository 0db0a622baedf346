"""The session host's process: started by the CLI's parent before the workers, stopped after them.

:func:`start_host` spawns it, waits until it has loaded and warmed up the model and returns a
:class:`HostHandle` (where it listens, its key, the process). The workers learn the address and
key from the environment (:data:`ADDRESS_ENV`, :data:`KEY_ENV`). The host exits when the
parent's end of a pipe closes: when :meth:`HostHandle.stop` closes it, or when the parent dies
without a word; it ignores SIGINT and SIGTERM, which go to the whole process group, so that it
outlives the workers' drain. It shows as :data:`PROCESS_NAME` in ``ps``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import secrets
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from service.runtime.session_host import SessionHost, or_exit

__all__ = ["ADDRESS_ENV", "KEY_ENV", "PROCESS_NAME", "HostHandle", "start_host"]

log = logging.getLogger("service.host_process")  # stable for logging configs

#: The environment variables that tell a worker where the host listens, and its key.
ADDRESS_ENV = "_SMSO_SESSION_HOST"
KEY_ENV = "_SMSO_SESSION_HOST_KEY"
#: The host process's name, as ``ps`` shows it (Linux).
PROCESS_NAME = "smso-host"


def _name_process(name: bytes) -> None:
    """The process's name in ``/proc/<pid>/comm`` (Linux ``prctl(PR_SET_NAME)``); elsewhere
    nothing."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)


def _exit_with_parent(parent: Connection) -> None:
    """Exit once the parent closes its end of the pipe: it stopped the host, or it is gone
    (killed, crashed), when nothing else would end this process and free the GPU."""
    with contextlib.suppress(EOFError, OSError):
        parent.recv()
    os._exit(0)


def _host_main(
    path: str, options: Any, address: str, key: bytes, parent: Connection, busy: Any = None
) -> None:
    """The host process: load, warm up every bucket, listen, say so to the ``parent``, serve
    until the parent closes the pipe. Ctrl-C and SIGTERM to the process group are left to the
    parent, which stops the host after the workers have answered what they hold."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _name_process(PROCESS_NAME.encode())  # what ps and top show
    from service.runtime.backend import OnnxBackend, warm_up_inputs

    try:
        backend = OnnxBackend(path, options)
        for images in warm_up_inputs(backend.card.input, backend.warmup_batches):
            backend.run(images)
        listener = Listener(address, "AF_UNIX", authkey=key)
    except Exception as error:
        parent.send(("error", f"{type(error).__name__}: {' '.join(str(error).split())}"))
        return
    host = SessionHost(backend, max_batch=options.max_batch, listener=listener, busy=busy)
    threading.Thread(target=host.accept_forever, daemon=True).start()
    parent.send(("ok", list(backend.providers)))
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    with or_exit("the batching thread"):
        host.serve_forever()


@dataclass(kw_only=True)
class HostHandle:
    """A running host: where it listens, its key, its process and providers, and the pipe
    whose closing stops it."""

    address: str
    key: bytes
    process: multiprocessing.process.BaseProcess
    providers: list[str]
    folder: tempfile.TemporaryDirectory[str]
    pipe: Connection
    stopping: bool = False  # stop() was called
    died: bool = False  # it exited on its own while serving (the CLI's watcher says so)
    #: ``time.monotonic()`` when its running round started, 0 between rounds (shared memory)
    busy: Any = None

    def stuck_for(self) -> float:
        """Seconds the round now running has taken (0 between rounds)."""
        started = self.busy.value if self.busy is not None else 0.0
        return time.monotonic() - started if started else 0.0

    @property
    def environment(self) -> dict[str, str]:
        """What the worker processes need in their environment to use the host."""
        return {ADDRESS_ENV: self.address, KEY_ENV: self.key.hex()}

    def stop(self) -> None:
        """Stop the host (it exits when the pipe closes; killed after 20 s) and remove its
        socket's folder."""
        self.stopping = True
        self.pipe.close()
        self.process.join(20)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.folder.cleanup()


def start_host(path: str | Path, options: Any, timeout_s: float = 900) -> HostHandle:
    """Start the host process on the model file ``path`` with the backend ``options``
    (:class:`service.runtime.backend.BackendOptions`) and wait until it has loaded and warmed up the
    model (TensorRT may build engines: ``timeout_s``). Raises ``ValueError`` with the host's
    reason where it could not load the model, ``TimeoutError`` past ``timeout_s``."""
    folder = tempfile.TemporaryDirectory(prefix="smso-session-host-")
    os.chmod(folder.name, 0o700)
    address = str(Path(folder.name) / "socket")
    key = secrets.token_bytes(32)
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe()
    busy = context.Value("d", 0.0, lock=False)  # one float written by the host, read here
    process = context.Process(
        target=_host_main,
        args=(str(path), options, address, key, theirs, busy),
        name="smso-session-host",
        daemon=True,
    )
    process.start()
    theirs.close()
    handle = HostHandle(
        address=address, key=key, process=process, providers=[], folder=folder, pipe=mine, busy=busy
    )
    try:
        if not mine.poll(timeout_s):
            raise TimeoutError(f"the session host did not load {path} within {timeout_s:.0f} s")
        status, detail = mine.recv()
    except EOFError:
        handle.stop()
        raise ValueError(f"the session host exited while loading {path}") from None
    except BaseException:
        handle.stop()
        raise
    if status != "ok":
        handle.stop()
        raise ValueError(detail)
    handle.providers = detail
    return handle
