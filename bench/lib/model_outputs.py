"""A model's outputs for many images, as the service computes them, cached on disk.

Each image is written as a PNG, decoded and preprocessed by the service's decoder
(``service.imaging.images.Preprocessor``) and run through the service's onnxruntime session
(``service.runtime.backend.OnnxBackend``) in batches of :data:`BATCH`: the embedding ``/embed``
answers, the top-1 class and its softmax probability (``/classify``'s), and the typicality score
where the model file has one. Results are kept under ``cache`` by the model file's checksum and
the images' name, so a second run reads them back.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["BATCH", "Outputs", "outputs"]

BATCH = 256


@dataclass(frozen=True)
class Outputs:
    """``N`` images' outputs, row ``i`` for image ``i``."""

    embeddings: np.ndarray  # (N, p) float32
    top1: np.ndarray  # (N,) int32: the class index
    max_softmax: np.ndarray  # (N,) float32: the top-1 class's probability
    typicality: np.ndarray  # (N,) float64: the served score (higher: less typical); NaN: none


def _png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG")
    return buffer.getvalue()


def _file_sha(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _compute(model: Path, count: int, images: Callable[[int, int], np.ndarray]) -> Outputs:
    from service.imaging.images import Preprocessor
    from service.runtime.backend import BackendOptions, OnnxBackend

    backend = OnnxBackend(model, BackendOptions(providers="auto", max_batch=BATCH))
    preprocess = Preprocessor(backend.card.preprocessing, 50_000_000)
    parts: dict[str, list[np.ndarray]] = {"e": [], "t": [], "s": [], "y": []}
    for start in range(0, count, BATCH):
        chunk = images(start, min(BATCH, count - start))
        answer = backend.run(np.stack([preprocess(_png(image)) for image in chunk]))
        logits = answer.logits.astype(np.float64)
        probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        parts["e"].append(answer.embedding.astype(np.float32))
        parts["t"].append(logits.argmax(axis=1).astype(np.int32))
        parts["s"].append(probabilities.max(axis=1).astype(np.float32))
        score = answer.typicality
        parts["y"].append(
            np.full(len(chunk), np.nan) if score is None else np.asarray(score, np.float64)
        )
    backend.terminate()
    return Outputs(*(np.concatenate(parts[key]) for key in ("e", "t", "s", "y")))


def outputs(
    model: Path,
    name: str,
    count: int,
    images: Callable[[int, int], np.ndarray],
    cache: Path | None,
) -> Outputs:
    """The outputs of ``count`` images, ``images(start, n)`` giving images ``start..start+n-1``
    as ``(n, H, W)`` uint8; read from ``cache`` where an earlier run of the same model file
    and ``name`` left them."""
    path = None
    if cache is not None:
        path = cache / f"{_file_sha(Path(model))}-{name}-{count}.npz"
        if path.exists():
            with np.load(path) as stored:
                return Outputs(*(stored[key] for key in ("e", "t", "s", "y")))
    found = _compute(Path(model), count, images)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial.npz")
        np.savez(partial, e=found.embeddings, t=found.top1, s=found.max_softmax, y=found.typicality)
        partial.replace(path)
    return found
