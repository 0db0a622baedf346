"""``smso-serve``: start the service with uvicorn.

Every setting is a flag (``--max-batch-size 32``) or an environment variable with the prefix
``SMSO_`` (``SMSO_MAX_BATCH_SIZE=32``); flags win. Settings are validated once, here: a wrong
one prints one line saying what is accepted and exits with status 2, and so does a port that
is taken (:mod:`service.http.listeners`: the line says how to choose another). Once its port
accepts connections it logs where to go (the address, and the API docs at ``/docs`` where they
are served), and once ``/readyz`` answers 200 (the models loaded and warmed up) that it is
ready. SIGTERM (or Ctrl-C) stops taking new connections, answers the requests in flight and
exits with status 0 (a second Ctrl-C cuts the drain short: status 1).

With ``--workers N`` (N > 1; the default, ``auto``, is one per usable core on the CPU, at most
``--max-auto-workers``, and one on a GPU) N server processes (:mod:`service.http.workers`) serve the
one port, each loading the model with its own session, batcher and decode threads, and each draining
on SIGTERM as the single server does; a worker that exits is replaced; ``/metrics`` combines their
values (prometheus_client's multiprocess mode, in a temporary folder). With ``--shared-session
true`` a session host process loads the model first and the workers hand it their batches
(:mod:`service.runtime.session_host`): one session and one CUDA context for all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import logging
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.synchronize import Semaphore as ProcessSemaphore
from typing import Any

import numpy as np
from pydantic import SecretStr, ValidationError

from service.app import app_from_environment, create_app
from service.core.card import CardError
from service.core.settings import Settings, unknown_variables
from service.dataplane.state import ServiceState
from service.http.connections import ServerConfig
from service.http.drain import DrainingServer
from service.http.listeners import BACKLOG, base_url, bind_ports, where_to_go, worker_listeners
from service.http.workers import Workers, inherited
from service.models.loader import STOPPING_S
from service.runtime.backend import BackendOptions, OnnxBackend, read_card
from service.runtime.host_process import HostHandle, start_host
from service.runtime.providers import (
    TENSORRT,
    check_providers,
    prepare_engine_cache,
    runs_on_gpu,
)
from service.telemetry.logs import configure_logging
from service.telemetry.tracing import check_tracing

__all__ = ["main"]

log = logging.getLogger("service")


#: Shorter flags some settings also answer to, beside ``--name``: ``--gallery GALLERY``.
FLAG_ALIASES = {"gallery_path": ("--gallery",)}


def parse_args(argv: Sequence[str] | None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="smso-serve", description=__doc__.splitlines()[0])
    for name, field in Settings.model_fields.items():
        flags = ["--" + name.replace("_", "-"), *FLAG_ALIASES.get(name, ())]
        env = "SMSO_" + name.upper()
        help_text = f"{field.description or name} (env {env}; default: {field.default})"
        if name == "api_key":
            help_text = f"{field.description} (env {env}; prefer the environment for secrets)"
        parser.add_argument(*flags, dest=name, default=None, help=help_text)
    args = parser.parse_args(argv)
    return {k: v for k, v in vars(args).items() if v is not None}


def _is_secret(field: str) -> bool:
    """Whether the setting holds a secret (an API key), whose value no message may repeat."""
    info = Settings.model_fields.get(field)
    hint = None if info is None else info.annotation
    return hint is SecretStr or SecretStr in typing.get_args(hint)


def _one_line(error: ValidationError, flags: Iterable[str] = ()) -> str:
    """Each refused setting as the user gave it: ``--max-batch-size 'abc'`` for a flag,
    ``SMSO_MAX_BATCH_SIZE='abc'`` for the environment, then what is wrong with it."""
    parts = []
    for item in error.errors():
        message = item["msg"].removeprefix("Value error, ")  # pydantic's, for our own checks
        if not item["loc"]:  # a check across settings
            parts.append(f"settings: {message}")
            continue
        field = str(item["loc"][0])
        where = f"--{field.replace('_', '-')} " if field in flags else f"SMSO_{field.upper()}="
        given = item.get("input")
        blank = isinstance(given, str) and not given.strip()  # no secret in it to hide
        value = "'***'" if _is_secret(field) and not blank else repr(given)
        parts.append(f"{where}{value}: {message}")
    return "; ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``smso-serve``. A Ctrl-C before the server has taken the signals (while
    the model is checked, say) ends it as the signal would, without a traceback."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # dies of it, as a shell and make expect
        return 128 + signal.SIGINT


def _main(argv: Sequence[str] | None) -> int:
    overrides = parse_args(argv)
    _cap_malloc_arenas()
    try:
        settings = Settings(**overrides)
        check_tracing()
        _check_decoding(settings)
    except ValidationError as error:
        print(f"smso-serve: error: {_one_line(error, overrides)}", file=sys.stderr)
        return 2
    except ValueError as error:
        print(f"smso-serve: error: {error}", file=sys.stderr)
        return 2
    # workers=auto resolved once, here: the workers are each given the number
    auto = settings.workers == "auto"
    processes = settings.worker_processes(gpu=runs_on_gpu(settings.providers))
    settings = settings.model_copy(update={"workers": processes})
    configure_logging(settings.log_level, settings.log_format, process=processes > 1)
    for message in unknown_variables(os.environ):
        log.warning(message)
    if processes > 1:
        return _serve_workers(settings, overrides, processes, auto)
    try:
        # bind, load and run the model once here, before the server starts: a taken port, a bad
        # model file or a model that loads but cannot run is one line and exit status 2
        listener = bind_ports(settings)
    except OSError as error:
        print(f"smso-serve: error: {error}", file=sys.stderr)
        return 2
    backend = None
    if settings.model_repository is None:  # a repository's models are each loaded, or
        try:  # unavailable with their reason, while the server runs
            backend = OnnxBackend(settings.model_path, BackendOptions.from_settings(settings))
            _check_default_model(settings, backend.card.name)
            _try_once(backend, settings.model_path, settings.load_timeout_s)
        except (CardError, ValueError, ModelCannotRunError) as error:
            listener.close()
            print(f"smso-serve: error: {error}", file=sys.stderr)
            return 2
    app = create_app(settings, backend)
    config = _config(settings, app)
    state = app.state.smso
    ready_line = _ready_line(settings, listener)
    server = _Server(
        config,
        on_drain=lambda: setattr(state, "draining", True),
        where="SMSO service listening on " + where_to_go(settings, listener),
        when_ready=WhenReady(ready=lambda: _serves(state), then=lambda: log.info(ready_line)),
    )
    try:
        server.run(sockets=[listener])
    except SystemExit as stop:  # uvicorn exits itself when the app's lifespan fails to start
        return stop.code if isinstance(stop.code, int) else 1
    finally:
        listener.close()
    return 0 if server.started and not server.force_exit else 1


def _ready_line(settings: Settings, listener: socket.socket) -> str:
    """The line logged once /readyz first answers 200 (the models loaded and warmed up)."""
    return f"SMSO service ready: {base_url(settings, listener)}/readyz answers 200"


def _serves(state: ServiceState) -> bool:
    """Whether the app's /readyz answers 200: its models ready, and not draining."""
    return not state.draining and state.registry.readiness() == "ready"


