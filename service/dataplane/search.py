"""Searching the gallery beside a model: the queries' embeddings against the gallery that served
when the request began, off the event loop, timed.

A request takes the model's gallery once (:func:`served_gallery`: 404 ``no_gallery`` saying how
to give one where none serves) and searches that one (:func:`search_gallery`), whatever
replaces it meanwhile (:mod:`service.models.galleries`). The queries are what ``/embed``
answers for the images (the model's embeddings, float32), or vectors a client sent
(:func:`query_vectors` checks them against the gallery): the gallery standardises and, where it
holds unit vectors, normalises them itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np

from gallery.search import MAX_K, Neighbour
from service.core.errors import ServiceError
from service.dataplane.state import ServiceState
from service.models.galleries import ServedGallery
from service.models.registry import LoadedModel

__all__ = ["HOW_TO_GIVE", "MAX_K", "query_vectors", "search_gallery", "served_gallery"]

#: How a server is given a gallery, for the 404's message.
HOW_TO_GIVE = (
    "start smso-serve with --gallery GALLERY (SMSO_GALLERY_PATH), a folder that smso-index "
    "wrote from this model's smso-embed output; in a model repository, the folder gallery/ "
    "beside the version's model.onnx"
)


def served_gallery(model: LoadedModel) -> ServedGallery:
    """The gallery serving beside ``model`` now; 404 ``no_gallery`` (with the reason where one
    was refused) when none does."""
    served = model.gallery.current
    if served is not None:
        return served
    refused = model.gallery.refused
    why = f" (the gallery was refused: {refused})" if refused else ""
    raise ServiceError(
        404,
        "no_gallery",
        f"no gallery is loaded beside model {model.name!r} version {model.version!r}{why}; "
        f"{HOW_TO_GIVE}",
    )


def query_vectors(
    vectors: Sequence[Sequence[float]], served: ServedGallery, limit: int
) -> np.ndarray:
    """A client's query vectors as ``(Q, p)`` float32; 413 beyond ``limit`` queries, 400
    ``invalid_embedding`` for a vector of another size than the gallery's or one that float32
    cannot hold."""
    if len(vectors) > limit:
        raise ServiceError(
            413,
            "too_many_files",
            f"{len(vectors)} embeddings; at most {limit} queries per request (SMSO_MAX_FILES)",
        )
    dimension = served.gallery.manifest.dimension
    for i, vector in enumerate(vectors):
        if len(vector) != dimension:
            raise ServiceError(
                400,
                "invalid_embedding",
                f"embedding {i} has {len(vector)} values; the gallery (and the model's "
                f"embeddings) have {dimension}: send what /embed answers",
            )
    with np.errstate(over="ignore"):
        queries = np.asarray(vectors, np.float32).reshape(len(vectors), dimension)
    if not np.isfinite(queries).all():
        raise ServiceError(
            400,
            "invalid_embedding",
            "an embedding holds a value beyond float32's range (about 3.4e38)",
        )
    return queries


async def search_gallery(
    state: ServiceState,
    model: LoadedModel,
    served: ServedGallery,
    queries: np.ndarray,
    k: int,
    min_similarity: float | None,
) -> list[list[Neighbour]]:
    """Each of ``queries`` ``(Q, p)``'s ``k`` nearest items of ``served``, best first, those
    at ``min_similarity`` or above where given; in the decode pool (the event loop goes on),
    its time in ``smso_search_seconds``."""
    histogram = state.metrics.search.labels(model.name, model.version)

    def search() -> list[list[Neighbour]]:
        with served.lock:
            start = time.perf_counter()
            found = served.gallery.search(queries, k, min_similarity)
            histogram.observe(time.perf_counter() - start)
        return found

    return await asyncio.get_running_loop().run_in_executor(state.decoder, search)
