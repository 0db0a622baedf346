"""The FastAPI app, assembled: ``create_app(settings, backend=None)``.

The state (``service.dataplane.state.ServiceState``), the lifespan that loads the models (one
file, or a repository followed by ``service.models.repository``) and stops them, the middleware
(request id and access line, drain, metrics, requests in progress, body budget, client gone),
and the routes: ``service.http.routes`` (health, metrics, and each model's ``/classify``,
``/embed`` and ``/metadata``), ``service.http.search`` (each model's ``/search`` of its gallery),
``service.http.openai_embeddings`` (OpenAI's ``/v1/embeddings``), ``service.http.oip`` (the Open
Inference Protocol under ``/v2``) and ``service.http.docs`` (the OpenAPI docs, offline). The
lifespan also runs the protocol's gRPC side (``service.grpc.server``) on ``settings.grpc_port``,
unless 0, and with ``model_control = "poll"`` follows the galleries beside the models served
(``service.models.galleries``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from opentelemetry.trace import TracerProvider
from starlette.types import ASGIApp
from threadpoolctl import threadpool_limits

from service.core.settings import Settings
from service.dataplane.state import ServiceState
from service.http.access_log import AccessLog
from service.http.disconnect import CancelWhenGone
from service.http.docs import install_docs
from service.http.drain import CloseWhenDraining
from service.http.errors import install_error_handlers
from service.http.inflight_limit import HoldInFlight
from service.http.oip import build_router
from service.http.openai_embeddings import build_openai_routes
from service.http.request_metrics import MetricsMiddleware
from service.http.routes import build_routes
from service.http.search import build_search_routes
from service.limits.bodies import BodyBudget
from service.models.galleries import follow_galleries
from service.models.loader import close_backend, load_model
from service.models.repository import Repository
from service.runtime.backend import Backend
from service.telemetry.logs import configure_logging
from service.telemetry.tracing import (
    TELEMETRY_OFF,
    Spans,
    otlp_provider,
    tracer,
    tracing_requested,
)

__all__ = ["app_from_environment", "create_app"]

log = logging.getLogger("service")


class _App(FastAPI):
    """FastAPI with :class:`~service.http.access_log.AccessLog` outside Starlette's own error
    layer, so that a last-resort 500 too carries the request's id (``add_middleware`` nests
    inside it)."""

    def build_middleware_stack(self) -> ASGIApp:
        state = getattr(self.state, "smso", None)
        return AccessLog(super().build_middleware_stack(), None if state is None else state.spans)


def create_app(
    settings: Settings,
    backend: Backend | None = None,
    tracer_provider: TracerProvider | None = None,
    serve_when_loaded: bool = False,
) -> FastAPI:
    """A new app serving ``settings.model_path`` (or ``backend``, e.g. a test's fake).

    Spans go to ``tracer_provider`` (a test's); without one, when the environment names an OTLP
    endpoint, to the app's own (``service.telemetry.tracing.otlp_provider``, shut down with it).
    With ``serve_when_loaded`` (a worker of several on one port) the app's start-up waits
    while its readiness is "loading" (its model, or its repository's first scan, being loaded
    and warmed up), so that the server takes no connection before it can serve: the
    connections the kernel hands to this worker's socket wait in its queue instead of meeting
    a 503 "loading" from this one.
    """
    state = ServiceState(settings)
    own_provider = None
    if tracer_provider is None and tracing_requested():
        tracer_provider = own_provider = otlp_provider(state.metrics.spans_dropped.inc)
    state.spans = Spans(tracer(tracer_provider))
    state.registry.default = settings.default_model

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # numpy's BLAS on one thread, for the whole process: the typicality score's products
        # are small, and OpenBLAS's threads, busy-waiting after each, took the cores from
        # onnxruntime (a 64-image batch with its score: 12.3 ms, 7.3 ms on one BLAS thread)
        threadpool_limits(limits=1, user_api="blas")
        # The server accepts connections at once (/healthz answers, /readyz says "loading");
        # loading and warm-up run in the background and turn /readyz ready when done.
        if settings.api_key is None:
            grpc_calls = " and the gRPC model calls" if settings.grpc_port else ""
            log.warning(
                "no API key set (SMSO_API_KEY): the model routes (/classify, /embed, "
                "/search, /metadata, /models/..., /v1/embeddings, /v2/models/...)%s are open "
                "to anyone who can reach this server",
                grpc_calls,
            )
        loading: asyncio.Task[Any]
        if settings.model_repository is not None:
            state.repository = Repository(state, settings.model_repository)
            loading = asyncio.get_running_loop().create_task(
                state.repository.run(), name="repository"
            )
        else:
            source = None if backend is not None else settings.model_path
            loading = asyncio.get_running_loop().create_task(
                _load_only_model(state, source, backend), name="load-model"
            )
        following = None
        if settings.model_control == "poll":  # new gallery generations, as the folder is
            following = asyncio.get_running_loop().create_task(
                follow_galleries(
                    lambda: [model.gallery for model in state.registry.serving()],
                    settings.repository_poll_s,
                ),
                name="galleries",
            )
        grpc_server = None
        try:
            # neither HTTP nor gRPC while /readyz would say "loading"
            while (
                serve_when_loaded and state.registry.readiness() == "loading" and not loading.done()
            ):
                await asyncio.sleep(0.05)
            if settings.grpc_port:  # the same state, registry and batchers as HTTP
                # imported here: with --grpc-port 0 neither grpcio nor tritonclient is loaded
                from service.grpc.server import start_grpc_server

                grpc_server = await start_grpc_server(state)
            yield
        finally:
            state.draining = True
            if grpc_server is not None:  # new RPCs refused, those in flight answered
                await grpc_server.stop(settings.request_timeout_s)
            for task in (loading, following):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if state.repository is not None:  # the repository API's loads too
                await state.repository.close()
            for model in state.registry.serving():
                await model.batcher.stop()  # every queued image is answered first
                close_backend(model.backend)
            state.decoder.shutdown(wait=True)
            if own_provider is not None:  # the last spans exported
                await asyncio.to_thread(own_provider.shutdown)

    # with an API key the docs (model routes, limits) are for key holders unless opened
    docs = settings.api_key is None or settings.docs_public
    app = _App(
        title="SMSO inference service",
        telemetry=TELEMETRY_OFF,  # type: ignore[arg-type]
        description="Class predictions and compact second-order (SMSO) embeddings of images.",
        version="1",
        lifespan=lifespan,
        openapi_url="/openapi.json" if docs else None,
        docs_url=None,  # service.http.docs serves them, offline
        redoc_url=None,
        # no redirect from /classify/ to /classify: its Location would be built from the
        # client's Host header (and a POST's body lost on the way)
        redirect_slashes=False,
    )
    app.state.smso = state
    install_error_handlers(app)
    # a client that leaves after sending its request stops its work (inside the metrics: 499)
    app.add_middleware(CancelWhenGone)
    app.add_middleware(BodyBudget, buffered=lambda: state.buffered)
    # requests in progress, both doors together (inside the metrics: a refusal is counted)
    app.add_middleware(HoldInFlight, inflight=lambda: state.inflight)
    app.add_middleware(MetricsMiddleware, metrics=lambda: state.metrics)
    # on SIGTERM (smso-serve's DrainingServer) keep-alive clients are told the connection closes
    app.add_middleware(CloseWhenDraining, draining=lambda: state.draining)

    _add_routes(
        app,
        build_routes(),
        build_search_routes(),
        build_openai_routes(),
        build_router(repository=settings.model_repository is not None),
    )
    if docs:
        install_docs(app)  # /docs, /redoc and / -> /docs; else all three are 404
    return app


async def _load_only_model(
    state: ServiceState, source: Path | None, backend: Backend | None
) -> None:
    """Load the one model of a server without a repository; then the registry is settled:
    a default model that names another is missing, not loading."""
    try:
        await load_model(state, source, backend=backend)
    finally:
        state.registry.settled = True


#: Where a path ends, the routes that serve images: matched first (see :func:`_add_routes`).
HOT_ROUTES = ("/classify", "/embed", "/search", "/infer", "/v1/embeddings")


def _add_routes(app: FastAPI, *routers: APIRouter) -> None:
    """Put the routers' routes in the app's own route list, those of :data:`HOT_ROUTES`
    first. Not ``include_router``: FastAPI (0.16x) keeps an included router behind a wrapper
    whose routes are matched in order, once to choose the router and again inside it, for
    every request, so that a ``/v2`` infer request tried 36 routes; a flat list with the image
    routes first took 0.2 ms (15 %) off its 1.4 ms of event-loop CPU on 2 cores. No two routes
    match the same path, so the order changes which is tried first, never which answers (and
    the order of the paths in the OpenAPI document)."""
    routes = [route for router in routers for route in router.routes]
    hot = [route for route in routes if getattr(route, "path", "").endswith(HOT_ROUTES)]
    # /classify before /models/{name}/...
    hot.sort(key=lambda route: getattr(route, "path", "").count("{"))
    app.router.routes.extend([*hot, *(route for route in routes if route not in hot)])


def app_from_environment() -> FastAPI:
    """The app of one worker process when ``smso-serve`` runs several: settings from the
    ``SMSO_*`` environment (which ``smso-serve`` set from its flags, and already validated);
    it takes connections once its model serves."""
    settings = Settings()
    configure_logging(settings.log_level, settings.log_format, process=True)
    return create_app(settings, serve_when_loaded=True)