@dataclass(frozen=True)
class WhenReady:
    """What a server does once its app is ready: ``ready()`` is polled on the event loop every
    :data:`READY_POLL_S` from the moment the server listens, and ``then()`` called once, the
    first time it holds (the start-up's "ready" line, or a worker telling its supervisor)."""

    ready: Callable[[], bool]
    then: Callable[[], None]


#: How often a server asks whether its app has become ready (a call on the event loop).
READY_POLL_S = 0.05


#: The signals that stop smso-serve (uvicorn's own: Ctrl-C, and SIGTERM from a supervisor).
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Server(DrainingServer):
    """The server as smso-serve runs it, alone or in each worker process: logs ``where`` (if
    given) once it listens, tells ``when_ready`` (if given) once its app is ready, and after the
    drain that SIGTERM or Ctrl-C started, returns instead of dying of that signal. uvicorn
    raises each signal it caught again once it has shut down, after putting back the handlers
    it found (the process would end killed by it, and ``make serve`` print "Interrupt" or
    "Error 130" for a clean stop); the handlers it finds are :meth:`run`'s, which ignore a
    signal raised again, and stop a server that it has not yet started (a signal that came
    before uvicorn took them). Signals outside ``stop_signals`` are left alone: a worker of
    ``--workers`` stops on SIGTERM only (its supervisor turns a Ctrl-C into SIGTERM; the
    group's SIGINT as well would be a second signal, uvicorn's "force quit")."""

    def __init__(
        self,
        config: ServerConfig,
        on_drain: Any,
        *,
        where: str | None = None,
        when_ready: WhenReady | None = None,
        stop_signals: tuple[int, ...] = _STOP_SIGNALS,
    ) -> None:
        super().__init__(config, on_drain)
        self.where = where
        self.when_ready = when_ready
        self.stop_signals = stop_signals
        self._watch: asyncio.Task[None] | None = None  # held: the loop keeps weak references

    def handle_exit(self, sig: int, frame: Any) -> None:
        if sig in self.stop_signals:
            super().handle_exit(sig, frame)

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        if threading.current_thread() is not threading.main_thread():  # no signals there
            super().run(sockets)
            return

        def before_or_after(sig: int, frame: Any) -> None:
            if not self.started:
                self.should_exit = True

        found = {sig: signal.signal(sig, before_or_after) for sig in self.stop_signals}
        try:
            super().run(sockets)
        finally:
            for sig, handler in found.items():
                signal.signal(sig, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        if self.where:  # uvicorn logs no address for sockets it was given
            log.info("%s", self.where)
        if self.when_ready is not None:
            watch = self._say_when_ready(self.when_ready)
            self._watch = asyncio.get_running_loop().create_task(watch, name="ready")

    async def _say_when_ready(self, when: WhenReady) -> None:
        while not self.should_exit:
            if when.ready():
                when.then()
                return
            await asyncio.sleep(READY_POLL_S)


def _config(settings: Settings, app: Any) -> ServerConfig:
    """uvicorn's settings for ``app``: address, read bounds, connection limit, drain bound.
    Its loggers go to the service's handler (no logging configuration of its own) and its access
    log is off: :class:`service.http.access_log.AccessLog` writes one line per request instead."""
    return ServerConfig(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,
        access_log=False,
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.request_timeout_s,
        timeout_keep_alive=settings.keep_alive_s,
        # no limit_concurrency: uvicorn's counts idle connections too and answers in plain
        # text; requests in progress are bounded by the app (service.http.inflight_limit)
        timeout_graceful_shutdown=int(settings.request_timeout_s) + 5,
        backlog=BACKLOG,  # as the supervisor of --workers listens before the workers start
    )


class ModelCannotRunError(RuntimeError):
    """The model file loads but its first inference fails (an input renamed, a broken graph)."""


def _try_once(backend: OnnxBackend, path: os.PathLike[str], timeout_s: float) -> None:
    """One inference of a zero image, as the app's warm-up will run; ModelCannotRunError with
    the backend's reason on one line if it fails, or if it has not ended after ``timeout_s``
    (``load_timeout_s``: it is then stopped, in a daemon thread that cannot hold the exit)."""
    spec = backend.card.input
    failure: list[BaseException] = []

    def first_run() -> None:
        try:
            backend.run(np.zeros((1, spec.channels, spec.height, spec.width), np.float32))
        except Exception as error:
            failure.append(error)

    runner = threading.Thread(target=first_run, name="first-run", daemon=True)
    runner.start()
    runner.join(timeout_s)
    if runner.is_alive():
        backend.terminate()
        runner.join(STOPPING_S)  # it ends at its next node (a process exiting under it aborts)
        raise ModelCannotRunError(
            f"{path} did not finish its first run within {timeout_s:g} s "
            "(SMSO_LOAD_TIMEOUT_S; a model that never ends cannot be served)"
        )
    if failure:
        reason = " ".join(str(failure[0]).split()) or type(failure[0]).__name__
        raise ModelCannotRunError(f"{path} loaded but cannot run: {reason}") from None


def _check_runs(settings: Settings) -> None:
    """Load the model and run it once, as a single process does before it serves, then let the
    session go (the workers load their own): a model that loads but cannot run is one line and
    exit status 2 here rather than workers that stay unready."""
    backend = OnnxBackend(settings.model_path, BackendOptions.from_settings(settings))
    try:
        _try_once(backend, settings.model_path, settings.load_timeout_s)
    finally:
        del backend  # its sessions with it
        gc.collect()
        _give_back_freed_memory()


#: glibc's malloc arenas per process at most (``MALLOC_ARENA_MAX``), where the environment does
#: not say. glibc's default, 8 per core, gives each thread that allocates under contention an
#: arena of its own; the server's threads come and go (a load, a warm-up, a batcher per model
#: version), and each arena keeps memory freed in it. Three minutes of the soak (a new version
#: every 6 s under traffic): peak 373 MiB and rising (medians of the thirds 288 -> 356) with
#: glibc's default, 246 MiB and flat (231 -> 207) with 2, at no cost in speed (valid requests'
#: p50 4.9 ms against 5.5, 90,101 answered against 81,318).
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # mallopt's parameter (glibc's malloc.h)


def _cap_malloc_arenas() -> None:
    """At most :data:`MALLOC_ARENAS` malloc arenas in this process from now on, unless
    ``MALLOC_ARENA_MAX`` is set (glibc applies it itself); nothing where the C library is not
    glibc. Called before the server's threads allocate."""
    if "MALLOC_ARENA_MAX" not in os.environ:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, MALLOC_ARENAS)


