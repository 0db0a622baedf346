"""The module that is traced to ONNX: a trained model in eval mode, its SMSO head folded.

In eval mode SMSO's running covariance ``Sigma`` is a constant, so the per-output scale is too:
:class:`FoldedSMSO` keeps only ``1 / (w_j^T Sigma w_j)`` (``p`` numbers) and never holds or builds a
``c x c`` matrix in its default 1x1-conv + l2-pool form (paper Sec. 3.2, Eq. 8-11)::

    x_c  = x - mean_i x_i                    # (B, c, h, w), per-channel spatial mean
    u    = Conv1x1(x_c; W, no bias)          # (B, p, h, w), centred: W x_c = u - mean u
    s_j  = sum_i u_ij^2 = n * mean_i u_ij^2  # (B, p), the l2 pool
    q_j  = s_j / (w_j^T Sigma w_j)           # = (n - 1) z_j / (w_j^T Sigma w_j)
    z''  = beta + gamma * T(q, n - 1)        # T: sqrt(2q) - sqrt(2(n-1) - 1) by default

so ``alpha_j = 2 (n-1) / (w_j^T Sigma w_j)`` of Eq. 6 appears as the folded constant times the
``n`` the graph reads from its input's shape. ``form="covariance"`` computes ``s`` through the
per-image covariance instead; :func:`form_costs` models what each form costs and
:func:`cheaper_form` picks between them (``smso-export --form auto``).

:func:`exportable` wraps a :class:`training.model.SecondOrderNet` as ``images -> (logits,
embedding)``, with its backbone in float32 or float16 and its head always in float32; heads ONNX
cannot express raise :class:`UnsupportedHeadError`.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.chi2_transforms import chi2_to_normal
from training.heads.deepo2p import DeepO2P
from training.heads.smso import SMSOPooling
from training.model import SecondOrderNet
from training.second_order import covariance

__all__ = [
    "ExportForm",
    "ExportModel",
    "FoldedSMSO",
    "Precision",
    "UnsupportedHeadError",
    "cheaper_form",
    "exportable",
    "form_costs",
]

ExportForm = Literal["conv", "covariance"]
Precision = Literal["float32", "float16"]  # of the backbone: the head always computes in float32

#: Heads ONNX has no operator for, and why.
UNSUPPORTED: dict[type[nn.Module], str] = {
    DeepO2P: (
        "DeepO2P's matrix logarithm needs an eigen-decomposition (torch.linalg.eigh), "
        "which ONNX has no operator for"
    ),
}


class UnsupportedHeadError(ValueError):
    """The model's head has no ONNX equivalent."""


def form_costs(channels: int, dim: int, positions: int) -> dict[ExportForm, int]:
    """Modelled multiply-adds per image of each form of the SMSO head (``docs/smso.md``).

    ``channels`` is ``c``, ``dim`` is ``p``, ``positions`` is ``n = h * w``. The 1x1 form costs
    ``p c n`` (the convolution), the covariance form ``c^2 n + p c^2`` (the covariance, then
    ``Y W``); the centring, squares and sums that both add are ``O((c + p) n)`` and left out.
    """
    return {
        "conv": dim * channels * positions,
        "covariance": channels * channels * positions + dim * channels * channels,
    }


def cheaper_form(channels: int, dim: int, positions: int) -> ExportForm:
    """The form with the smaller :func:`form_costs`: the covariance form where
    ``p (n - c) >= n c`` (ties go to it), the 1x1 form otherwise (always when ``n <= c``)."""
    costs = form_costs(channels, dim, positions)
    return "covariance" if costs["covariance"] <= costs["conv"] else "conv"


