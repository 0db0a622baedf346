"""The reference statistics of typicality (see :mod:`service.typicality`), fitted at export.

From the exported model's outputs on the validation split (logits ``(n, K)``, embedding
``(n, p)``, labels ``(n,)``):

* the mean ``mu`` and covariance ``S = X^T X / (n - 1)`` of the embeddings, and the shared
  within-class covariance ``S_w = sum_c sum_{i in c} (z_i - mu_c)(z_i - mu_c)^T / (n - K')``
  with the class means ``mu_c`` (K' classes present);
* each covariance ridged, ``S + 1e-3 tr(S) / p I``, then inverted through its eigenvectors:
  exactly for ``p <= 256``; above, as probabilistic PCA (the top 256 directions kept, the rest
  given their mean variance), so that the card holds ``p x 256`` numbers, not ``p x p``;
* the three terms' means and standard deviations, and every validation image's score (sorted),
  for the p-value.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from service.typicality import Precision, Typicality

__all__ = ["FULL_RANK_MAX", "MAX_EMBEDDING", "fit", "reference_section"]

log = logging.getLogger(__name__)

#: Up to this embedding size the precision is the exact inverse; above, probabilistic PCA of
#: this rank.
FULL_RANK_MAX = 256
#: Embeddings larger than this get no reference (bilinear pooling's 32,896 numbers, say): a
#: covariance of that size can be neither estimated from a validation split nor stored.
MAX_EMBEDDING = 8192
RIDGE = 1e-3


def _precision(covariance: np.ndarray) -> Precision:
    p = covariance.shape[0]
    covariance = covariance + RIDGE * np.trace(covariance) / p * np.eye(p)
    values, vectors = np.linalg.eigh(covariance)  # ascending
    if p <= FULL_RANK_MAX:
        return Precision(0.0, vectors, 1.0 / values)
    top, basis = values[-FULL_RANK_MAX:], vectors[:, -FULL_RANK_MAX:]
    rest = float(values[:-FULL_RANK_MAX].mean())  # the isotropic variance of the other directions
    return Precision(1.0 / rest, basis, 1.0 / top - 1.0 / rest)


def fit(logits: np.ndarray, embedding: np.ndarray, labels: np.ndarray) -> Typicality:
    """The statistics of ``n`` validation images' outputs (see the module docstring)."""
    z = np.asarray(embedding, np.float64)
    n, p = z.shape
    if n < 2 * p or n < 20:
        raise ValueError(f"{n} validation images are too few for a {p}-dimensional embedding "
                         f"(at least {max(2 * p, 20)})")  # fmt: skip
    mean = z.mean(axis=0)
    centred = z - mean
    precision = _precision(centred.T @ centred / (n - 1))
    classes = np.unique(labels)
    class_means = np.stack([z[labels == c].mean(axis=0) for c in classes])
    within = z - class_means[np.searchsorted(classes, labels)]
    within_precision = _precision(within.T @ within / max(n - len(classes), 1))
    draft = Typicality(mean, precision, class_means, within_precision,
                       np.tile([0.0, 1.0], (3, 1)), np.zeros(1), n)  # fmt: skip
    terms = draft.terms(logits, z)
    standardise = np.stack([terms.mean(axis=0), terms.std(axis=0) + 1e-12], axis=1)
    scores = ((terms - standardise[:, 0]) / standardise[:, 1]).sum(axis=1)
    return Typicality(mean, precision, class_means, within_precision, standardise,
                      np.sort(scores), n)  # fmt: skip


def reference_section(
    session: Any, checkpoint: Path, data_root: str | None, embedding_dim: int, batch: int = 256
) -> tuple[dict[str, Any] | None, str | None]:
    """The card's ``typicality`` section from ``session`` (the exported file, on the CPU) run
    on the checkpoint's validation split, or ``(None, why not)``."""
    if embedding_dim > MAX_EMBEDDING:
        return None, (f"the embedding has {embedding_dim} dimensions, more than "
                      f"{MAX_EMBEDDING}: no covariance reference")  # fmt: skip
    from training.evaluate import load_with_splits

    try:
        _, _, splits = load_with_splits(checkpoint, data_root)
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        return None, f"no validation images at hand ({error})"
    if len(splits.val) == 0:
        return None, "the training run held out no validation images"
    logits, embedding, labels = [], [], []
    for start in range(0, len(splits.val), batch):
        items = [splits.val[i] for i in range(start, min(start + batch, len(splits.val)))]
        images = np.stack([image.numpy() for image, _ in items]).astype(np.float32)
        out_logits, out_embedding = session.run(["logits", "embedding"], {"image": images})
        logits.append(out_logits)
        embedding.append(out_embedding)
        labels.extend(int(label) for _, label in items)
    try:
        typicality = fit(np.concatenate(logits), np.concatenate(embedding), np.asarray(labels))
    except ValueError as error:
        return None, str(error)
    return typicality.to_card(), None