def _arenas_for_workers() -> dict[str, str]:
    """The environment that gives the worker processes the same cap from their first
    allocation (glibc reads ``MALLOC_ARENA_MAX`` when a process starts)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return {}
    return {"MALLOC_ARENA_MAX": str(MALLOC_ARENAS)}


def _give_back_freed_memory() -> None:
    """glibc's ``malloc_trim(0)``: the freed session's memory back to the system, which the
    parent of the workers would otherwise keep (94 MiB for ResNet-18 at 224 px); nothing
    elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _check_decoding(settings: Settings) -> None:
    """With ``decode_device=cuda``: a ValueError saying what is missing (nvImageCodec,
    onnxruntime's CUDA provider, a GPU) before the server starts."""
    if settings.decode_device != "cpu":
        from service.imaging.gpu_jpeg import (
            check_available,  # needs nvImageCodec: imported only then
        )

        check_available(settings.decode_device)


def _check_default_model(settings: Settings, served: str) -> None:
    """``ValueError`` when ``--default-model`` names another model than the one model file
    served (by its card): /classify would answer 404 and /readyz never 200."""
    if settings.default_model is not None and settings.default_model != served:
        raise ValueError(
            f"--default-model {settings.default_model!r} names no model served here: "
            f"{settings.model_path} serves one model, {served!r} (its card's name); "
            "leave --default-model out, or name that one"
        )