class FoldedSMSO(nn.Module):
    """SMSO in eval mode with ``Sigma`` folded into ``p`` constants: ``(B, c, h, w) -> (B, p)``.

    Computes exactly what ``SMSOPooling.eval()`` computes (up to float rounding), in float32.
    """

    weight: Tensor  # buffers: W (p, c), 1 / (w_j^T Sigma w_j) (p,), gamma and beta (p,)
    inv_variance: Tensor
    gamma: Tensor | None
    beta: Tensor | None

    def __init__(self, pool: SMSOPooling, form: ExportForm = "conv") -> None:
        super().__init__()
        if form not in ("conv", "covariance"):
            raise ValueError(f"form must be 'conv' or 'covariance', got {form!r}")
        self.form = form
        self.transform = pool.transform
        with torch.no_grad():
            weight = pool.weight.detach().float()  # (p, c)
            variance = pool.projected_variance().float().clamp_min(torch.finfo(torch.float32).tiny)
            self.register_buffer("weight", weight.clone())
            self.register_buffer("inv_variance", 1.0 / variance)  # (p,)
            gamma = pool.gamma
            beta = pool.beta
            self.register_buffer("gamma", None if gamma is None else gamma.detach().float().clone())
            self.register_buffer("beta", None if beta is None else beta.detach().float().clone())

    def forward(self, x: Tensor) -> Tensor:
        """``(B, c, h, w)`` -> ``(B, p)`` embedding ``z''``."""
        x = x.float()
        n = x.shape[-2] * x.shape[-1]
        if self.form == "conv":
            x = x - x.mean(dim=(-2, -1), keepdim=True)  # (B, c, h, w)
            u = F.conv2d(x, self.weight[:, :, None, None])  # (B, p, h, w)
            s = u.square().mean(dim=(-2, -1)) * n  # (B, p), sum of squares of the centred u
        else:
            y = covariance(x)  # (B, c, c)
            s = ((y @ self.weight.T) * self.weight.T).sum(dim=1) * (n - 1)  # (B, p)
        # k as a traced tensor: a Python number would be frozen at the traced input's size
        k = torch.scalar_tensor(n - 1, dtype=s.dtype, device=s.device)
        out = chi2_to_normal(s * self.inv_variance, k, self.transform)  # (B, p)
        if self.gamma is not None:
            out = out * self.gamma
        if self.beta is not None:
            out = out + self.beta
        return out


class ExportModel(nn.Module):
    """``images (N, C, H, W) float32 -> (logits (N, K), embedding (N, D), features (N, C_b))``,
    float32, eval mode. ``features`` is the global average of the backbone's last feature map
    (``C_b`` channels, before the channel reduction): what the service's typicality score adds
    as a class-conditional Mahalanobis term (Lee et al., 2018), at the cost of one mean.

    ``precision="float16"`` runs the backbone and the channel reduction (weights and activations)
    in float16 and the head and classifier in float32, so the traced graph casts twice: the image
    to float16 on entry, the head's input back to float32. The head stays in float32 because its
    sums of squares over ``n`` positions can exceed float16's largest value, 65,504
    (``docs/smso.md``).
    """

    def __init__(
        self, model: SecondOrderNet, form: ExportForm = "conv", precision: Precision = "float32"
    ) -> None:
        super().__init__()
        if precision not in ("float32", "float16"):
            raise ValueError(f"precision must be 'float32' or 'float16', got {precision!r}")
        model = copy.deepcopy(model).float().eval()
        head = model.head
        for kind, reason in UNSUPPORTED.items():
            if isinstance(head, kind):
                raise UnsupportedHeadError(
                    f"head {model.config.head!r} cannot be exported: {reason}"
                )
        self.trunk_dtype = torch.float16 if precision == "float16" else torch.float32
        self.backbone = model.backbone.to(self.trunk_dtype)
        self.reduce = model.reduce.to(self.trunk_dtype)
        self.head = FoldedSMSO(head, form) if isinstance(head, SMSOPooling) else head
        self.classifier = model.classifier

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        trunk = self.backbone(images.to(self.trunk_dtype))  # (N, C_b, h, w)
        features = self.reduce(trunk)  # (N, c, h, w)
        embedding = self.head(features.float())  # (N, D): float32 from the head on
        pooled = trunk.float().mean(dim=(2, 3))  # (N, C_b)
        return self.classifier(embedding), embedding, pooled


def exportable(
    model: SecondOrderNet, form: ExportForm = "conv", precision: Precision = "float32"
) -> ExportModel:
    """The module to trace; raises :class:`UnsupportedHeadError` for heads ONNX cannot express."""
    return ExportModel(model, form, precision).eval()
