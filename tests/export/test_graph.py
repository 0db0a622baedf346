"""FoldedSMSO computes what SMSOPooling computes in eval mode, in both forms."""

from __future__ import annotations

import pytest
import torch

from export.graph import FoldedSMSO, UnsupportedHeadError, exportable
from training.model import ModelConfig, build_model
from training.smso import SMSOPooling


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