def _serve_workers(
    settings: Settings, overrides: dict[str, Any], processes: int, auto: bool = False
) -> int:
    """``processes`` server processes (resolved from ``auto`` where ``auto``) on one port
    (:class:`Workers`), each on a listening socket of its own (:func:`worker_listeners`: the
    kernel shares the connections out), each loading the model itself from the ``SMSO_*``
    environment (:func:`_serve_worker`); metrics combined through a shared folder. Exit status
    1 where the workers were stopped because the session host died or a worker could not
    start."""
    try:
        # what every worker would refuse (and only log, staying unready): one line and exit
        # status 2 here, as without --workers
        if settings.model_repository is None:
            _check_default_model(settings, read_card(settings.model_path).name)
        if TENSORRT in check_providers(settings.providers):
            prepare_engine_cache(settings.engine_cache)
        # one listening socket per worker, for the kernel to share the connections out
        listeners = worker_listeners(bind_ports(settings), processes)
    except (CardError, OSError, ValueError) as error:
        print(f"smso-serve: error: {error}", file=sys.stderr)
        return 2
    listener = listeners[0]  # (each names the port)
    if settings.model_repository is None and not settings.shared_session:
        try:  # (the session host runs its own, before any worker starts)
            _check_runs(settings)
        except (CardError, ValueError, ModelCannotRunError) as error:
            _close(listeners)
            print(f"smso-serve: error: {error}", file=sys.stderr)
            return 2
    host = None
    if settings.shared_session:  # loaded and warmed up before any worker starts
        log.info("SMSO session host loading %s for %d workers", settings.model_path, processes)
        try:
            host = start_host(settings.model_path, BackendOptions.from_settings(settings))
        except (TimeoutError, ValueError) as error:
            _close(listeners)
            print(f"smso-serve: error: session host: {error}", file=sys.stderr)
            return 2
        log.info("SMSO session host ready on %s", ", ".join(host.providers))
    # flags win over the environment, in the workers too; workers=auto as resolved
    flags = {f"SMSO_{name.upper()}": str(value) for name, value in overrides.items()}
    flags["SMSO_WORKERS"] = str(processes)
    with inherited(flags | _arenas_for_workers() | (host.environment if host else {})):
        # the port takes connections from here on: the kernel queues each on one worker's
        # socket until that worker accepts it, which it does once its model serves
        # (service.app's serve_when_loaded)
        for sock in listeners:
            sock.listen(BACKLOG)
        log.info(
            "SMSO service listening on %s (%d workers%s)",
            where_to_go(settings, listener),
            processes,
            ", one per usable core: --workers auto" if auto else "",
        )
        ready, done = multiprocessing.get_context("spawn").Semaphore(0), threading.Event()
        told = (ready, processes, done, _ready_line(settings, listener))
        threading.Thread(target=_log_once_ready, args=told, daemon=True).start()
        workers = Workers(_serve_worker, (ready,), processes, listeners=listeners)
        if host is not None:
            hung_after = 2 * settings.request_timeout_s
            watch = (host, workers, hung_after)
            threading.Thread(target=_watch_host, args=watch, daemon=True).start()
        try:
            workers.run()
        finally:
            done.set()
            _close(listeners)
            if host is not None:  # after the workers: they answered what was in flight
                host.stop()
    if host is not None and host.died:
        return 1  # the workers were stopped because the host died (logged)
    return 1 if workers.failed else 0


