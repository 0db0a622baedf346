"""The FastAPI app: ``create_app(settings, backend=None)``.

Routes: ``POST /classify`` and ``POST /embed`` (images in, predictions or p-dim embeddings out),
``GET /healthz`` (alive), ``GET /readyz`` (model loaded and each batch-size bucket warmed up),
``GET /metadata`` (the model card), ``GET /metrics`` (Prometheus), and the OpenAPI docs
(``service.docs``: offline, ``GET /`` leads there).

Per request: the images are read under the upload limits (``service.inputs``), decoded and
preprocessed in a thread pool (``service.images``), each queued in the micro-batcher
(``service.batcher``) that runs onnxruntime in its worker thread, and awaited until the request's
deadline. Nothing slow runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service import schemas
from service.backend import Backend
from service.bodies import BodyBudget
from service.dependencies import authorize
from service.disconnect import CancelWhenGone
from service.docs import install_docs
from service.drain import CloseWhenDraining
from service.errors import ServiceError, install_error_handlers
from service.inputs import MAX_FILENAME, Upload, read_uploads
from service.loader import load_model
from service.metrics import MetricsMiddleware, exposition
from service.oip import build_router
from service.pipeline import Outputs, ServiceState, decode_all, run_batched, top_classes
from service.registry import LoadedModel
from service.repository import Repository
from service.settings import Settings

__all__ = ["app_from_environment", "create_app"]

log = logging.getLogger("service")

IMAGE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "file": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "string", "format": "binary"},
                        }
                    },
                    "required": ["file"],
                }
            },
            "image/*": {"schema": {"type": "string", "format": "binary"}},
        },
    },
    # read by service.inputs, which validates it: declared here for the docs only
    "parameters": [
        {
            "name": "filename",
            "in": "query",
            "required": False,
            "schema": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_FILENAME,
                # printable, not only spaces: what service.inputs accepts
                "pattern": r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$",
            },
            "description": "the name of an image sent as the raw body, in the results (else "
            "its Content-Disposition filename, else 'body'); parts are named by their filenames",
        }
    ],
}


def create_app(settings: Settings, backend: Backend | None = None) -> FastAPI:
    """A new app serving ``settings.model_path`` (or ``backend``, e.g. a test's fake)."""
    state = ServiceState(settings)
    state.registry.default = settings.default_model

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The server accepts connections at once (/healthz answers, /readyz says "loading");
        # loading and warm-up run in the background and turn /readyz ready when done.
        if settings.api_key is None:
            log.warning("no API key set (SMSO_API_KEY): the model routes (/classify, /embed, "
                        "/metadata, /models/..., /v2/models/...) are open to anyone who can "
                        "reach this server")  # fmt: skip
        if settings.model_repository is not None:
            state.repository = Repository(state, settings.model_repository)
            loading = asyncio.get_running_loop().create_task(
                state.repository.run(), name="repository"
            )
        else:
            source = None if backend is not None else settings.model_path
            loading = asyncio.get_running_loop().create_task(
                load_model(state, source, backend=backend), name="load-model"
            )
        try:
            yield
        finally:
            state.draining = True
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            for model in state.registry.serving():
                await model.batcher.stop()  # every queued image is answered first
            state.decoder.shutdown(wait=True)

    # with an API key the docs (model routes, limits) are for key holders unless opened
    docs = settings.api_key is None or settings.docs_public
    app = FastAPI(
        title="SMSO inference service",
        description="Class predictions and compact second-order (SMSO) embeddings of images.",
        version="1",
        lifespan=lifespan,
        openapi_url="/openapi.json" if docs else None,
        docs_url=None,  # service.docs serves them, offline
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
    app.add_middleware(MetricsMiddleware, metrics=lambda: state.metrics)
    # on SIGTERM (smso-serve's DrainingServer) keep-alive clients are told the connection closes
    app.add_middleware(CloseWhenDraining, draining=lambda: state.draining)

    @app.get("/healthz", response_model=schemas.Status, tags=["health"])
    @app.head("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        """Alive: the process answers."""
        return {"status": "alive"}

    @app.get("/readyz", response_model=schemas.Status, tags=["health"],
             responses={503: {"model": schemas.ErrorResponse}})  # fmt: skip
    @app.head("/readyz", include_in_schema=False)
    async def readyz() -> Any:
        """Ready: the models are loaded and warmed up (each batch-size bucket run once); with
        a repository, every model is ready or unavailable and the default one is ready."""
        if state.draining:
            return JSONResponse({"status": "draining"}, 503, headers={"Retry-After": "1"})
        status = state.registry.readiness()
        if status == "ready":
            return {"status": "ready"}
        if status == "failed":  # for good: no Retry-After
            return JSONResponse({"status": "failed"}, 503)
        return JSONResponse({"status": status}, 503, headers={"Retry-After": "1"})

    @app.get("/metrics", tags=["health"], response_class=Response)
    async def metrics() -> Response:
        """Prometheus metrics."""
        return Response(exposition(state.metrics), media_type=CONTENT_TYPE_LATEST)

    for prefix, target in _TARGETS.items():
        _model_routes(app, prefix, target)

    app.include_router(build_router(repository=settings.model_repository is not None))
    if docs:
        install_docs(app)  # /docs, /redoc and / -> /docs; else all three are 404
    return app


def app_from_environment() -> FastAPI:
    """The app of one worker process when ``smso-serve`` runs several: settings from the
    ``SMSO_*`` environment (which ``smso-serve`` set from its flags, and already validated)."""
    settings = Settings()
    if not logging.getLogger().handlers:
        logging.basicConfig(level=settings.log_level.upper(),
                            format="%(asctime)s %(process)d %(name)s %(message)s")  # fmt: skip
    return create_app(settings)


#: ``(model name, version)`` a route's path names; ``None``: the default model, its version.
Named = tuple[str | None, str | None]


async def _default_model() -> tuple[str | None, str | None]:
    return None, None


async def _named_model(model_name: str) -> tuple[str | None, str | None]:
    return model_name, None


async def _model_version(model_name: str, model_version: str) -> tuple[str | None, str | None]:
    return model_name, model_version


#: Where each model's routes are (prefix), and how the prefix names the model (a dependency
#: reading the path: ``(name, version)``, ``None`` for the default model or its served version).
_TARGETS = {
    "": _default_model,
    "/models/{model_name}": _named_model,
    "/models/{model_name}/versions/{model_version}": _model_version,
}


def _model_routes(app: FastAPI, prefix: str, target: Callable[..., Awaitable[Named]]) -> None:
    """``/metadata``, ``/classify`` and ``/embed`` under ``prefix``: the default model's
    (``""``), a named model's, or a named version's."""
    tags = ["inference"] if not prefix else ["models"]
    # a parameter's default, not an Annotated alias: the dependency differs per prefix, and a
    # local alias would be an unresolvable string annotation here
    named_by_path = Depends(target)

    @app.get(f"{prefix}/metadata", dependencies=[Depends(authorize)], tags=["model"] if not prefix else tags,
             responses=schemas.ERROR_RESPONSES)  # fmt: skip
    async def metadata(request: Request, named: Named = named_by_path) -> dict[str, Any]:
        """The model card written by smso-export: classes, input, head, p, accuracy, parity."""
        model = _state(request).registry.lookup(*named)
        return {
            "model": _ref(model), "providers": getattr(model.backend, "providers", []),
            "card": getattr(model.backend, "card_dict", model.card.model_dump()),
        }  # fmt: skip

    @app.post(
        f"{prefix}/classify", response_model=schemas.ClassifyResponse, tags=tags,
        dependencies=[Depends(authorize)], openapi_extra=IMAGE_BODY,
        responses=schemas.ERROR_RESPONSES,
    )  # fmt: skip
    async def classify(
        request: Request,
        named: Named = named_by_path,
        top_k: Annotated[
            int, Query(ge=1, le=1000, description="classes per image, best first")
        ] = 5,
    ) -> JSONResponse:
        """Top-k classes of each image (softmax probabilities), one result per image in order."""
        async with _state(request).registry.using(*named) as model:
            uploads, outputs = await _infer(_state(request), model, request, "/classify")
        classes = model.card.classes
        scores, order = top_classes(np.stack([logits for logits, _ in outputs]), top_k)
        results = [
            {"filename": upload.filename,
             "predictions": [{"label": classes[i], "index": int(i), "score": float(scores[n, i])}
                             for i in order[n]]}
            for n, upload in enumerate(uploads)
        ]  # fmt: skip
        # a Response skips FastAPI's re-validation of the payload (response_model documents it)
        return JSONResponse({"model": _ref(model), "results": results})

    @app.post(
        f"{prefix}/embed", response_model=schemas.EmbedResponse, tags=tags,
        dependencies=[Depends(authorize)], openapi_extra=IMAGE_BODY,
        responses=schemas.ERROR_RESPONSES,
    )  # fmt: skip
    async def embed(
        request: Request,
        named: Named = named_by_path,
        normalize: Annotated[bool, Query(description="l2-normalise each embedding")] = False,
    ) -> JSONResponse:
        """The p-dimensional SMSO embedding of each image, one result per image in order."""
        async with _state(request).registry.using(*named) as model:
            uploads, outputs = await _infer(_state(request), model, request, "/embed")
        results = []
        for upload, (_, embedding) in zip(uploads, outputs, strict=True):
            vector = embedding.astype(np.float64)
            if normalize:
                vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
            results.append({"filename": upload.filename, "embedding": vector.tolist()})
        dim = model.card.model.embedding_dim
        return JSONResponse({"model": _ref(model), "dim": dim, "results": results})


def _state(request: Request) -> ServiceState:
    return request.app.state.smso  # type: ignore[no-any-return]


def _ref(model: LoadedModel) -> dict[str, str]:
    return {"name": model.name, "version": model.version}


async def _infer(
    state: ServiceState, model: LoadedModel, request: Request, route: str
) -> tuple[list[Upload], list[Outputs]]:
    """Read, decode and run the request's images under its deadline."""
    settings = state.settings
    deadline = time.perf_counter() + settings.request_timeout_s
    uploads = await read_uploads(
        request, settings.max_request_bytes, settings.max_upload_bytes, settings.max_files
    )
    if len(uploads) > settings.max_files:
        raise ServiceError(413, "too_many_files",
                           f"{len(uploads)} files; at most {settings.max_files} per request")  # fmt: skip
    images = await decode_all(state, model, uploads, deadline)
    return uploads, await run_batched(state, model, images, deadline, route)
