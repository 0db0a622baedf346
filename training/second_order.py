"""Second-order statistics of feature maps, shared by SMSO and the baseline heads.

A feature map ``(B, c, h, w)`` holds, per image, ``n = h * w`` positions ``x_i`` in ``R^c``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["at_least_float32", "check_feature_map", "covariance", "gram"]


def check_feature_map(x: Tensor, in_channels: int, name: str) -> None:
    """Raise ``ValueError`` unless ``x`` is a ``(B, in_channels, h, w)`` feature map."""
    if x.dim() != 4:
        raise ValueError(f"{name} expects a feature map (B, c, h, w), got shape {tuple(x.shape)}")
    if x.shape[1] != in_channels:
        raise ValueError(f"{name} was built for {in_channels} channels, got {x.shape[1]}")


def at_least_float32(x: Tensor) -> Tensor:
    """``x`` in float32, or float64 if it already is: second-order heads never run in 16 bits."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def covariance(x: Tensor, ddof: int = 1) -> Tensor:
    """Per-image covariance ``Y = 1/(n - ddof) sum_i (x_i - mu)(x_i - mu)^T``.

    ``(B, c, h, w)`` -> ``(B, c, c)``. ``ddof=1`` is Eq. 1 of the paper; ``ddof=0`` divides by n
    (iSQRT-COV's convention).
    """
    xs = x.flatten(2)  # (B, c, n)
    xs = xs - xs.mean(dim=-1, keepdim=True)
    return xs @ xs.transpose(1, 2) / (xs.shape[-1] - ddof)


def gram(x: Tensor) -> Tensor:
    """Bilinear (uncentred) second moment ``1/n sum_i x_i x_i^T``: ``(B, c, h, w) -> (B, c, c)``."""
    xs = x.flatten(2)  # (B, c, n)
    return xs @ xs.transpose(1, 2) / xs.shape[-1]
