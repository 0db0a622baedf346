"""The service's own routes: health, metrics, and each model's ``/classify``, ``/embed`` and
``/metadata``, for the default model and under ``/models/{name}[/versions/{version}]``.

Per request: the images are read under the upload limits (``service.http.inputs``), decoded and
preprocessed in a thread pool (``service.imaging.images``), each queued in the model's micro-batcher
(``service.batching.batcher``) that runs onnxruntime in its worker thread, and awaited until the
request's deadline. Nothing slow runs on the event loop. Every route reaches the app's state one
way: the :data:`State` dependency.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from modelcard.typicality import summary
from service.core.errors import ServiceError
from service.dataplane.answers import l2_normalised, top_classes
from service.dataplane.pipeline import decode_all, run_batched
from service.dataplane.state import ServiceState
from service.dataplane.upload import Upload
from service.http import schemas
from service.http.dependencies import State, authorize
from service.http.inputs import MAX_FILENAME, read_uploads
from service.models.registry import LoadedModel
from service.runtime.outputs import BackendOutputs
from service.telemetry.access import note_model
from service.telemetry.metrics import exposition

__all__ = [
    "IMAGE_BODY",
    "TARGETS",
    "Named",
    "build_routes",
    "infer_request",
    "infer_uploads",
    "model_ref",
    "only_query",
    "typicality_of",
]

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
                    # a part of another name is refused (422): an image there would be left out
                    "additionalProperties": False,
                }
            },
            "image/*": {"schema": {"type": "string", "format": "binary"}},
        },
    },
    # read by service.http.inputs, which validates it: declared here for the docs only
    "parameters": [
        {
            "name": "filename",
            "in": "query",
            "required": False,
            "schema": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_FILENAME,
                # printable, not only spaces: what service.http.inputs accepts
                "pattern": r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$",
            },
            "description": "the name of an image sent as the raw body, in the results (else "
            "its Content-Disposition filename, else 'body'); parts are named by their filenames",
        }
    ],
}


#: /embed's query parameters, described
ENCODING = (
    "'json': each embedding a list of numbers; 'base64': each embedding one string, the base64 "
    "of its p values as little-endian floats of `dtype` (a quarter of the JSON's size or less)"
)
DTYPE = (
    "'float32' (4 bytes a value) or 'float16' (2 bytes, about 3 significant digits; in JSON the "
    "values rounded to it)"
)


def build_routes() -> APIRouter:
    """Health, metrics and every model route."""
    router = APIRouter()

    @router.get("/healthz", response_model=schemas.Status, tags=["health"])
    @router.head("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        """Alive: the process answers."""
        return {"status": "alive"}

    @router.get(
        "/readyz",
        response_model=schemas.Status,
        tags=["health"],
        responses={503: {"model": schemas.ErrorResponse}},
    )
    @router.head("/readyz", include_in_schema=False)
    async def readyz(state: State) -> Any:
        """Ready: the models are loaded and warmed up (each batch-size bucket run once); with
        a repository, every model is ready or unavailable and the default one is ready."""
        if state.draining:
            return JSONResponse({"status": "draining"}, 503, headers={"Retry-After": "1"})
        status = state.registry.readiness()
        if status == "ready":
            return {"status": "ready"}
        if status in ("failed", "missing"):  # until the models change: no Retry-After
            return JSONResponse({"status": status}, 503)
        return JSONResponse({"status": status}, 503, headers={"Retry-After": "1"})

    @router.get("/metrics", tags=["health"], response_class=Response)
    async def metrics(state: State) -> Response:
        """Prometheus metrics."""
        return Response(exposition(state.metrics), media_type=CONTENT_TYPE_LATEST)

    for prefix, target in TARGETS.items():
        _model_routes(router, prefix, target)
    return router


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
TARGETS: dict[str, Callable[..., Awaitable[Named]]] = {
    "": _default_model,
    "/models/{model_name}": _named_model,
    "/models/{model_name}/versions/{model_version}": _model_version,
}


def only_query(*names: str) -> Any:
    """A dependency that refuses (422) query parameters other than ``names``: a mistyped one
    (``?topk=3``) would otherwise be ignored and the request answered with the default."""
    accepted = frozenset(names)

    async def check(request: Request) -> None:  # async: no thread hop per request
        unknown = sorted(set(request.query_params) - accepted)
        if unknown:
            raise ServiceError(
                422,
                "unknown_query_parameter",
                f"unknown query parameter {', '.join(repr(u[:64]) for u in unknown[:5])}; "
                f"{request.url.path[:200]} accepts {', '.join(sorted(accepted))}",
            )

    return Depends(check)


def _model_routes(router: APIRouter, prefix: str, target: Callable[..., Awaitable[Named]]) -> None:
    """``/metadata``, ``/classify`` and ``/embed`` under ``prefix``: the default model's
    (``""``), a named model's, or a named version's."""
    tags: list[str | Enum] = ["inference"] if not prefix else ["models"]
    card_tags: list[str | Enum] = ["model"] if not prefix else tags
    # a parameter's default, not an Annotated alias: the dependency differs per prefix, and a
    # local alias would be an unresolvable string annotation here
    named_by_path = Depends(target)

    @router.get(
        f"{prefix}/metadata",
        dependencies=[Depends(authorize)],
        tags=card_tags,
        responses=schemas.ERROR_RESPONSES,
    )
    async def metadata(state: State, named: Named = named_by_path) -> dict[str, Any]:
        """The model card written by smso-export: classes, input, head, p, accuracy, parity;
        and the gallery that /search searches (null when none serves, and why one was
        refused)."""
        model = note_model(state.registry.lookup(*named))
        card = dict(getattr(model.backend, "card_dict", model.card.model_dump()))
        if "typicality" in card:  # its arrays (kilobytes to megabytes) stay in the file
            card["typicality"] = summary(card["typicality"])
        return {
            "model": model_ref(model),
            "providers": getattr(model.backend, "providers", []),
            "card": card,
            "typicality": model.typicality is not None,
        } | model.gallery.describe()

    @router.post(
        f"{prefix}/classify",
        response_model=schemas.ClassifyResponse,
        tags=tags,
        dependencies=[Depends(authorize), only_query("top_k", "filename")],
        openapi_extra=IMAGE_BODY,
        responses=schemas.ERROR_RESPONSES,
    )
    async def classify(
        request: Request,
        state: State,
        named: Named = named_by_path,
        top_k: Annotated[
            int, Query(ge=1, le=1000, description="classes per image, best first")
        ] = 5,
    ) -> JSONResponse:
        """Top-k classes of each image (softmax probabilities), one result per image in order."""
        async with state.registry.using(*named) as model:
            uploads, outputs = await infer_request(state, model, request, "/classify")
        classes = model.card.classes
        scores, order = top_classes(outputs.logits, top_k)
        results = [
            {
                "filename": upload.filename,
                "predictions": [
                    {"label": classes[i], "index": int(i), "score": float(scores[n, i])}
                    for i in order[n]
                ],
            }
            | typicality_of(outputs, n)
            for n, upload in enumerate(uploads)
        ]
        # a Response skips FastAPI's re-validation of the payload (response_model documents it)
        return JSONResponse({"model": model_ref(model), "results": results})

    @router.post(
        f"{prefix}/embed",
        response_model=schemas.EmbedResponse,
        tags=tags,
        dependencies=[Depends(authorize), only_query("normalize", "encoding", "dtype", "filename")],
        openapi_extra=IMAGE_BODY,
        responses=schemas.ERROR_RESPONSES,
    )
    async def embed(
        request: Request,
        state: State,
        named: Named = named_by_path,
        normalize: Annotated[bool, Query(description="l2-normalise each embedding")] = False,
        encoding: Annotated[Literal["json", "base64"], Query(description=ENCODING)] = "json",
        dtype: Annotated[Literal["float32", "float16"], Query(description=DTYPE)] = "float32",
    ) -> JSONResponse:
        """The p-dimensional SMSO embedding of each image, one result per image in order."""
        async with state.registry.using(*named) as model:
            uploads, outputs = await infer_request(state, model, request, "/embed")
        results = []
        for n, upload in enumerate(uploads):
            vector = outputs.embedding[n].astype(np.float64)
            if normalize:
                vector = l2_normalised(vector)
            results.append(
                {"filename": upload.filename, "embedding": _encoded(vector, encoding, dtype)}
                | typicality_of(outputs, n)
            )
        dim = model.card.model.embedding_dim
        return JSONResponse({"model": model_ref(model), "dim": dim, "results": results})


def typicality_of(outputs: BackendOutputs, n: int) -> dict[str, Any]:
    """Image ``n``'s ``{"typicality": {"score", "p_value"}}`` where the model scores
    typicality, else ``{}``."""
    if outputs.typicality is None or outputs.p_value is None:
        return {}
    score, p_value = float(outputs.typicality[n]), float(outputs.p_value[n])
    return {"typicality": {"score": round(score, 4), "p_value": round(p_value, 6)}}


def _encoded(vector: np.ndarray, encoding: str, dtype: str) -> list[float] | str:
    """``vector`` (p,) as /embed answers it: a JSON list, or the base64 of its values as
    little-endian ``dtype``; ``float16`` rounds the values first either way."""
    values = vector.astype("<f2" if dtype == "float16" else "<f4")
    if encoding == "json":  # float32: the values as computed (float64 when normalised)
        return (values if dtype == "float16" else vector).tolist()
    return base64.b64encode(values.tobytes()).decode()


def model_ref(model: LoadedModel) -> dict[str, str]:
    return {"name": model.name, "version": model.version}


async def infer_request(
    state: ServiceState, model: LoadedModel, request: Request, route: str
) -> tuple[list[Upload], BackendOutputs]:
    """Read, decode and run the request's images (files or the body) under its deadline."""
    note_model(model)
    settings = state.settings
    deadline = time.perf_counter() + settings.request_timeout_s
    uploads = await read_uploads(
        request, settings.max_request_bytes, settings.max_upload_bytes, settings.max_files
    )
    return uploads, await infer_uploads(state, model, uploads, deadline, route)


async def infer_uploads(
    state: ServiceState,
    model: LoadedModel,
    uploads: list[Upload],
    deadline: float,
    route: str,
) -> BackendOutputs:
    """Decode and run ``uploads`` through ``model`` under ``deadline`` (a
    ``time.perf_counter()`` value): 413 beyond ``max_files``."""
    limit = state.settings.max_files
    if len(uploads) > limit:
        raise ServiceError(
            413, "too_many_files", f"{len(uploads)} files; at most {limit} per request"
        )
    images = await decode_all(state, model, uploads, deadline)
    return await run_batched(state, model, images, deadline, route)
