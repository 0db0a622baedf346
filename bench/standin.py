"""``smso-serve`` on the GPU-like stand-in backend (:mod:`bench.lib.standin`), on any machine.

    python -m bench.standin --port 8000 [--latency-ms 1.3 --per-image-ms 0.19] [--SMSO settings]

Every other flag is ``smso-serve``'s. The backend sleeps ``latency_ms + per_image_ms * N`` per
batch, as ResNet-50 SMSO p = 2,048 on an H100 takes, with ResNet-50's card at 224 px. With
``--workers N`` (N > 1), N processes serve the one port (``service.http.workers.Workers``, each
on its own listening socket, as ``smso-serve --workers`` runs them, ``/metrics`` combining their
values), each with a stand-in of its own: N devices, one each.
"""

from __future__ import annotations

import argparse
import socket

import uvicorn

from bench.lib.standin import StandinBackend
from service.app import create_app
from service.cli import parse_args
from service.core.settings import Settings
from service.http.listeners import bind_ports, worker_listeners
from service.http.workers import Workers


def serve(
    listener: socket.socket | None, settings: Settings, latency_ms: float, per_image_ms: float
) -> None:
    """The app on the stand-in, served on ``listener`` (a worker's) or on the settings' port."""
    app = create_app(settings, StandinBackend(latency_ms, per_image_ms))
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=settings.log_level
    )
    uvicorn.Server(config).run(sockets=None if listener is None else [listener])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=1.3, help="per batch")
    parser.add_argument("--per-image-ms", type=float, default=0.19, help="per image in a batch")
    args, rest = parser.parse_known_args(argv)
    settings = Settings(**parse_args(rest))
    processes = settings.worker_processes(gpu=False)  # the stand-in runs on the CPU
    if processes == 1:
        serve(None, settings, args.latency_ms, args.per_image_ms)
        return 0
    listeners = worker_listeners(bind_ports(settings), processes)
    work = (settings, args.latency_ms, args.per_image_ms)
    workers = Workers(serve, work, processes, listeners=listeners)
    try:
        workers.run()
    finally:
        for listener in listeners:
            listener.close()
    return 1 if workers.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
