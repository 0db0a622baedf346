"""Matrix power normalisation, MPN, computed as iSQRT-COV (Li et al., CVPR 2017 and 2018)."""

from __future__ import annotations

import torch
from torch import Tensor

from training.heads.base import Head
from training.second_order import covariance

__all__ = ["MPNCOV", "newton_schulz_sqrt"]


def newton_schulz_sqrt(y: Tensor, iterations: int = 5, eps: float = 1e-8) -> Tensor:
    """Matrix square root of SPD ``y`` ``(B, c, c)`` by coupled Newton-Schulz, ``(B, c, c)``.

    Pre-normalisation ``A = Y / tr(Y)`` puts the spectrum in (0, 1]; then ``Y_0 = A``, ``Z_0 = I``,
    ``T_k = (3I - Z_{k-1} Y_{k-1}) / 2``, ``Y_k = Y_{k-1} T_k``, ``Z_k = T_k Z_{k-1}``, so that
    ``Y_k -> A^(1/2)``; post-compensation multiplies by ``sqrt(tr(Y))``. ``eps`` keeps a zero
    matrix (blank image) finite.
    """
    c = y.shape[-1]
    trace = y.diagonal(dim1=-2, dim2=-1).sum(-1)[:, None, None] + eps  # (B, 1, 1)
    eye = torch.eye(c, dtype=y.dtype, device=y.device).expand_as(y)
    a = y / trace
    z = eye
    for _ in range(iterations):
        t = 0.5 * (3.0 * eye - z @ a)
        a = a @ t
        z = t @ z
    return a * trace.sqrt()


class MPNCOV(Head):
    """MPN / iSQRT-COV: ``vec_triu( (1/n sum_i x~_i x~_i^T)^(1/2) )``.

    ``(B, c, h, w)`` -> ``(B, c(c+1)/2)``; 32,896-d for the paper's c = 256. The square root is
    ``newton_schulz_sqrt`` with ``iterations`` steps (5 in the paper).
    """

    triu_index: Tensor  # buffer: the upper triangle's positions in the flattened matrix

    def __init__(self, in_channels: int, iterations: int = 5, eps: float = 1e-8) -> None:
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations}")
        super().__init__(in_channels, in_channels * (in_channels + 1) // 2)
        self.iterations = iterations
        self.eps = eps
        rows, cols = torch.triu_indices(in_channels, in_channels)
        self.register_buffer("triu_index", rows * in_channels + cols, persistent=False)

    def matrix_sqrt(self, x: Tensor) -> Tensor:
        """``(B, c, h, w)`` -> ``(B, c, c)``, the square root of the covariance (divided by n)."""
        return newton_schulz_sqrt(covariance(x, ddof=0), self.iterations, self.eps)

    def pool(self, x: Tensor) -> Tensor:
        return self.matrix_sqrt(x).flatten(1)[:, self.triu_index]  # (B, c(c+1)/2)
