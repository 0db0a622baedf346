"""Low-rank bilinear pooling, LRBP (Kong & Fowlkes, CVPR 2017), as the SMSO paper ran it.

What is implemented, from Kong & Fowlkes and the SMSO paper's Sec. 4.2:

* the model: a shared projection ``P`` (``c x m``, a 1x1 convolution straight on the backbone's
  features, VGG-D's conv5_3 after its ReLU, so the registry gives LRBP no 1x1 reduction of its
  own) and per class a bilinear classifier of rank ``r``, ``W_k = U_k+ U_k+^T - U_k- U_k-^T``;
  m = 100, r = 8; a multi-class hinge loss (its ``HeadSpec`` declares it);
* the scaled square root "after the conv5-3 ReLU" (``sqrt_scale``, 2e5 in the paper's rows):
  ``x <- sign(x) sqrt(|x| / s)``, the form of Kong's MatConvNet layer (``sign(x) sqrt(|x|) /
  sqrt(s)``), with ``eps`` under the root so that the gradient at 0 is finite (their layer has an
  ``ep`` for the same purpose);
* ``P`` initialised from the SVD of the Gram matrix of those features over the training images:
  the top-m eigenvectors of ``sum_images sum_i x_i x_i^T``, computed by smso-train before the
  first epoch (the head's ``HeadSpec`` asks for the pass; ``training.head_statistics`` runs it);
* the warm start from BP's fine-tuned weights: ``TrainConfig.init_from`` (the paper's Table 1
  LRBP row starts from the BP row's ``best.pt``, see ``training.experiments``).

What differs, and why:

* the Gram matrix is summed over the training images with the evaluation transform. The SMSO
  paper says "the entire validation set", Kong's code uses the training set; the validation set
  stays untouched here because models are chosen on it;
* the warm start copies the backbone only: BP's own 1x1 reduction and classifier have no
  counterpart in LRBP;
* the ``U_k`` start Glorot-normal. Kong & Fowlkes initialise them from the eigen-decomposition of
  a full-rank bilinear SVM trained first on the projected features; the SMSO paper does not say
  it did, and that SVM stage is not implemented;
* the hinge loss is torch's ``MultiMarginLoss`` (margin 1, averaged over the other classes), not
  the exact loss of Kong's code; and the learning rate follows the project's recipe, where the
  SMSO paper adapted it by hand during training ("very sensitive to the learning rate").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.heads.base import Head
from training.second_order import check_feature_map

__all__ = ["LowRankBilinear"]


class LowRankBilinear(Head):
    """LRBP: a low-rank bilinear classifier on ``Y = 1/n sum_i x_i x_i^T``, scoring classes itself.

    A projection ``P`` (c x m) reduces the features, ``x^_i = P^T x_i``. Class k has a bilinear
    weight of rank r, ``W_k = U_k+ U_k+^T - U_k- U_k-^T`` with ``U_k+-`` in ``R^(m x r/2)``, and
    ``score_k = tr(W_k^T P^T Y P) + b_k = 1/n sum_i (||U_k+^T x^_i||^2 - ||U_k-^T x^_i||^2) + b_k``,
    which never forms Y. ``(B, c, h, w)`` -> ``(B, K)``.

    Args:
        in_channels: ``c``.
        num_classes: ``K``.
        projection_dim: ``m`` (100 in the paper).
        rank: ``r``, even (8 in the paper).
        sqrt_scale: ``s`` of the scaled square root ``sign(x) sqrt(|x| / s)`` applied to the
            features first (2e5 in the paper, tuned for VGG-D's conv5_3); None: no root.
        eps: under that root, so that its gradient at 0 is finite.

    ``set_input_statistics`` (or ``init_projection`` on a batch of features) sets ``P`` from the
    SVD of the features' Gram matrix, as Kong & Fowlkes do.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        projection_dim: int = 100,
        rank: int = 8,
        sqrt_scale: float | None = None,
        eps: float = 1e-8,
    ) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if rank < 2 or rank % 2:
            raise ValueError(f"rank must be an even number >= 2, got {rank}")
        if not 1 <= projection_dim <= in_channels:
            raise ValueError(
                f"projection_dim must be in [1, in_channels={in_channels}], got {projection_dim}"
            )
        if sqrt_scale is not None and sqrt_scale <= 0:
            raise ValueError(f"sqrt_scale must be > 0 or None, got {sqrt_scale}")
        super().__init__(in_channels, num_classes)
        self.num_classes = num_classes
        self.projection_dim = projection_dim
        self.rank = rank
        self.sqrt_scale = sqrt_scale
        self.eps = eps
        self.projection = nn.Parameter(torch.empty(projection_dim, in_channels))  # P^T
        self.factors = nn.Parameter(torch.empty(num_classes * rank, projection_dim))  # U_k^T
        self.bias = nn.Parameter(torch.zeros(num_classes))
        nn.init.orthogonal_(self.projection)
        nn.init.xavier_normal_(self.factors)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, num_classes={self.num_classes}, "
            f"projection_dim={self.projection_dim}, rank={self.rank}, sqrt_scale={self.sqrt_scale}"
        )

    def scaled_sqrt(self, x: Tensor) -> Tensor:
        """``sign(x) (sqrt(|x| / s + eps) - sqrt(eps))`` element-wise, or ``x`` without ``s``."""
        if self.sqrt_scale is None:
            return x
        return torch.sign(x) * (torch.sqrt(x.abs() / self.sqrt_scale + self.eps) - self.eps**0.5)

    def pool(self, x: Tensor) -> Tensor:
        x = self.scaled_sqrt(x)  # (B, c, h, w)
        xp = F.conv2d(x, self.projection[:, :, None, None])  # (B, m, h, w)
        v = F.conv2d(xp, self.factors[:, :, None, None]).flatten(2)  # (B, K r, n)
        energy = v.square().mean(dim=-1).view(-1, self.num_classes, 2, self.rank // 2)
        return energy[:, :, 0].sum(-1) - energy[:, :, 1].sum(-1) + self.bias  # (B, K)

    @torch.no_grad()
    def input_statistics(self, x: Tensor) -> tuple[Tensor, int]:
        """The Gram matrix's sums over a batch: ``sum_b sum_i x_i x_i^T`` ``(c, c)`` in float64
        of the (scaled-root) features, and the number of positions it sums."""
        check_feature_map(x, self.in_channels, type(self).__name__)
        xs = self.scaled_sqrt(x.detach().double()).flatten(2)  # (B, c, n)
        b, c, n = xs.shape
        flat = xs.transpose(0, 1).reshape(c, b * n)  # (c, B n)
        return flat @ flat.T, b * n

    @torch.no_grad()
    def set_input_statistics(self, sums: Tensor, count: int) -> None:
        """``P`` from the top-m eigenvectors of the Gram matrix ``sums``, largest first."""
        _, evecs = torch.linalg.eigh(sums.double())
        top = evecs[:, -self.projection_dim :].flip(-1)  # (c, m), largest first
        self.projection.copy_(top.T.to(self.projection.dtype))

    def init_projection(self, features: Tensor) -> None:
        """Set ``P`` from the Gram matrix of a batch of features ``(N, c, h, w)``."""
        self.set_input_statistics(*self.input_statistics(features))
