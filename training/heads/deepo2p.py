"""DeepO2P: matrix-logarithm second-order pooling (Ionescu et al., ICCV 2015)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from training.heads.base import Head
from training.second_order import covariance

__all__ = ["DeepO2P", "SymmetricLog"]


class SymmetricLog(torch.autograd.Function):
    """``log(A)`` of symmetric positive-definite ``A`` ``(B, c, c)`` by eigen-decomposition.

    Forward: ``A = U diag(l) U^T`` -> ``U diag(log l) U^T``, eigenvalues clamped at ``floor``.
    Backward (Daleckii-Krein): ``dA = U (K o (U^T sym(G) U)) U^T`` with the divided differences
    ``K_ij = (log l_i - log l_j) / (l_i - l_j)``, and ``K_ij = 1 / l_i`` where ``l_i ~= l_j``.
    Using the limit for (nearly) equal eigenvalues keeps the gradient finite where autograd's
    ``eigh`` backward divides by ``l_i - l_j`` and gives NaN (a blank image: all equal).
    """

    @staticmethod
    def forward(ctx: Any, a: Tensor, floor: float) -> Tensor:
        evals, evecs = torch.linalg.eigh(a)
        evals = evals.clamp_min(floor)
        ctx.save_for_backward(evals, evecs)
        return (evecs * evals.log()[..., None, :]) @ evecs.transpose(-1, -2)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        evals, evecs = ctx.saved_tensors
        li = evals[..., :, None]  # (B, c, 1)
        lj = evals[..., None, :]  # (B, 1, c)
        diff = li - lj
        close = diff.abs() <= 1e-5 * torch.maximum(li, lj)
        safe = torch.where(close, torch.ones_like(diff), diff)
        k = torch.where(close, 2.0 / (li + lj), (li.log() - lj.log()) / safe)  # (B, c, c)
        g = 0.5 * (grad + grad.transpose(-1, -2))
        inner = evecs.transpose(-1, -2) @ g @ evecs
        return evecs @ (k * inner) @ evecs.transpose(-1, -2), None


class DeepO2P(Head):
    """DeepO2P: ``vec( log(Y + eps I) )`` with ``Y`` the covariance of Eq. 1.

    ``(B, c, h, w)`` -> ``(B, c^2)``; 262,144-d for the paper's c = 512. The eigen-decomposition
    runs in ``eig_dtype`` (float64 by default: with n < c the covariance is singular and most
    eigenvalues sit at ``eps``, where float32's rounding is a visible fraction of the value).
    ONNX has no eigen-decomposition, so this head cannot be exported.
    """

    def __init__(
        self, in_channels: int, eps: float = 1e-3, eig_dtype: torch.dtype = torch.float64
    ) -> None:
        super().__init__(in_channels, in_channels * in_channels)
        if eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        self.eps = eps
        self.eig_dtype = eig_dtype

    def pool(self, x: Tensor) -> Tensor:
        y = covariance(x.to(self.eig_dtype))  # (B, c, c)
        eye = torch.eye(self.in_channels, dtype=y.dtype, device=y.device)
        log_y = SymmetricLog.apply(y + self.eps * eye, 0.5 * self.eps)
        return log_y.flatten(1).to(x.dtype)  # (B, c^2)
