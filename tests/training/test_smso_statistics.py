"""The statistical claim of paper Sec. 3.1, checked on synthetic Gaussian features.

With ``x_i ~ N(0, Sigma)`` for a known, non-diagonal ``Sigma``: the running estimate converges to
``Sigma``; ``(n-1) z_j / (w_j^T Sigma w_j)`` follows ``chi2_{n-1}``; and the pre-affine output
``z'`` is close to ``N(0, 1)``. All draws are seeded, so the outcome is deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from training.heads.smso import SMSOPooling

C, P, H = 8, 6, 14
N = H * H


@pytest.fixture(scope="module")
def setting() -> tuple[SMSOPooling, torch.Tensor, torch.Tensor]:
    """A layer whose running Sigma was estimated from 100 batches, and 2,000 fresh images."""
    gen = torch.Generator().manual_seed(1234)
    a = torch.randn(C, C, generator=gen, dtype=torch.float64)
    sigma = a @ a.T / C + 0.5 * torch.eye(C, dtype=torch.float64)  # non-diagonal, SPD
    chol = torch.linalg.cholesky(sigma).float()

    def draw(b: int) -> torch.Tensor:
        return (torch.randn(b, H, H, C, generator=gen) @ chol.T).permute(0, 3, 1, 2)

    torch.manual_seed(0)
    layer = SMSOPooling(C, P, momentum=None)
    with torch.no_grad():
        for _ in range(100):
            layer(draw(64))
    return layer.eval(), sigma, draw(2000)


def test_running_sigma_converges(setting) -> None:
    layer, sigma, _ = setting
    err = (layer.running_cov.double() - sigma).abs().max() / sigma.abs().max()
    assert err < 5e-3


def test_scaled_pv_output_is_chi2(setting) -> None:
    layer, sigma, x = setting
    with torch.no_grad():
        z = layer.vectorize(x).double()  # (2000, P)
    w = layer.weight.detach().double()
    q = (N - 1) * z / ((w @ sigma) * w).sum(1)
    for j in range(P):
        assert stats.kstest(q[:, j].numpy(), "chi2", args=(N - 1,)).pvalue > 0.01
    assert abs(q.mean().item() / (N - 1) - 1) < 0.01  # E chi2_k = k
    assert abs(q.var().item() / (2 * (N - 1)) - 1) < 0.1  # Var chi2_k = 2k


def test_sqrt_normalised_output_is_standard_normal(setting) -> None:
    layer, _, x = setting
    with torch.no_grad():
        zp = layer(x).numpy()  # fresh layer: gamma = 1, beta = 0, so z'' = z'
    assert np.abs(zp.mean(0)).max() < 0.06
    assert np.abs(zp.std(0) - 1).max() < 0.06
    for j in range(P):
        assert stats.kstest(zp[:, j], "norm").pvalue > 0.01


@pytest.mark.parametrize("transform", ["log", "cuberoot", "none"])
def test_every_transform_is_standardised(setting, transform: str) -> None:
    layer, _, x = setting
    variant = SMSOPooling(C, P, transform=transform).eval()
    variant.load_state_dict(layer.state_dict())
    with torch.no_grad():
        out = variant(x).numpy()
    assert np.abs(out.mean(0)).max() < 0.06
    assert np.abs(out.std(0) - 1).max() < 0.06


def test_none_transform_is_skewed_where_sqrt_is_not(setting) -> None:
    """Why the root is there: chi2's skewness sqrt(8/k) survives without it."""
    layer, _, x = setting
    raw = SMSOPooling(C, P, transform="none").eval()
    raw.load_state_dict(layer.state_dict())
    with torch.no_grad():
        skew_none = stats.skew(raw(x).numpy(), axis=0).mean()
        skew_sqrt = stats.skew(layer(x).numpy(), axis=0).mean()
    assert skew_none > 0.1
    assert abs(skew_sqrt) < skew_none / 2
