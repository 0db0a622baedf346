"""Table 3's "Flatten" row: the covariance vectorised as it is, no PV, no transform, no
normalisation (Yu & Salzmann, ECCV 2018, Sec. 4.3)."""

from __future__ import annotations

from torch import Tensor

from training.heads.base import Head, SymmetricVectorizer
from training.second_order import covariance

__all__ = ["CovarianceFlatten"]


class CovarianceFlatten(Head):
    """``vec(Y)`` with ``Y = 1/(n-1) sum_i x~_i x~_i^T`` the covariance of Eq. 1.

    Under the Gaussian assumption ``(n-1) Y`` is Wishart ``W_c(Sigma, n-1)``: the paper's baseline
    for what PV and the square root add (75.97 % on MINC-2500 with VGG-D, c = 256).
    ``(B, c, h, w)`` -> ``(B, c^2)``, 65,536-d at c = 256; ``vectorize="triu"`` keeps the upper
    triangle, ``(B, c(c+1)/2)``.
    """

    def __init__(self, in_channels: int, vectorize: str = "full") -> None:
        vectorizer = SymmetricVectorizer(in_channels, vectorize)
        super().__init__(in_channels, vectorizer.output_dim)
        self.vectorizer = vectorizer

    def pool(self, x: Tensor) -> Tensor:
        return self.vectorizer(covariance(x))  # (B, c^2) or (B, c(c+1)/2)
