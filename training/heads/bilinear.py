"""Bilinear pooling, BP (Lin et al., ICCV 2015)."""

from __future__ import annotations

from torch import Tensor

from training.heads.base import Head, SymmetricVectorizer, signed_sqrt_l2
from training.second_order import gram

__all__ = ["BilinearPooling"]


class BilinearPooling(Head):
    """BP: ``Y = 1/n sum_i x_i x_i^T`` (no mean subtraction), vectorised, signed sqrt, l2.

    ``(B, c, h, w)`` -> ``(B, c^2)``: 262,144-d for Table 1's c = 512. ``vectorize="triu"`` keeps
    the upper triangle, ``(B, c(c+1)/2)``: 32,896-d for Table 2's c = 256, the dimension the paper
    gives BP on ResNet-50 (the same as MPN's). The off-diagonal entries then count once in the l2
    norm, not twice.
    """

    def __init__(self, in_channels: int, vectorize: str = "full", eps: float = 1e-8) -> None:
        vectorizer = SymmetricVectorizer(in_channels, vectorize)
        super().__init__(in_channels, vectorizer.output_dim)
        self.vectorizer = vectorizer
        self.eps = eps

    def pool(self, x: Tensor) -> Tensor:
        y = gram(x)  # (B, c, c)
        return signed_sqrt_l2(self.vectorizer(y), self.eps)  # (B, c^2) or (B, c(c+1)/2)
