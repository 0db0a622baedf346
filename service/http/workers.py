"""Several server processes on one port (``smso-serve --workers N``), each on a listening
socket of its own (:func:`service.http.listeners.worker_listeners`).

uvicorn's own supervisor (``uvicorn.run(..., workers=N)``) runs a plain ``uvicorn.Server`` in
each worker and has no setting for another server class, so its workers could not drain as
:class:`service.http.drain.DrainingServer` does. :class:`Workers` is the part of a supervisor
the service needs, on :mod:`multiprocessing` alone: it starts the workers (spawned: each
builds its own app and server, as the single process does) with a metrics folder they share,
so that ``/metrics`` from any of them combines every worker's values (prometheus_client's
multiprocess mode), starts another in place of one that exits, and on SIGTERM or SIGINT (or
:meth:`Workers.stop`) closes its own copies of the listening sockets, so that the port refuses
new connections once the workers stop accepting instead of queueing them for nobody, sends
every worker SIGTERM and waits for each to drain. A worker started in place of one that exited
serves the socket its predecessor served.

The workers leave SIGINT to the supervisor: a terminal's Ctrl-C reaches every process of its
group, and a worker that acted on it as well as on the supervisor's SIGTERM would take the
second signal for uvicorn's "force quit" (no drain), or die of ``KeyboardInterrupt`` while
still importing. A worker is spawned with SIGINT ignored (inherited through ``exec``) and
ignores it for good (:func:`_run_worker`), so only SIGTERM stops it.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.process import BaseProcess
from typing import Any

from service.telemetry.metrics import MULTIPROC_ENV

__all__ = ["STARTUP_FAILURE", "Workers", "inherited"]

log = logging.getLogger(__name__)

#: The exit status of a server whose start failed (uvicorn's own, ``uvicorn.config``): a
#: worker that ends so would fail again in its place, so the workers are stopped instead.
STARTUP_FAILURE = 3


class Workers:
    """``count`` processes: worker ``i`` runs ``target(listeners[i], *args)`` where there are
    ``listeners`` (one per worker), ``target(*args)`` where there are none."""

    def __init__(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...],
        count: int,
        listeners: Sequence[socket.socket] = (),
    ) -> None:
        if listeners and len(listeners) != count:
            given = len(listeners)
            raise ValueError(f"{count} workers need {count} listening sockets, not {given}")
        self.target, self.args, self.count, self.listeners = target, args, count, listeners
        #: a worker could not start (exit status :data:`STARTUP_FAILURE`): the others were stopped
        self.failed = False
        self._stopping = threading.Event()
        self._spawn = multiprocessing.get_context("spawn")

    def stop(self) -> None:
        """Stop the workers as SIGTERM does (from any thread); :meth:`run` then returns."""
        self._stopping.set()

    def run(self) -> None:
        """Start the workers and keep ``count`` of them running until stopped; then stop
        listening, send each SIGTERM and wait until all have exited. SIGTERM and SIGINT stop
        them while this runs (in the main thread). Their metrics folder (a temporary one,
        in :data:`~service.telemetry.metrics.MULTIPROC_ENV`) is gone afterwards."""
        with (
            tempfile.TemporaryDirectory(prefix="smso-metrics-") as folder,
            inherited({MULTIPROC_ENV: folder}),
        ):
            self._supervise()

    def _supervise(self) -> None:
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                handlers[sig] = signal.signal(sig, lambda *_: self.stop())
        processes: list[BaseProcess] = []
        try:
            processes = [self._start(number) for number in range(self.count)]
            while not self._stopping.wait(0.5):
                for number, process in enumerate(processes):
                    if process.exitcode is None:
                        continue
                    if process.exitcode == STARTUP_FAILURE:
                        log.error("worker process %d failed to start: stopping", process.pid)
                        self.failed = True
                        self.stop()
                        break
                    log.warning(
                        "worker process %d exited (status %s): starting another",
                        process.pid,
                        process.exitcode,
                    )
                    processes[number] = self._start(number)  # on the same socket
        finally:
            for sock in self.listeners:
                sock.close()
            for process in processes:
                if process.exitcode is None:
                    process.terminate()  # SIGTERM: it drains
            for process in processes:
                process.join()
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def _start(self, number: int) -> BaseProcess:
        """Worker ``number`` (from 0), on its listening socket where there are some."""
        args = (self.listeners[number], *self.args) if self.listeners else self.args
        process = self._spawn.Process(
            target=_run_worker, args=(os.getpid(), self.target, args), name="smso-worker"
        )
        with _sigint_ignored_by_new_processes():  # ignored from the worker's first instant
            process.start()
        return process


@contextlib.contextmanager
def inherited(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` (which the worker processes inherit) for the duration, then
    the environment as it was: no metrics folder that no longer exists left behind."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _sigint_ignored_by_new_processes() -> Iterator[None]:
    """SIGINT's disposition is ``SIG_IGN`` for the duration, with SIGINT blocked in the calling
    thread. A disposition of ``SIG_IGN`` survives ``exec``, and a new interpreter installs its
    ``KeyboardInterrupt`` handler only where SIGINT was at its default, so a process spawned
    meanwhile ignores SIGINT from its first instant (a blocked mask would not do: the new
    interpreter starts with every signal unblocked). Linux keeps a signal that arrives while
    blocked pending even while it is ignored, so a Ctrl-C meanwhile reaches the handler put
    back (unless the kernel hands it to another of this process's threads in those
    microseconds). Handlers can be set in the main thread only: elsewhere (a test's) nothing
    changes, and the worker ignores SIGINT from :func:`_run_worker` on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if handler is None else handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _run_worker(parent: int, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """A worker process: ``target(*args)``, with a thread that ends it once ``parent`` is
    gone. SIGINT is ignored (the supervisor stops the workers with SIGTERM): already so where
    the supervisor spawned it from its main thread, and from here on in any case."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch = threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True)
    watch.start()
    target(*args)


def _exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    """SIGTERM to this worker (it drains and exits) once its parent has exited: a supervisor
    killed with SIGKILL (or by the OOM killer) cannot stop its workers, which would otherwise
    go on serving its port with nobody to stop them."""
    while os.getppid() == parent:
        time.sleep(every_s)
    log.warning("the supervising process %d is gone: stopping this worker", parent)
    os.kill(os.getpid(), signal.SIGTERM)
