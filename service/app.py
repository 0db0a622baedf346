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
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service import schemas
from service.backend import Backend, OnnxBackend
from service.batcher import MicroBatcher
from service.bodies import BodyBudget
from service.dependencies import ReadyState, authorize
from service.disconnect import CancelWhenGone
from service.docs import install_docs
from service.drain import CloseWhenDraining
from service.errors import ServiceError, install_error_handlers
from service.images import Preprocessor
from service.inputs import MAX_FILENAME, Upload, read_uploads
from service.metrics import Metrics, MetricsMiddleware, exposition
from service.oip import build_router
from service.pipeline import Outputs, ServiceState, decode_all, run_batched, top_classes
from service.runner import buckets
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

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The server accepts connections at once (/healthz answers, /readyz says "loading");
        # loading and warm-up run in the background and turn /readyz ready when done.
        state.metrics = Metrics()
        state.decoder = ThreadPoolExecutor(settings.decode_workers, thread_name_prefix="decode")
        if settings.api_key is None:
            log.warning("no API key set (SMSO_API_KEY): the model routes (/classify, /embed, "
                        "/metadata, /v2/models/...) are open to anyone who can reach this "
                        "server")  # fmt: skip
        loading = asyncio.get_running_loop().create_task(_load(state), name="load-model")
        try:
            yield
        finally:
            state.ready, state.draining = False, True
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            if state.batcher is not None:
                await state.batcher.stop()  # every queued image is answered first
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
    state.backend = backend
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
        """Ready: the model is loaded and warmed up (each batch-size bucket run once)."""
        if state.ready:
            return {"status": "ready"}
        if state.failed and not state.draining:  # for good: no Retry-After
            return JSONResponse({"status": "failed"}, 503)
        status = "draining" if state.draining else "loading"
        return JSONResponse({"status": status}, 503, headers={"Retry-After": "1"})

    @app.get("/metadata", dependencies=[Depends(authorize)], tags=["model"])
    async def metadata(s: ReadyState) -> dict[str, Any]:
        """The model card written by smso-export: classes, input, head, p, accuracy, parity."""
        assert s.backend is not None
        return {
            "model": {"name": s.backend.card.name, "version": s.backend.card.model_version},
            "providers": s.backend.providers, "card": s.backend.card_dict,
        }  # fmt: skip

    @app.get("/metrics", tags=["health"], response_class=Response)
    async def metrics() -> Response:
        """Prometheus metrics."""
        return Response(exposition(state.metrics), media_type=CONTENT_TYPE_LATEST)

    @app.post(
        "/classify", response_model=schemas.ClassifyResponse, tags=["inference"],
        dependencies=[Depends(authorize)], openapi_extra=IMAGE_BODY,
        responses=schemas.ERROR_RESPONSES,
    )  # fmt: skip
    async def classify(
        request: Request,
        s: ReadyState,
        top_k: Annotated[
            int, Query(ge=1, le=1000, description="classes per image, best first")
        ] = 5,
    ) -> JSONResponse:
        """Top-k classes of each image (softmax probabilities), one result per image in order."""
        uploads, outputs = await _infer(s, request, "/classify")
        classes = s.backend.card.classes  # type: ignore[union-attr]
        scores, order = top_classes(np.stack([logits for logits, _ in outputs]), top_k)
        results = [
            {"filename": upload.filename,
             "predictions": [{"label": classes[i], "index": int(i), "score": float(scores[n, i])}
                             for i in order[n]]}
            for n, upload in enumerate(uploads)
        ]  # fmt: skip
        # a Response skips FastAPI's re-validation of the payload (response_model documents it)
        return JSONResponse({"model": _model(s), "results": results})

    @app.post(
        "/embed", response_model=schemas.EmbedResponse, tags=["inference"],
        dependencies=[Depends(authorize)], openapi_extra=IMAGE_BODY,
        responses=schemas.ERROR_RESPONSES,
    )  # fmt: skip
    async def embed(
        request: Request,
        s: ReadyState,
        normalize: Annotated[bool, Query(description="l2-normalise each embedding")] = False,
    ) -> JSONResponse:
        """The p-dimensional SMSO embedding of each image, one result per image in order."""
        uploads, outputs = await _infer(s, request, "/embed")
        results = []
        for upload, (_, embedding) in zip(uploads, outputs, strict=True):
            vector = embedding.astype(np.float64)
            if normalize:
                vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
            results.append({"filename": upload.filename, "embedding": vector.tolist()})
        dim = s.backend.card.model.embedding_dim  # type: ignore[union-attr]
        return JSONResponse({"model": _model(s), "dim": dim, "results": results})

    app.include_router(build_router())
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


def _model(state: ServiceState) -> dict[str, str]:
    card = state.backend.card  # type: ignore[union-attr]
    return {"name": card.name, "version": card.model_version}


async def _load(state: ServiceState) -> None:
    """Load the model (unless given), start the batcher, warm up, then turn ready."""
    settings = state.settings
    try:
        if state.backend is None:
            state.backend = await asyncio.get_running_loop().run_in_executor(
                None, OnnxBackend, settings.model_path, settings.backend_options
            )
        backend = state.backend
        state.preprocess = Preprocessor(backend.card.preprocessing, settings.max_pixels)
        metrics = state.metrics
        state.batcher = MicroBatcher(
            backend.run, settings.max_batch_size, settings.max_wait_ms / 1e3,
            settings.queue_size, on_batch=metrics.observe_batch if metrics else None,
            wait_for_announced=True, patience=settings.batch_patience,
            on_depth=metrics.queue_depth.set if metrics else None,
        )  # fmt: skip
        state.batcher.start()
        await _warm_up(state)
    except asyncio.CancelledError:
        raise
    except Exception as error:
        state.failure = " ".join(str(error).split()) or type(error).__name__
        log.exception(
            "the model could not be loaded or warmed up; /readyz says failed and every "
            "inference route answers 503 until a restart"
        )
        return
    state.ready = True
    card = backend.card
    log.info("ready: %s (%s) on %s; /readyz answers 200", card.name, card.model_version,
             ", ".join(backend.providers))  # fmt: skip


async def _warm_up(state: ServiceState) -> None:
    """Run the backend's warm-up batches (by default each batch-size bucket: 1, 2, 4, ...,
    ``max_batch_size``) so that no request pays for a first call."""
    spec = state.backend.card.input  # type: ignore[union-attr]
    rng = np.random.default_rng(0)
    sizes = getattr(state.backend, "warmup_batches", None) or buckets(state.settings.max_batch_size)
    for size in sizes:
        images = rng.standard_normal((size, spec.channels, spec.height, spec.width), np.float32)
        await state.batcher.run_direct(images)  # type: ignore[union-attr]


async def _infer(
    state: ServiceState, request: Request, route: str
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
    images = await decode_all(state, uploads, deadline)
    return uploads, await run_batched(state, images, deadline, route)
