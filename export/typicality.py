"""The reference statistics of typicality (see :mod:`modelcard.typicality`), fitted at export.

From the exported model's outputs on the validation split (logits ``(n, K)``, embedding
``(n, p)``, the backbone's averaged features ``(n, C_b)`` where the file has them, labels
``(n,)``):

* the mean ``mu`` and covariance ``S = X^T X / (n - 1)`` of the embeddings, and the shared
  within-class covariance ``S_w = sum_c sum_{i in c} (z_i - mu_c)(z_i - mu_c)^T / (n - K')``
  with the class means ``mu_c`` (K' classes present);
* each covariance ridged, ``S + 1e-3 tr(S) / p I``, then inverted through its eigenvectors:
  exactly for ``p <= 256``; above, as probabilistic PCA (the top 256 directions kept, the rest
  given their mean variance), so that the card holds ``p x 256`` numbers, not ``p x p``;
* the same class means and shared within-class precision of the features (the fourth term);
* the terms' means and standard deviations, and every validation image's score (sorted), for
  the p-value.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelcard.typicality import Precision, Typicality
from training.datasets.base import Splits

__all__ = ["FULL_RANK_MAX", "MAX_EMBEDDING", "MIN_PER_CLASS", "fit", "reference_section"]

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


def _class_conditional(x: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, Precision]:
    """Class means of the classes present, and the precision of the shared within-class
    covariance."""
    classes = np.unique(labels)
    means = np.stack([x[labels == c].mean(axis=0) for c in classes])
    within = x - means[np.searchsorted(classes, labels)]
    return means, _precision(within.T @ within / max(len(x) - len(classes), 1))


#: Validation images a class needs for its mean in the class-conditional terms.
MIN_PER_CLASS = 2


def _check_classes(labels: np.ndarray, names: Sequence[str] | None = None) -> None:
    """ValueError if a class present in ``labels`` (n,) has fewer than ``MIN_PER_CLASS`` images;
    the message names each such class by its label and, given ``names`` (label order), its name.

    An image alone in its class *is* that class's mean: its class-conditional distance is 0, so
    its log is whatever rounding leaves (float64 and the card's float32 give scores 6 apart),
    and the one outlier sets the term's standard deviation for every other image.
    """
    classes, counts = np.unique(labels, return_counts=True)
    few = {int(c): int(k) for c, k in zip(classes, counts, strict=True) if k < MIN_PER_CLASS}
    if few:
        listed = ", ".join(
            f"class {c}{f' ({names[c]})' if names and c < len(names) else ''}: {k}"
            for c, k in sorted(few.items())
        )
        raise ValueError(
            f"a class-conditional reference needs at least {MIN_PER_CLASS} validation images "
            f"of each class, and the split holds fewer ({listed} image(s)): the file is "
            "written without one, and the service serves it without typicality scores. For a "
            "reference, hold out more images of those classes (a val/ folder, a larger "
            "val_size or another seed) and export again"
        )


def fit(
    logits: np.ndarray,
    embedding: np.ndarray,
    labels: np.ndarray,
    features: np.ndarray | None = None,
    class_names: Sequence[str] | None = None,
) -> Typicality:
    """The statistics of ``n`` validation images' outputs (see the module docstring);
    ``class_names`` (label order) only name the classes in the error for too few images."""
    z = np.asarray(embedding, np.float64)
    n, p = z.shape
    widest = max(p, 0 if features is None else features.shape[1])
    if n < 2 * widest or n < 20:
        raise ValueError(
            f"{n} validation images are too few for {widest}-dimensional outputs "
            f"(at least {max(2 * widest, 20)})"
        )
    _check_classes(np.asarray(labels), class_names)
    mean = z.mean(axis=0)
    centred = z - mean
    precision = _precision(centred.T @ centred / (n - 1))
    class_means, within_precision = _class_conditional(z, labels)
    feature_means = feature_within = None
    if features is not None:
        feature_means, feature_within = _class_conditional(np.asarray(features, np.float64), labels)
    count = 3 if features is None else 4
    draft = Typicality(
        mean,
        precision,
        class_means,
        within_precision,
        np.tile([0.0, 1.0], (count, 1)),
        np.zeros(1),
        n,
        feature_means,
        feature_within,
    )
    # Terms and scores from the statistics as the card stores them (float32), which the
    # service scores with: the reference holds the scores the service computes.
    draft = Typicality.from_card(draft.to_card())
    terms = draft.terms(logits, z, features)
    standardise = np.stack([terms.mean(axis=0), terms.std(axis=0) + 1e-12], axis=1)
    stored = dataclasses.replace(draft, standardise=standardise)  # the card keeps it in full
    scores = stored.score(logits, z, features)
    return dataclasses.replace(stored, reference=np.sort(scores))


def reference_section(
    session: Any, splits: Splits, embedding_dim: int, batch: int = 256
) -> tuple[dict[str, Any] | None, str | None]:
    """The card's ``typicality`` section from ``session`` (the exported file, on the CPU) run
    on the validation split of ``splits`` (the checkpoint's dataset), or ``(None, why not)``."""
    if embedding_dim > MAX_EMBEDDING:
        return None, (
            f"the embedding has {embedding_dim} dimensions, more than "
            f"{MAX_EMBEDDING}: no covariance reference"
        )
    if len(splits.val) == 0:
        return None, "the training run held out no validation images"
    needed = max(2 * embedding_dim, 20)
    if len(splits.val) < needed:  # said before any work, and as what it is: no reference at all
        return None, (
            f"the validation split holds {len(splits.val)} images and a reference for a "
            f"{embedding_dim}-dimensional embedding needs at least {needed}: the file is "
            "written without one, and the service serves it without typicality scores. For a "
            f"reference, hold out {needed} or more validation images (a val/ folder, or more "
            "images per class) and export again"
        )
    names = [o.name for o in session.get_outputs()]
    wanted = ["logits", "embedding"] + (["features"] if "features" in names else [])
    outputs: list[list[np.ndarray]] = [[] for _ in wanted]
    labels: list[int] = []
    for start in range(0, len(splits.val), batch):
        items = [splits.val[i] for i in range(start, min(start + batch, len(splits.val)))]
        images = np.stack([image.numpy() for image, _ in items]).astype(np.float32)
        for collected, out in zip(outputs, session.run(wanted, {"image": images}), strict=True):
            collected.append(out)
        labels.extend(int(label) for _, label in items)
    logits, embedding, *features = (np.concatenate(out) for out in outputs)
    if features and len(labels) < max(2 * features[0].shape[1], 20):
        log.warning(
            "typicality without the features term: %d validation images are too few for "
            "%d features",
            len(labels),
            features[0].shape[1],
        )
        features = []
    try:
        typicality = fit(
            logits,
            embedding,
            np.asarray(labels),
            features[0] if features else None,
            class_names=splits.classes,
        )
    except ValueError as error:
        return None, str(error)
    return typicality.to_card(), None
