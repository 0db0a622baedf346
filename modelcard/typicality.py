"""How typical an image is of the model's training data: a score and a calibrated p-value.

The reference statistics come with the model, in its card's ``typicality`` section (written by
``smso-export`` from the validation split: :mod:`export.typicality`). For an image with logits
``l`` (K), embedding ``z`` (p, the SMSO head's output after its affine step) and, in files that
have it, ``f`` (the backbone's last feature map averaged over positions: the ONNX output
``features``) the score adds three or four terms, each standardised by its mean ``a`` and
standard deviation ``b`` on the validation images::

    m_class(z) = min_c (z - mu_c)^T P_w (z - mu_c)     class means mu_c, shared within-class
                                                       precision P_w (Lee et al., 2018)
    m_all(z)   = (z - mu)^T P (z - mu)                 mean mu and precision P of all images
    E(l)       = -log sum_k exp(l_k)                   energy (Liu et al., 2020)
    m_feat(f)  = min_c (f - nu_c)^T Q_w (f - nu_c)     as m_class, on the backbone's features

    score = sum_t (term_t - a_t) / b_t     over log m_class, log m_all, E (and log m_feat)

Higher means less typical. A Mahalanobis distance is unchanged by an affine map of ``z``, so the
embedding served (``z''``) gives what ``z'`` would. The p-value is the share of validation images
at least as atypical, ``(1 + #{s_ref >= score}) / (n + 1)``: it means the same for every model
(about 1 % of in-distribution images fall below 0.01).

A precision matrix is stored as ``P = alpha I + U diag(w) U^T`` with an orthonormal basis ``U``
(p x r): the full inverse (``alpha = 0``, r = p) for small p, a probabilistic-PCA form (the top r
directions, the rest isotropic) for large p. Distances to M centres for N embeddings then take
two matrix products, ``(N, p) @ (p, r)`` and ``(N, p) @ (p, M)``, in float64.

Files exported since the score became part of the graph compute it themselves, in float32, as
an output ``typicality`` (:mod:`export.typicality_graph`); the service then only looks up the
p-value, and computes the score here for older files.

Arrays in the card are little-endian float32, base64-encoded, with their shape
(:func:`encode_array`).
"""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "FORMAT",
    "Precision",
    "Typicality",
    "decode_array",
    "encode_array",
    "energy",
    "summary",
]

#: The card section's format version; a card with another one is served without typicality.
FORMAT = 1
SCORE = "standardised log class-conditional Mahalanobis + log Mahalanobis + energy"
FEATURE_TERM = " + log class-conditional Mahalanobis of the backbone's features"


def encode_array(array: np.ndarray) -> dict[str, Any]:
    """``{"shape": [...], "float32_base64": "..."}`` (little-endian float32)."""
    data = np.ascontiguousarray(array, "<f4")
    return {"shape": list(data.shape), "float32_base64": base64.b64encode(data.tobytes()).decode()}


def decode_array(value: dict[str, Any]) -> np.ndarray:
    """The float64 array :func:`encode_array` wrote; ValueError if it does not fit its shape."""
    shape = tuple(int(d) for d in value["shape"])
    data = np.frombuffer(base64.b64decode(value["float32_base64"]), "<f4")
    if data.size != int(np.prod(shape)):
        raise ValueError(f"an array of shape {list(shape)} holds {data.size} numbers")
    return data.reshape(shape).astype(np.float64)


def energy(logits: np.ndarray) -> np.ndarray:
    """``-log sum_k exp(l_k)`` per row of ``(N, K)`` logits, computed stably: ``(N,)``."""
    top = logits.max(axis=1, keepdims=True)
    return -(top[:, 0] + np.log(np.exp(logits - top).sum(axis=1)))


@dataclass(frozen=True)
class Precision:
    """``P = alpha I + basis diag(weights) basis^T``: ``basis`` (p, r) orthonormal columns."""

    alpha: float
    basis: np.ndarray  # (p, r)
    weights: np.ndarray  # (r,)

    def distances(self, x: np.ndarray, centres: np.ndarray) -> np.ndarray:
        """``(x_i - c_j)^T P (x_i - c_j)`` for ``x`` (N, p) and ``centres`` (M, p): (N, M)."""
        return _Centred(self, centres).distances(x)

    def to_card(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "basis": encode_array(self.basis),
            "weights": encode_array(self.weights),
        }

    @classmethod
    def from_card(cls, value: dict[str, Any]) -> Precision:
        return cls(
            float(value["alpha"]), decode_array(value["basis"]), decode_array(value["weights"])
        )


class _Centred:
    """A precision and its centres, the centres' part of the distances computed once: each call
    then takes the products of ``x`` alone."""

    def __init__(self, precision: Precision, centres: np.ndarray) -> None:
        self.precision, self.centres = precision, centres
        projected = centres @ precision.basis  # (M, r)
        self.weighted = (projected * precision.weights).T  # (r, M)
        self.norms = (projected**2 @ precision.weights)[None, :]  # (1, M)
        self.squares = (centres**2).sum(1)[None, :] if precision.alpha else None

    def distances(self, x: np.ndarray) -> np.ndarray:
        p = self.precision
        xu = x @ p.basis  # (N, r)
        d = (xu**2 @ p.weights)[:, None] - 2 * xu @ self.weighted + self.norms
        if self.squares is not None:
            d += p.alpha * ((x**2).sum(1)[:, None] - 2 * x @ self.centres.T + self.squares)
        return np.maximum(d, 0.0)  # rounding can leave -1e-12 for a point on a centre


