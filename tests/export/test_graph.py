"""FoldedSMSO computes what SMSOPooling computes in eval mode, in both forms; the cost model
that picks between them."""

from __future__ import annotations

import pytest
import torch

from export.graph import FoldedSMSO, UnsupportedHeadError, cheaper_form, exportable, form_costs
from training.heads.smso import SMSOPooling
from training.model import ModelConfig, build_model


def trained_pool(transform: str = "sqrt", affine: str = "both") -> SMSOPooling:
    """An SMSO layer whose running Sigma, gamma and beta are not at their initial values."""
    torch.manual_seed(0)
    pool = SMSOPooling(8, 5, transform=transform, affine=affine)
    mixing = torch.randn(8, 8)
    for _ in range(5):
        pool(torch.einsum("dc,bchw->bdhw", mixing, torch.randn(4, 8, 6, 5)))
    with torch.no_grad():
        for p in (pool.log_gamma, pool.beta):
            if p is not None:
                p.normal_(0, 0.3)
    return pool.eval()


@pytest.mark.parametrize("form", ["conv", "covariance"])
@pytest.mark.parametrize("transform", ["sqrt", "log", "cuberoot", "none"])
@pytest.mark.parametrize("affine", ["both", "gamma", "beta", "none"])
def test_folded_smso_matches_the_layer_in_eval_mode(form, transform, affine):
    pool = trained_pool(transform, affine)
    folded = FoldedSMSO(pool, form)
    for shape in [(3, 8, 6, 5), (1, 8, 2, 3), (2, 8, 11, 9)]:  # n = 30, 6 and 99
        x = torch.randn(shape) * 2 + 0.5
        torch.testing.assert_close(folded(x), pool(x), rtol=1e-5, atol=1e-5)


def test_folded_smso_keeps_p_numbers_for_sigma_and_no_c_by_c_buffer():
    folded = FoldedSMSO(trained_pool(), "conv")
    shapes = {name: tuple(b.shape) for name, b in folded.named_buffers()}
    assert shapes["inv_variance"] == (5,)
    assert all(shape != (8, 8) for shape in shapes.values())


def test_deepo2p_cannot_be_exported_and_the_error_says_why():
    model = build_model(ModelConfig(10, backbone="small_cnn", head="deepo2p", reduce_dim=8))
    with pytest.raises(UnsupportedHeadError, match="eigen-decomposition"):
        exportable(model)


def test_an_unknown_form_is_refused():
    with pytest.raises(ValueError, match="'conv' or 'covariance'"):
        FoldedSMSO(trained_pool(), "cholesky")  # type: ignore[arg-type]


def test_the_cheaper_form_is_the_covariance_form_exactly_where_p_n_minus_c_reaches_n_c():
    # the reference is docs/smso.md's inequality, not the cost model's sums
    for c in (1, 2, 7, 8, 64, 256):
        for n in (2, 4, 49, 196, 784):
            for p in (1, 4, 64, 379, 380, 381, 2048):
                expected = "covariance" if p * (n - c) >= n * c else "conv"
                assert cheaper_form(c, p, n) == expected, (c, p, n)


@pytest.mark.parametrize(
    ("c", "p", "n", "form"),
    [
        (256, 2048, 784, "covariance"),  # VGG-D at 448 px, p = 2,048 (bench/heads.py: 31 vs 103 ms)
        (256, 380, 784, "conv"),  # VGG-D at 448 px: the 1x1 form wins below p = 380.1
        (256, 381, 784, "covariance"),
        (256, 2048, 196, "conv"),  # ResNet-50 at 448 px: n < c, the 1x1 form always
        (256, 2048, 49, "conv"),  # ResNet-50 at 224 px
        (2, 4, 4, "covariance"),  # a tie (32 multiply-adds each) goes to the covariance form
    ],
)
def test_cheaper_form_on_the_paper_backbones(c, p, n, form):
    assert cheaper_form(c, p, n) == form


def test_form_costs_count_the_products_of_each_form():
    costs = form_costs(channels=256, dim=2048, positions=784)
    assert costs == {"conv": 2048 * 256 * 784, "covariance": 256 * 256 * 784 + 2048 * 256 * 256}
