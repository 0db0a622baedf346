"""The codes a gallery stores: the embeddings standardised per dimension, then kept as float32,
float16, int8 or one bit per dimension.

SMSO's embedding is ``z'' = beta + gamma * z'`` with ``z'`` close to ``N(0, 1)`` per dimension
(``../shared/SMSO.md``, Eqs. 6 and 7), so the gallery undoes the scale and shift it finds in the
embeddings themselves (``center`` ``mu_j`` and ``scale`` ``sigma_j``, the mean and standard
deviation of dimension ``j`` over the gallery's first build) and compares the standardised
vectors ``u = (x - mu) / sigma``, shape ``(N, p)``, by their cosine::

    similarity(u, v) = u . v / (|u| |v|)                          f32, f16, i8

    i8:  code_j = clip(round(u_j * 127 / I8_RANGE), -127, 127)    I8_RANGE standard deviations
    b1:  bit_j  = u_j > threshold_j                                threshold_j: the median of u_j
         similarity = 1 - 2 * hamming(a, b) / p                    the share of agreeing bits,
                                                                   rescaled to [-1, 1]

One range serves every dimension of an int8 code (the cosine of codes scaled differently per
dimension would not be the cosine of ``u``); the standardisation is what makes one range fit
them all. :class:`Standardisation` also reports how close to ``N(0, 1)`` the standardised
embeddings are (:attr:`Standardisation.fit`'s report), which docs/search.md gives per model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

__all__ = ["I8_RANGE", "Codec", "Dtype", "GaussianCheck", "Standardisation"]

#: int8 codes cover +-I8_RANGE standard deviations (a standard normal value falls outside
#: once in 16,000)
I8_RANGE = 4.0


class Dtype(enum.StrEnum):
    """The stored code (``smso-index --dtype``): bytes per image for p dimensions in brackets."""

    F32 = "f32"  # 4p
    F16 = "f16"  # 2p
    I8 = "i8"  # p
    B1 = "b1"  # p / 8

    @property
    def metric(self) -> str:
        """usearch's metric for the codes: the cosine, or the Hamming distance of bits."""
        return "hamming" if self is Dtype.B1 else "cos"

    def bytes_per_item(self, dimension: int) -> int:
        """Bytes of one code of ``dimension`` values."""
        if self is Dtype.B1:
            return (dimension + 7) // 8
        return dimension * {Dtype.F32: 4, Dtype.F16: 2, Dtype.I8: 1}[self]


@dataclass(frozen=True)
class GaussianCheck:
    """How close the standardised embeddings are to ``N(0, 1)`` per dimension: the largest
    excess kurtosis and skewness over the dimensions, and the share of values beyond
    :data:`I8_RANGE` (0.00006 for a normal distribution)."""

    max_abs_skewness: float
    max_abs_excess_kurtosis: float
    beyond_i8_range: float

    def to_json(self) -> dict[str, float]:
        return {
            "max_abs_skewness": self.max_abs_skewness,
            "max_abs_excess_kurtosis": self.max_abs_excess_kurtosis,
            "beyond_i8_range": self.beyond_i8_range,
        }


@dataclass(frozen=True)
class Standardisation:
    """Per dimension ``j``: ``center`` (mean), ``scale`` (standard deviation) and the median of
    the standardised values (``threshold``, the binary code's cut); each of shape ``(p,)``."""

    center: np.ndarray
    scale: np.ndarray
    threshold: np.ndarray
    check: GaussianCheck

    @classmethod
    def fit(cls, embeddings: np.ndarray) -> Standardisation:
        """From ``embeddings`` ``(N, p)``, ``N >= 2``; a constant dimension gets scale 1."""
        x = np.asarray(embeddings, np.float64)
        if x.ndim != 2 or len(x) < 2:
            raise ValueError(f"a gallery needs at least 2 embeddings, got shape {x.shape}")
        center = x.mean(axis=0)
        scale = x.std(axis=0)
        scale[scale == 0] = 1.0
        u = (x - center) / scale  # (N, p)
        check = GaussianCheck(
            max_abs_skewness=float(np.abs((u**3).mean(axis=0)).max()),
            max_abs_excess_kurtosis=float(np.abs((u**4).mean(axis=0) - 3.0).max()),
            beyond_i8_range=float((np.abs(u) > I8_RANGE).mean()),
        )
        return cls(
            center.astype(np.float32),
            scale.astype(np.float32),
            np.median(u, axis=0).astype(np.float32),
            check,
        )

    def apply(self, embeddings: np.ndarray) -> np.ndarray:
        """``u = (x - center) / scale``: ``(N, p)`` float32."""
        x = np.asarray(embeddings, np.float32)
        return ((x - self.center) / self.scale).astype(np.float32, copy=False)

    def to_json(self) -> dict[str, object]:
        return {
            "center": self.center.tolist(),
            "scale": self.scale.tolist(),
            "threshold": self.threshold.tolist(),
            "check": self.check.to_json(),
        }

    @classmethod
    def from_json(cls, fields: dict[str, object], dimension: int) -> Standardisation:
        """As :meth:`to_json` wrote it; ``ValueError`` naming the field otherwise."""
        arrays = []
        for name in ("center", "scale", "threshold"):
            value = np.asarray(fields.get(name), dtype=np.float64)
            if value.shape != (dimension,) or not np.isfinite(value).all():
                raise ValueError(f"standardisation.{name} is not {dimension} finite numbers")
            arrays.append(value.astype(np.float32))
        if (arrays[1] <= 0).any():
            raise ValueError("standardisation.scale has a value <= 0")
        check = fields.get("check")
        if not isinstance(check, dict):
            raise ValueError("standardisation.check is missing")
        center, scale, threshold = arrays
        gaussian = GaussianCheck(**{key: float(value) for key, value in check.items()})
        return cls(center, scale, threshold, gaussian)


@dataclass(frozen=True)
class Codec:
    """Embeddings to codes of :attr:`dtype`, and usearch's distances back to similarities."""

    dtype: Dtype
    standardisation: Standardisation
    normalized: bool = False  # the gallery's embeddings are of unit length: so are queries

    @property
    def dimension(self) -> int:
        return len(self.standardisation.center)

    def encode(self, embeddings: np.ndarray) -> np.ndarray:
        """``(N, p)`` embeddings as ``(N, p)`` float32, float16 or int8 codes, or ``(N, p/8)``
        uint8 (bits, packed big-endian as usearch's ``b1`` reads them)."""
        x = np.asarray(embeddings, np.float32)
        if self.normalized:
            x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        u = self.standardisation.apply(x)
        if self.dtype is Dtype.F32:
            return u
        if self.dtype is Dtype.F16:
            return u.astype(np.float16)
        if self.dtype is Dtype.I8:
            return np.clip(np.rint(u * (127.0 / I8_RANGE)), -127, 127).astype(np.int8)
        return np.packbits(u > self.standardisation.threshold, axis=1)

    def similarity(self, distances: np.ndarray) -> np.ndarray:
        """usearch's distances (``1 - cosine``, or the Hamming distance in bits) as
        similarities in ``[-1, 1]``, 1 for the same code."""
        d = np.asarray(distances, np.float64)
        if self.dtype is Dtype.B1:
            return 1.0 - 2.0 * d / self.dimension
        return np.clip(1.0 - d, -1.0, 1.0)