@dataclass(frozen=True)
class Typicality:
    """A model's reference statistics, and the score and p-value of new images."""

    mean: np.ndarray  # (p,) mu
    precision: Precision  # P, of all validation images
    class_means: np.ndarray  # (K', p) mu_c, of the classes the validation split holds
    within: Precision  # P_w, shared within-class precision
    standardise: np.ndarray  # (T, 2): (a, b) of log m_class, log m_all, E (, log m_feat)
    reference: np.ndarray  # (n,) the validation images' scores, ascending
    images: int  # validation images the statistics come from
    feature_means: np.ndarray | None = None  # (K', C_b) nu_c, where the file has ``features``
    feature_within: Precision | None = None  # Q_w

    @functools.cached_property
    def _centred(self) -> list[_Centred]:
        """The class-conditional, overall (and features') distances, their centres prepared."""
        pairs = [
            _Centred(self.within, self.class_means),
            _Centred(self.precision, self.mean[None, :]),
        ]
        if self.feature_means is not None and self.feature_within is not None:
            pairs.append(_Centred(self.feature_within, self.feature_means))
        return pairs

    @property
    def uses_features(self) -> bool:
        """Whether the score needs the model's ``features`` output."""
        return self.feature_means is not None

    def terms(
        self, logits: np.ndarray, embedding: np.ndarray, features: np.ndarray | None = None
    ) -> np.ndarray:
        """``log m_class``, ``log m_all``, ``E`` (and ``log m_feat``) of each image: (N, T)."""
        z = np.asarray(embedding, np.float64)
        within, overall, *features_term = self._centred
        m_class = within.distances(z).min(axis=1)
        m_all = overall.distances(z)[:, 0]
        tiny = np.finfo(np.float64).tiny  # an image on a centre: log of the smallest, not -inf
        columns = [
            np.log(np.maximum(m_class, tiny)),
            np.log(np.maximum(m_all, tiny)),
            energy(np.asarray(logits, np.float64)),
        ]
        if features_term:
            if features is None:
                raise ValueError("this reference scores the model's features output too")
            f = np.asarray(features, np.float64)
            m_feat = features_term[0].distances(f).min(axis=1)
            columns.append(np.log(np.maximum(m_feat, tiny)))
        return np.stack(columns, axis=1)

    def score(
        self, logits: np.ndarray, embedding: np.ndarray, features: np.ndarray | None = None
    ) -> np.ndarray:
        """The typicality score of each image: (N,), higher = less typical."""
        a, b = self.standardise[:, 0], self.standardise[:, 1]
        return ((self.terms(logits, embedding, features) - a) / b).sum(axis=1)

    def p_value(self, scores: np.ndarray) -> np.ndarray:
        """The share of validation images at least as atypical as each score: (N,)."""
        n = len(self.reference)
        at_least = n - np.searchsorted(self.reference, scores, side="left")
        return (1.0 + at_least) / (n + 1.0)

    def to_card(self) -> dict[str, Any]:
        """The card's ``typicality`` section (:class:`modelcard.card.TypicalitySection` but for
        its ``output``, which the exported graph decides)."""
        features = None
        if self.feature_means is not None and self.feature_within is not None:
            features = {
                "class_means": encode_array(self.feature_means),
                "within": self.feature_within.to_card(),
            }
        return {
            "features": features,
            "format": FORMAT,
            "score": SCORE + (FEATURE_TERM if features else ""),
            "images": self.images,
            "embedding_dim": int(self.mean.shape[0]),
            "mean": encode_array(self.mean),
            "precision": self.precision.to_card(),
            "class_means": encode_array(self.class_means),
            "within": self.within.to_card(),
            "standardise": self.standardise.tolist(),
            "reference": encode_array(self.reference),
        }

    @classmethod
    def from_card(cls, section: dict[str, Any]) -> Typicality:
        """The statistics in a card's ``typicality`` section; ValueError (what is wrong) if the
        section is of another format or inconsistent."""
        if section.get("format") != FORMAT:
            raise ValueError(f"typicality format {section.get('format')!r}, not {FORMAT}")
        try:
            features = section.get("features")
            made = cls(
                mean=decode_array(section["mean"]),
                precision=Precision.from_card(section["precision"]),
                class_means=decode_array(section["class_means"]),
                within=Precision.from_card(section["within"]),
                standardise=np.asarray(section["standardise"], np.float64).reshape(-1, 2),
                reference=np.sort(decode_array(section["reference"])),
                images=int(section["images"]),
                feature_means=None if not features else decode_array(features["class_means"]),
                feature_within=None if not features else Precision.from_card(features["within"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"typicality section unreadable: {error}") from None
        p = made.mean.shape[0]
        shapes_fit = (
            made.precision.basis.shape[0] == made.within.basis.shape[0] == p
            and made.class_means.ndim == 2
            and made.class_means.shape[1] == p
            and len(made.reference) > 0
            and bool(np.all(made.standardise[:, 1] > 0))
            and len(made.standardise) == (4 if made.uses_features else 3)
        )
        if made.feature_means is not None and made.feature_within is not None:
            shapes_fit = shapes_fit and (
                made.feature_means.ndim == 2
                and made.feature_means.shape[1] == made.feature_within.basis.shape[0]
            )
        if not shapes_fit:
            raise ValueError("typicality section inconsistent: shapes or scales do not fit")
        return made


def summary(section: dict[str, Any] | None) -> dict[str, Any] | None:
    """What ``/metadata`` says of a card's ``typicality`` section: its description, not its
    arrays (which can be megabytes for a large embedding)."""
    if not section:
        return None
    return {
        "score": section.get("score"),
        "p_value": "share of the reference images at least as atypical",
        "reference_images": section.get("images"),
        "computed_by": (
            "the model file (its output typicality)"
            if section.get("output")
            else "the service, from the model's outputs"
        ),
        "embedding_dim": section.get("embedding_dim"),
        "format": section.get("format"),
    }
