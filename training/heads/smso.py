"""SMSO pooling: statistically-motivated second-order pooling (Yu & Salzmann, ECCV 2018).

Notation (``docs/smso.md``): a feature map ``(B, c, h, w)`` holds, per image, ``n = h * w``
positions ``x_i`` in ``R^c`` with mean ``mu``; ``x~_i = x_i - mu``.

1. Covariance (Eq. 1): ``Y = 1/(n-1) sum_i x~_i x~_i^T``                        ``(B, c, c)``
2. Parametric vectorisation (Eq. 3): ``z_j = w_j^T Y w_j``, ``W = [w_1..w_p]``    ``(B, p)``
3. Square-root normalisation (Eq. 6):
   ``z'_j = sqrt(alpha_j z_j) - sqrt(2(n-1) - 1)``, ``alpha_j = 2(n-1) / (w_j^T Sigma w_j)``
4. Scale and bias (Eq. 7): ``z''_j = beta_j + gamma_j z'_j``, ``gamma_j > 0``       ``(B, p)``

The 1x1-conv + l2-pool form (Eq. 8-11) computes the same ``z`` without the ``c x c`` matrix:
``u_ij = w_j^T x_i`` is a bias-free 1x1 convolution and
``z_j = 1/(n-1) sum_i (u_ij - mean_i u_ij)^2`` is the per-channel spatial variance of its output.

``Sigma`` is the covariance of the PV input. It is a running buffer (``running_cov``, no gradient),
updated like BatchNorm's running statistics: in training mode each batch moves it towards the pooled
within-image covariance ``mean_b Y_b`` (exponential average with ``momentum``, or a cumulative
average when ``momentum is None``); ``alpha`` is then computed from the updated buffer. In eval mode
(and in an exported graph) the buffer is constant, so ``alpha`` is a constant per output.

With ``momentum = 0.1`` the running average follows the last few dozen batches, so its error never
settles: in eval mode each output's ``z'`` carries a constant offset (about 0.04 of its standard
deviation on synthetic Gaussian features). After training, ``Sigma`` is therefore re-estimated
as a cumulative average over the training images, like "precise BatchNorm"
(``input_statistics`` / ``set_input_statistics``, run by ``training.recalibrate``); the exporter
folds whatever ``running_cov`` holds.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.chi2_transforms import TRANSFORMS, chi2_to_normal
from training.heads.base import Head
from training.second_order import at_least_float32, check_feature_map, covariance

__all__ = ["AFFINES", "FORMS", "SMSOPooling"]

Form = Literal["conv", "covariance"]
FORMS: tuple[Form, ...] = ("conv", "covariance")
#: Which of ``gamma`` and ``beta`` are trained (paper Table 3).
AFFINES: tuple[str, ...] = ("both", "beta", "gamma", "none")


class SMSOPooling(Head):
    """SMSO pooling: ``(B, c, h, w)`` feature map -> ``(B, p)`` embedding ``z''``.

    Args:
        in_channels: ``c``, channels of the input feature map.
        dim: ``p``, the embedding dimension (number of PV projections); 2,048 by default.
        form: ``"conv"`` (1x1 conv + l2 pool, no ``c x c`` matrix) or ``"covariance"``. Both forms
            have the same parameters and buffers, so their state dicts are interchangeable.
        transform: how ``z`` is made Gaussian: ``"sqrt"`` (paper default), ``"log"``,
            ``"cuberoot"``, ``"none"``; each standardised to ``N(0, 1)`` under the Gaussian
            assumption (see ``training.chi2_transforms``).
        affine: trained affine after the transform: ``"both"`` (``gamma`` and ``beta``),
            ``"gamma"``, ``"beta"`` or ``"none"``.
        momentum: weight of the batch statistic in the running ``Sigma`` update; ``None`` for a
            cumulative average over all batches seen.

    Parameters and buffers:
        weight: ``(p, c)``, row ``j`` is ``w_j``; Glorot-normal initialised.
        log_gamma: ``(p,)``, ``gamma = exp(log_gamma) > 0``, initialised to 0 (``gamma = 1``).
        beta: ``(p,)``, initialised to 0.
        running_cov: ``(c, c)`` buffer, the running ``Sigma``, initialised to the identity.
        num_batches_tracked: scalar buffer, number of training batches seen.

    Shapes:
        input ``(B, c, h, w)`` with ``h * w >= 2``, any float dtype; output ``(B, p)`` in float32
        (float64 for float64 input): as every ``Head``, it computes in at least float32 with
        autocast disabled.
    """

    running_cov: Tensor  # buffers: Sigma (c, c), and the batches it has seen
    num_batches_tracked: Tensor

    def __init__(
        self,
        in_channels: int,
        dim: int = 2048,
        form: Form = "conv",
        transform: str = "sqrt",
        affine: str = "both",
        momentum: float | None = 0.1,
    ) -> None:
        if in_channels < 1 or dim < 1:
            raise ValueError(f"in_channels and dim must be >= 1, got {in_channels} and {dim}")
        if form not in FORMS:
            raise ValueError(f"unknown SMSO form {form!r}; valid forms: {', '.join(FORMS)}")
        if transform not in TRANSFORMS:
            raise ValueError(
                f"unknown transform {transform!r}; valid transforms: {', '.join(TRANSFORMS)}"
            )
        if affine not in AFFINES:
            raise ValueError(f"unknown affine {affine!r}; valid values: {', '.join(AFFINES)}")
        if momentum is not None and not 0.0 < momentum <= 1.0:
            raise ValueError(f"momentum must be in (0, 1] or None, got {momentum}")
        super().__init__(in_channels, dim)
        self.dim = dim
        self.form = form
        self.transform = transform
        self.affine = affine
        self.momentum = momentum

        self.weight = nn.Parameter(torch.empty(dim, in_channels))
        nn.init.xavier_normal_(self.weight)
        self.log_gamma = nn.Parameter(torch.zeros(dim)) if affine in ("both", "gamma") else None
        self.beta = nn.Parameter(torch.zeros(dim)) if affine in ("both", "beta") else None
        self.register_buffer("running_cov", torch.eye(in_channels))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    @property
    def gamma(self) -> Tensor | None:
        """The positive scale ``gamma = exp(log_gamma)``, ``(p,)``, or None without it."""
        return None if self.log_gamma is None else self.log_gamma.exp()

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.dim}, form={self.form!r}, transform={self.transform!r}, "
            f"affine={self.affine!r}, momentum={self.momentum}"
        )

    def pool(self, x: Tensor) -> Tensor:
        """``(B, c, h, w)`` float32 (or float64) -> ``(B, p)`` embedding ``z''``."""
        n = self._check_positions(x)
        if self.form == "covariance":
            y = covariance(x)  # (B, c, c)
            if self.training:
                self._update_running_cov(y.detach().mean(dim=0))
            z = self.project(y)  # (B, p)
        else:
            if self.training:
                self._update_running_cov(self.pooled_covariance(x))
            z = self.vectorize(x)  # (B, p)
        out = self.standardize(z, n)  # (B, p)
        if self.log_gamma is not None:
            out = out * self.log_gamma.exp()
        if self.beta is not None:
            out = out + self.beta
        return out

    def vectorize(self, x: Tensor) -> Tensor:
        """PV output ``z_j = w_j^T Y w_j``: ``(B, c, h, w)`` -> ``(B, p)``, in the chosen form."""
        x = at_least_float32(x)
        if self.form == "covariance":
            return self.project(covariance(x))
        n = x.shape[-2] * x.shape[-1]
        # Centre before the conv: W (x - mean x) = u - mean u, and the c-channel map is the
        # smaller one when p > c. Reduce over (h, w) in place of a flatten, which would copy a
        # channels-last map; a mean of squares, not a sum, keeps the partial sums small.
        x = x - x.mean(dim=(-2, -1), keepdim=True)  # (B, c, h, w)
        u = F.conv2d(x, self.weight[:, :, None, None])  # (B, p, h, w), centred
        return u.square().mean(dim=(-2, -1)) * (n / (n - 1))  # (B, p)

    def project(self, y: Tensor) -> Tensor:
        """Eq. 3 on covariances: ``(B, c, c)`` -> ``(B, p)``, ``z_j = w_j^T Y w_j``."""
        return ((y @ self.weight.T) * self.weight.T).sum(dim=1)

    def projected_variance(self) -> Tensor:
        """``w_j^T Sigma w_j`` for the running ``Sigma``, ``(p,)``."""
        return ((self.weight @ self.running_cov) * self.weight).sum(dim=1)

    def standardize(self, z: Tensor, n: int) -> Tensor:
        """Pre-affine ``z'``: ``q = (n-1) z / (w^T Sigma w) ~ chi2_{n-1}`` mapped to ``N(0, 1)``.

        ``(B, p)`` -> ``(B, p)``. For the default transform this is Eq. 6,
        ``sqrt(alpha z) - sqrt(2(n-1) - 1)`` with ``alpha = 2(n-1) / (w^T Sigma w)``.
        """
        scale = self.projected_variance().clamp_min(torch.finfo(z.dtype).tiny)
        q = z * (n - 1) / scale  # (B, p)
        return chi2_to_normal(q, n - 1, self.transform)

    @staticmethod
    @torch.no_grad()
    def pooled_covariance(x: Tensor) -> Tensor:
        """Pooled within-image covariance ``mean_b Y_b`` without per-image ``c x c`` matrices.

        ``(B, c, h, w)`` -> ``(c, c)``; one ``(c, B n) x (B n, c)`` product, no gradient.
        """
        xs = x.flatten(2)  # (B, c, n)
        xs = xs - xs.mean(dim=-1, keepdim=True)
        b, c, n = xs.shape
        flat = xs.transpose(0, 1).reshape(c, b * n)  # (c, B n)
        return flat @ flat.T / (b * (n - 1))

    @torch.no_grad()
    def input_statistics(self, x: Tensor) -> tuple[Tensor, int]:
        """``Sigma``'s sums over a batch: ``sum_b sum_i x~_i x~_i^T`` ``(c, c)`` in float64, and
        ``sum_b (n - 1)``, the count that divides it (see ``set_input_statistics``)."""
        check_feature_map(x, self.in_channels, type(self).__name__)
        n = self._check_positions(x)
        xs = x.detach().double().flatten(2)  # (B, c, n)
        xs = xs - xs.mean(dim=-1, keepdim=True)
        b, c, _ = xs.shape
        flat = xs.transpose(0, 1).reshape(c, b * n)  # (c, B n)
        return flat @ flat.T, b * (n - 1)

    @torch.no_grad()
    def set_input_statistics(self, sums: Tensor, count: int) -> None:
        """``running_cov = sums / count``: the pooled within-image covariance as a cumulative
        average over every image the sums cover, in place of the running average."""
        if count < 1:
            raise ValueError(f"Sigma needs at least one image with 2 positions, got count {count}")
        self.running_cov.copy_((sums / count).to(self.running_cov.dtype))

    @torch.no_grad()
    def _update_running_cov(self, batch_cov: Tensor) -> None:
        """Move ``running_cov`` towards the batch's pooled covariance ``(c, c)``."""
        self.num_batches_tracked += 1
        # Only the cumulative average reads the counter back (a GPU sync on every step).
        momentum = self.momentum
        factor = momentum if momentum is not None else 1.0 / float(self.num_batches_tracked)
        self.running_cov.lerp_(batch_cov, factor)

    @staticmethod
    def _check_positions(x: Tensor) -> int:
        """Raise ``ValueError`` unless ``x`` has ``h * w >= 2`` positions; return ``n``."""
        n = x.shape[-2] * x.shape[-1]
        if n < 2:
            raise ValueError(
                "SMSOPooling needs at least 2 spatial positions (h * w >= 2) to estimate a "
                f"covariance, got h={x.shape[-2]}, w={x.shape[-1]}"
            )
        return n
