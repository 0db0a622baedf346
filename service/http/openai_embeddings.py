"""``POST /v1/embeddings``: OpenAI's embeddings API, for images, so that OpenAI's clients (the
``openai`` package, and the tools built on it) embed images with this service unchanged.

The request is OpenAI's: ``{"model", "input", "encoding_format", "dimensions", "user"}``, each
input an image as a base64 data URI (``data:image/png;base64,...``: infinity's convention for
image embeddings; the base64 alone is accepted too). ``model`` names a model served here (the
card's name, or a repository model's folder name): another name is 404 ``model_not_found``, as
OpenAI answers it. ``dimensions`` may only be the model's ``p``: an SMSO embedding cannot be
shortened (400 ``unsupported_dimensions``). ``user`` is accepted and not kept.

The answer is OpenAI's: ``{"object": "list", "data": [{"object": "embedding", "index",
"embedding"}], "model", "usage"}``, each embedding exactly what ``/embed`` answers for the image
(the same decoding and batches): a list of numbers, or with ``encoding_format="base64"`` (what
OpenAI's Python client asks for unless told otherwise) the base64 of its values as
little-endian float32. No tokens: ``usage`` is 0. Errors are the service's ``{"error": {"code",
"message"}}`` with OpenAI's ``type`` and ``param`` beside them (:mod:`service.http.errors`).
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from service.core.errors import ServiceError
from service.dataplane.upload import Upload
from service.http import schemas
from service.http.dependencies import State, authorize
from service.http.errors import OPENAI_PREFIX
from service.http.inputs import data_uri_upload
from service.http.json_bodies import INLINE_PARSE_BYTES, read_json
from service.http.routes import infer_uploads, only_query
from service.telemetry.access import note_model

__all__ = ["EmbeddingsRequest", "build_openai_routes"]

ROUTE = f"{OPENAI_PREFIX}/embeddings"
Image = Annotated[str, StringConstraints(min_length=1)]


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request, each input an image."""

    model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=())
    model: Annotated[str, StringConstraints(min_length=1)] = Field(
        description="a model served here: its name (/metadata's model.name)",
        examples=["fashion_mnist-small_cnn-smso"],
    )
    input: Image | Annotated[list[Image], Field(min_length=1)] = Field(
        description="an image, or a list of them, each as a base64 data URI "
        "(data:image/png;base64,...) or the base64 alone",
        examples=["data:image/png;base64,iVBORw0KGgo..."],
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float",
        description="'float': each embedding a list of numbers; 'base64': the base64 of its "
        "values as little-endian float32",
    )
    dimensions: Annotated[int, Field(ge=1)] | None = Field(
        None, description="the model's p, or left out: the embedding cannot be shortened"
    )
    user: str | None = Field(None, description="accepted, and not kept")

    @field_validator("input", mode="before")
    @classmethod
    def _images(cls, value: object) -> object:
        """A clear word for token arrays (OpenAI's text inputs) and other non-strings."""
        texts = isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(item, str) for item in value)
        )
        if not texts:
            raise ValueError(
                "each input is an image as a base64 data URI (data:image/png;base64,...), "
                "a string or a list of strings; token arrays are not images"
            )
        if value in ("", []) or (isinstance(value, list) and "" in value):
            raise ValueError("an input is empty; send at least one image, none of them empty")
        return value

    @field_validator("dimensions", mode="before")
    @classmethod
    def _whole_number(cls, value: object) -> object:
        """64.0 is the integer 64, as JSON Schema counts it (strict pydantic would refuse it)."""
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    def images(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


EMBEDDINGS_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": EmbeddingsRequest.model_json_schema()}},
    }
}


def _uploads(images: list[str], max_upload_bytes: int) -> list[Upload]:
    return [
        data_uri_upload(image, f"input[{i}]", max_upload_bytes) for i, image in enumerate(images)
    ]


def build_openai_routes() -> APIRouter:
    """``POST /v1/embeddings``."""
    router = APIRouter()

    @router.post(
        ROUTE,
        response_model=schemas.EmbeddingsResponse,
        tags=["openai"],
        dependencies=[Depends(authorize), only_query()],
        openapi_extra=EMBEDDINGS_BODY,
        responses=schemas.openai_errors(),
    )
    async def embeddings(request: Request, state: State) -> JSONResponse:
        """Each image's embedding, in OpenAI's embeddings API: what /embed answers for it."""
        settings = state.settings
        deadline = time.perf_counter() + settings.request_timeout_s
        body = await read_json(state, request, EmbeddingsRequest, f"the {ROUTE} body")
        async with state.registry.using(body.model) as model:
            note_model(model)
            dim = model.card.model.embedding_dim
            if body.dimensions is not None and body.dimensions != dim:
                raise ServiceError(
                    400,
                    "unsupported_dimensions",
                    f"dimensions {str(body.dimensions)[:20]}: model {model.name!r} embeds images "
                    f"in {dim} dimensions, which cannot be shortened; give {dim} or leave "
                    "dimensions out",
                )
            images = body.images()
            if len(images) > settings.max_files:
                raise ServiceError(
                    413,
                    "too_many_files",
                    f"{len(images)} inputs; at most {settings.max_files} per request",
                )
            limit = settings.max_upload_bytes
            if sum(map(len, images)) < INLINE_PARSE_BYTES:
                uploads = _uploads(images, limit)
            else:  # megabytes of base64 decoded in the decode pool, off the event loop
                loop = asyncio.get_running_loop()
                uploads = await loop.run_in_executor(state.decoder, _uploads, images, limit)
            outputs = await infer_uploads(state, model, uploads, deadline, ROUTE)
        data: list[dict[str, Any]] = []
        for n, vector in enumerate(outputs.embedding):  # (p,) float32: /embed's values
            embedding: list[float] | str
            if body.encoding_format == "base64":
                embedding = base64.b64encode(vector.astype("<f4").tobytes()).decode()
            else:
                embedding = vector.astype(np.float64).tolist()
            data.append({"object": "embedding", "index": n, "embedding": embedding})
        usage = {"prompt_tokens": 0, "total_tokens": 0}
        answer = {"object": "list", "data": data, "model": model.name, "usage": usage}
        return JSONResponse(answer)

    return router
