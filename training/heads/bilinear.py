"""Bilinear pooling, BP (Lin et al., ICCV 2015)."""

from __future__ import annotations

from torch import Tensor

from training.heads.base import Head, signed_sqrt_l2
from training.second_order import gram

__all__ = ["BilinearPooling"]


class BilinearPooling(Head):
    """BP: ``Y = 1/n sum_i x_i x_i^T`` (no mean subtraction), vectorised, signed sqrt, l2.

    ``(B, c, h, w)`` -> ``(B, c^2)``; 262,144-d for the paper's c = 512.
    """

    def __init__(self, in_channels: int, eps: float = 1e-8) -> None:
        super().__init__(in_channels, in_channels * in_channels)
        self.eps = eps

    def pool(self, x: Tensor) -> Tensor:
        y = gram(x)  # (B, c, c)
        return signed_sqrt_l2(y.flatten(1), self.eps)  # (B, c^2)
