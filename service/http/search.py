"""``/search``: each image's nearest items in the gallery beside the model, for the default model
and under ``/models/{name}[/versions/{version}]`` (:data:`service.http.routes.TARGETS`).

The images come as they come to ``/classify`` (multipart parts named ``file``, or one image as
the body), read, decoded and batched by the same path, so that an image's query is exactly what
``/embed`` answers for it; each result also gives the image's own top-1 class as ``/classify``
names it. A JSON body ``{"embedding": [p numbers]}`` (or ``{"embeddings": [[...], ...]}``)
searches vectors instead, without running the model. ``?k=`` neighbours (1 to
:data:`~gallery.search.MAX_K`), ``?min_similarity=`` keeps those at or above it. The answer
names the model and the gallery generation that produced it. Without a gallery beside the
model: 404 ``no_gallery``, saying why and how to give one.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gallery.search import Neighbour
from service.dataplane.answers import top_classes
from service.dataplane.search import MAX_K, query_vectors, search_gallery, served_gallery
from service.http import schemas
from service.http.dependencies import State, authorize
from service.http.json_bodies import is_json, read_json
from service.http.routes import (
    IMAGE_BODY,
    TARGETS,
    Named,
    infer_request,
    model_ref,
    only_query,
    typicality_of,
)
from service.telemetry.access import note_model

__all__ = ["SearchBody", "build_search_routes"]

Vector = Annotated[list[float], Field(min_length=1)]


class SearchBody(BaseModel):
    """``/search``'s JSON body: one query vector, or several (what ``/embed`` answers)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        json_schema_extra={"oneOf": [{"required": ["embedding"]}, {"required": ["embeddings"]}]},
    )
    # exactly one of them is given (the schema's oneOf, and _one_of_both)
    embedding: Vector = Field(
        default_factory=list, description="one query: the p values /embed answers"
    )
    embeddings: Annotated[list[Vector], Field(min_length=1)] = Field(
        default_factory=list, description="several queries, each p values"
    )

    @model_validator(mode="before")
    @classmethod
    def _one_of_both(cls, data: object) -> object:
        if isinstance(data, dict) and ("embedding" in data) == ("embeddings" in data):
            raise ValueError(
                'give either "embedding": [p numbers] or "embeddings": [[p numbers], ...]'
            )
        return data

    def vectors(self) -> list[list[float]]:
        return [self.embedding] if "embedding" in self.model_fields_set else self.embeddings


#: The images as /classify takes them, or the JSON body.
SEARCH_BODY: dict[str, Any] = copy.deepcopy(IMAGE_BODY)
SEARCH_BODY["requestBody"]["content"]["application/json"] = {
    "schema": SearchBody.model_json_schema()
}

K = "neighbours per query, best first (fewer where the gallery holds fewer)"
MIN_SIMILARITY = (
    "keep only the neighbours at this similarity or above (1: the same embedding); fewer than "
    "k, or none, may be left"
)


def build_search_routes() -> APIRouter:
    """``/search`` under each prefix of :data:`~service.http.routes.TARGETS`."""
    router = APIRouter()
    for prefix, target in TARGETS.items():
        _search_route(router, prefix, target)
    return router


def _neighbours(found: list[Neighbour]) -> list[dict[str, Any]]:
    return [{"path": n.path, "similarity": n.similarity, "label": n.label} for n in found]


def _search_route(router: APIRouter, prefix: str, target: Callable[..., Awaitable[Named]]) -> None:
    tags: list[str | Enum] = ["inference"] if not prefix else ["models"]
    named_by_path = Depends(target)

    @router.post(
        f"{prefix}/search",
        response_model=schemas.SearchResponse,
        tags=tags,
        dependencies=[Depends(authorize), only_query("k", "min_similarity", "filename")],
        openapi_extra=SEARCH_BODY,
        responses=schemas.SEARCH_ERRORS,
    )
    async def search(
        request: Request,
        state: State,
        named: Named = named_by_path,
        k: Annotated[int, Query(ge=1, le=MAX_K, description=K)] = 10,
        min_similarity: Annotated[
            float | None, Query(ge=-1.0, le=1.0, allow_inf_nan=False, description=MIN_SIMILARITY)
        ] = None,
    ) -> JSONResponse:
        """The nearest gallery items of each image (or embedding), best first, one result per
        query in order, with the image's own top-1 class."""
        async with state.registry.using(*named) as model:
            served = served_gallery(model)  # the one gallery this request searches
            if is_json(request):
                note_model(model)
                body = await read_json(state, request, SearchBody, "the /search body")
                queries = query_vectors(body.vectors(), served, state.settings.max_files)
                found = await search_gallery(state, model, served, queries, k, min_similarity)
                results = [
                    {"filename": None, "prediction": None, "neighbours": _neighbours(f)}
                    for f in found
                ]
            else:
                uploads, outputs = await infer_request(state, model, request, "/search")
                found = await search_gallery(
                    state, model, served, outputs.embedding, k, min_similarity
                )
                scores, best = top_classes(outputs.logits, 1)
                classes = model.card.classes
                results = [
                    {
                        "filename": upload.filename,
                        "prediction": {
                            "label": classes[best[n, 0]],
                            "index": int(best[n, 0]),
                            "score": float(scores[n, best[n, 0]]),
                        },
                        "neighbours": _neighbours(found[n]),
                    }
                    | typicality_of(outputs, n)
                    for n, upload in enumerate(uploads)
                ]
        manifest = served.gallery.manifest
        gallery = {
            "generation": manifest.generation,
            "items": served.gallery.size,
            "dtype": manifest.dtype.value,
        }
        return JSONResponse({"model": model_ref(model), "gallery": gallery, "results": results})
