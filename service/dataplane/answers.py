"""What the model's outputs become in an answer: class scores, the best classes, a unit-length
embedding. Numpy only: the service's routes and the batch job (``smso-embed``) answer with the
same functions, and the batch job imports them without the service's request pipeline.
"""

from __future__ import annotations

import numpy as np

__all__ = ["l2_normalised", "softmax", "top_classes"]


def softmax(logits: np.ndarray) -> np.ndarray:
    """``exp(l_k - max l) / sum_j exp(l_j - max l)`` over the last axis, in float64."""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def l2_normalised(embeddings: np.ndarray) -> np.ndarray:
    """Each row of ``embeddings`` ``(N, p)`` divided by its L2 norm (at least 1e-12), in
    float64: what ``/embed?normalize=true`` answers (and ``smso-embed --normalize`` writes)."""
    vectors = embeddings.astype(np.float64)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def top_classes(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Softmax scores ``(N, K)`` of logits ``(N, K)`` and each row's ``k`` best class indices
    ``(N, min(k, K))``, best first (ties: the lower index): what /classify and the protocol's
    classification extension both answer."""
    scores = softmax(logits)
    return scores, np.argsort(-scores, axis=-1, kind="stable")[..., :k]
