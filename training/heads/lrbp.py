"""Low-rank bilinear pooling, LRBP (Kong & Fowlkes, CVPR 2017)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.heads.base import Head
from training.second_order import gram

__all__ = ["LowRankBilinear"]


class LowRankBilinear(Head):
    """LRBP: a low-rank bilinear classifier on ``Y = 1/n sum_i x_i x_i^T``; it scores classes itself.

    A projection ``P`` (c x m) reduces the features, ``x^_i = P^T x_i``. Class k has a bilinear
    weight of rank r, ``W_k = U_k+ U_k+^T - U_k- U_k-^T`` with ``U_k+-`` in ``R^(m x r/2)``, and
    ``score_k = tr(W_k^T P^T Y P) + b_k = 1/n sum_i (||U_k+^T x^_i||^2 - ||U_k-^T x^_i||^2) + b_k``,
    which never forms Y. It is trained with a hinge loss. ``(B, c, h, w)`` -> ``(B, K)``.

    Paper defaults: m = 100, r = 8. ``init_projection`` sets ``P`` from the SVD of the features'
    Gram matrix, as Kong & Fowlkes do.
    """

    def __init__(
        self, in_channels: int, num_classes: int, projection_dim: int = 100, rank: int = 8
    ) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if rank < 2 or rank % 2:
            raise ValueError(f"rank must be an even number >= 2, got {rank}")
        if not 1 <= projection_dim <= in_channels:
            raise ValueError(
                f"projection_dim must be in [1, in_channels={in_channels}], got {projection_dim}"
            )
        super().__init__(in_channels, num_classes)
        self.num_classes = num_classes
        self.projection_dim = projection_dim
        self.rank = rank
        self.projection = nn.Parameter(torch.empty(projection_dim, in_channels))  # P^T
        self.factors = nn.Parameter(torch.empty(num_classes * rank, projection_dim))  # U_k^T
        self.bias = nn.Parameter(torch.zeros(num_classes))
        nn.init.orthogonal_(self.projection)
        nn.init.xavier_normal_(self.factors)

    @torch.no_grad()
    def init_projection(self, features: Tensor) -> None:
        """Set ``P`` to the top-m eigenvectors of the Gram matrix of ``features`` ``(N, c, h, w)``."""
        g = gram(features.float()).sum(dim=0)  # (c, c)
        _, evecs = torch.linalg.eigh(g.double())
        top = evecs[:, -self.projection_dim :].flip(-1)  # (c, m), largest first
        self.projection.copy_(top.T.to(self.projection.dtype))

    def pool(self, x: Tensor) -> Tensor:
        xp = F.conv2d(x, self.projection[:, :, None, None])  # (B, m, h, w)
        v = F.conv2d(xp, self.factors[:, :, None, None]).flatten(2)  # (B, K r, n)
        energy = v.square().mean(dim=-1).view(-1, self.num_classes, 2, self.rank // 2)
        return energy[:, :, 0].sum(-1) - energy[:, :, 1].sum(-1) + self.bias  # (B, K)
