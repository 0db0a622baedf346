"""Typicality scored where the model runs: the card's reference, and a run function that
answers each image's score and p-value beside the logits and the embedding.

The service's loader wraps each model's backend with :func:`scored`, and so does the batch
job (``smso-embed``), which imports this module without the service's loader and batcher.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from modelcard.typicality import Typicality
from service.runtime.backend import Backend
from service.runtime.outputs import BackendOutputs
from service.runtime.runner import Batch
from service.telemetry import stage_clock

__all__ = ["scored", "typicality_reference"]

log = logging.getLogger("service")

#: What a backend's run is: a batch of preprocessed images -> its outputs.
RunFn = Callable[[Batch], BackendOutputs]


def typicality_reference(backend: Backend, enabled: bool, name: str) -> Typicality | None:
    """The card's typicality reference, if it has one and scoring is on; a section that cannot
    be read is logged and the model served without it (``smso-embed`` scores with it too)."""
    section = (getattr(backend, "card_dict", None) or {}).get("typicality")
    if not enabled or not section:
        return None
    try:
        typicality = Typicality.from_card(section)
    except ValueError as error:
        log.warning("model %s is served without typicality: %s", name, error)
        return None
    expected = backend.card.model.embedding_dim
    if typicality.mean.shape[0] != expected:
        log.warning(
            "model %s is served without typicality: its reference is of %d dimensions, "
            "its embedding of %d",
            name,
            typicality.mean.shape[0],
            expected,
        )
        return None
    outputs = _outputs(backend)
    if typicality.uses_features and not {"typicality", "features"} & set(outputs):
        log.warning(
            "model %s is served without typicality: its reference scores a features "
            "output the file does not have",
            name,
        )
        return None
    return typicality


def _outputs(backend: Backend) -> list[str]:
    """What ``backend.run`` answers (a test's fake may not say: logits and embedding)."""
    return list(getattr(backend, "outputs", None) or ["logits", "embedding"])


def scored(run: RunFn, typicality: Typicality | None) -> RunFn:
    """``run`` answering logits and embedding only, and with a ``typicality`` reference each
    image's typicality score ``(N,)`` float64 and its ``p_value`` ``(N,)``, in the inference
    thread. The score is the file's own output ``typicality`` where it has one (computed by
    onnxruntime, in float32), else computed here in numpy from the logits, embedding and
    ``features`` (the stage ``score`` of :mod:`service.telemetry.stage_clock`)."""

    def run_and_score(images: Batch) -> BackendOutputs:
        outputs = run(images)
        logits, embedding = outputs.logits, outputs.embedding
        if typicality is None:
            return BackendOutputs(logits=logits, embedding=embedding)
        start = time.perf_counter()
        if outputs.typicality is not None:  # the file's own
            scores = outputs.typicality.astype(np.float64)
        else:
            scores = typicality.score(logits, embedding, outputs.features).astype(np.float64)
        p_value = typicality.p_value(scores).astype(np.float64)
        stage_clock.record("score", start)
        return BackendOutputs(
            logits=logits, embedding=embedding, typicality=scores, p_value=p_value
        )

    return run_and_score