def _close(listeners: list[socket.socket]) -> None:
    for sock in listeners:
        sock.close()


def _log_once_ready(ready: ProcessSemaphore, count: int, done: threading.Event, line: str) -> None:
    """The supervisor's "ready" line, once each of the ``count`` workers has released
    ``ready`` (a connection the kernel hands to a worker's socket waits for that worker, so the
    port serves every client only then); nothing once ``done`` (the workers stopped first)."""
    for _ in range(count):
        while not ready.acquire(timeout=0.5):
            if done.is_set():
                return
    log.info("%s", line)


def _serve_worker(listener: socket.socket, ready: ProcessSemaphore) -> None:
    """One worker process of ``--workers``: its own app from the ``SMSO_*`` environment (the
    parent's flags, metrics folder and session host), served on its own listening socket of
    the parent's (:func:`worker_listeners`) by the same draining server as a single process;
    ``ready`` released once its app is (the supervisor counts them). A server that cannot
    start exits with status 3 (uvicorn's ``sys.exit``), which stops the others."""
    app = app_from_environment()
    state = app.state.smso
    server = _Server(
        _config(state.settings, app),
        on_drain=lambda: setattr(state, "draining", True),
        when_ready=WhenReady(ready=lambda: _serves(state), then=ready.release),
        stop_signals=(signal.SIGTERM,),  # SIGINT is the supervisor's (service.http.workers)
    )
    server.run(sockets=[listener])


class _Stoppable(typing.Protocol):
    """What the watcher stops: the workers (:class:`Workers`), or a test's."""

    def stop(self) -> None: ...


def _watch_host(host: HostHandle, workers: _Stoppable, hung_after: float) -> None:
    """Stop the server as SIGTERM does (the workers drain; the exit status is then 1, for the
    supervisor to restart it) if the session host exits while it serves, or if one round has
    been running for ``hung_after`` seconds (a hung device: every request in it, and behind
    it, fails its deadline, while the workers would still say they are ready); a hung host is
    killed. Waits on the process's sentinel a second at a time (it does not reap it:
    :meth:`HostHandle.stop` does, once)."""
    while not multiprocessing.connection.wait([host.process.sentinel], timeout=1.0):
        if host.stopping:
            return
        stuck = host.stuck_for()
        if stuck > hung_after:
            log.error(
                "the session host has run one round for %.0f s (more than %.0f s, twice the "
                "request deadline): killing it and stopping the workers",
                stuck,
                hung_after,
            )
            host.died = True
            host.process.kill()
            workers.stop()
            return
    if not host.stopping:
        host.died = True
        log.error("the session host exited while serving: stopping the workers")
        workers.stop()


if __name__ == "__main__":
    raise SystemExit(main())
