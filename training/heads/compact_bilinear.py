"""Compact bilinear pooling, CBP (Gao et al., CVPR 2016): Tensor Sketch and Random Maclaurin.

Both approximate BP's kernel ``<Y(X), Y(X')> = sum_{i,i'} <x_i, x'_i'>^2`` with a d-dimensional
random feature map ``phi`` summed over positions, ``z = sum_i phi(x_i)``, followed by BP's
signed square root and l2 normalisation. The random projections are fixed (buffers, part of the
state dict) and drawn from ``seed``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from training.heads.base import Head, signed_sqrt_l2

__all__ = ["RandomMaclaurin", "TensorSketch"]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class TensorSketch(Head):
    """CBP-TS: ``phi(x) = IFFT(FFT(C_1 x) o FFT(C_2 x))``, ``C_k`` count sketches ``R^c -> R^d``.

    ``C x [h(m)] += s(m) x[m]`` with random buckets ``h: [c] -> [d]`` and signs ``s: [c] -> {+-1}``.
    Summing over positions is done in the frequency domain, so there is one inverse FFT per image.
    ``(B, c, h, w)`` -> ``(B, d)``, d = 8,192 by default.
    """

    def __init__(self, in_channels: int, dim: int = 8192, seed: int = 0, eps: float = 1e-8) -> None:
        super().__init__(in_channels, dim)
        gen = _generator(seed)
        for k in (1, 2):
            self.register_buffer(f"bucket{k}", torch.randint(dim, (in_channels,), generator=gen))
            sign = torch.randint(2, (in_channels,), generator=gen).float() * 2 - 1
            self.register_buffer(f"sign{k}", sign)
        self.eps = eps

    def count_sketch(self, xs: Tensor, bucket: Tensor, sign: Tensor) -> Tensor:
        """``(B, n, c)`` -> ``(B, n, d)``, ``out[..., h(m)] += s(m) x[..., m]``."""
        out = xs.new_zeros(*xs.shape[:-1], self.output_dim)
        return out.scatter_add(-1, bucket.expand_as(xs), xs * sign)

    def pool(self, x: Tensor) -> Tensor:
        xs = x.flatten(2).transpose(1, 2)  # (B, n, c)
        f1 = torch.fft.rfft(self.count_sketch(xs, self.bucket1, self.sign1), dim=-1)
        f2 = torch.fft.rfft(self.count_sketch(xs, self.bucket2, self.sign2), dim=-1)
        z = torch.fft.irfft((f1 * f2).sum(dim=1), n=self.output_dim, dim=-1)  # (B, d)
        return signed_sqrt_l2(z, self.eps)


class RandomMaclaurin(Head):
    """CBP-RM: ``phi(x) = (W_1^T x) o (W_2^T x) / sqrt(d)``, ``W_k`` in ``{+-1}^(c x d)``.

    ``(B, c, h, w)`` -> ``(B, d)``, d = 8,192 by default.
    """

    def __init__(self, in_channels: int, dim: int = 8192, seed: int = 0, eps: float = 1e-8) -> None:
        super().__init__(in_channels, dim)
        gen = _generator(seed)
        for k in (1, 2):
            proj = torch.randint(2, (in_channels, dim), generator=gen).float() * 2 - 1
            self.register_buffer(f"proj{k}", proj)
        self.eps = eps

    def pool(self, x: Tensor) -> Tensor:
        xs = x.flatten(2).transpose(1, 2)  # (B, n, c)
        phi = (xs @ self.proj1) * (xs @ self.proj2)  # (B, n, d)
        return signed_sqrt_l2(phi.sum(dim=1) / self.output_dim**0.5, self.eps)
