"""The service's app for Granian's ASGI server (``granian --interface asgi --factory
bench.lib.granian_app:create``), for :mod:`bench.front_end`: each of Granian's worker processes
calls :func:`create`, which builds the app from the ``SMSO_*`` environment as ``smso-serve``
does, on the shipped model, a model file, or the GPU-like stand-in (``BENCH_STANDIN_MS``:
``"latency,per_image"`` milliseconds)."""

from __future__ import annotations

import os

from fastapi import FastAPI

from service.app import create_app
from service.core.settings import Settings

#: ``"1.3,0.03"``: serve the stand-in backend with that latency per batch and per image.
STANDIN_ENV = "BENCH_STANDIN_MS"


def create() -> FastAPI:
    """A new app from the environment's settings (and its stand-in, where named)."""
    settings = Settings()
    standin = os.environ.get(STANDIN_ENV)
    if not standin:
        return create_app(settings)
    from bench.lib.standin import StandinBackend

    latency, per_image = (float(v) for v in standin.split(","))
    return create_app(settings, StandinBackend(latency, per_image))
