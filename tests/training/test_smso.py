"""SMSOPooling against the formulas of docs/smso.md, computed independently in numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from training.heads.smso import AFFINES, FORMS, Form, SMSOPooling


def reference_smso(x: np.ndarray, w: np.ndarray, sigma: np.ndarray, gamma, beta) -> np.ndarray:
    """Eq. 1, 3, 6, 7 in float64: x (B, c, h, w), w (p, c), sigma (c, c) -> (B, p)."""
    b, c = x.shape[:2]
    xs = x.reshape(b, c, -1).astype(np.float64)
    n = xs.shape[-1]
    out = []
    for img in xs:
        y = np.cov(img)  # (c, c), mean removed, divided by n - 1
        z = np.einsum("pc,cd,pd->p", w, y, w)
        alpha = 2 * (n - 1) / np.einsum("pc,cd,pd->p", w, sigma, w)
        out.append(beta + gamma * (np.sqrt(alpha * z) - np.sqrt(2 * (n - 1) - 1)))
    return np.stack(out)


def affine_parameters(layer: SMSOPooling) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's ``log_gamma`` and ``beta``, which its default ``affine="both"`` creates."""
    assert layer.log_gamma is not None
    assert layer.beta is not None
    return layer.log_gamma, layer.beta


def reference_for(layer: SMSOPooling, x: torch.Tensor) -> np.ndarray:
    """``reference_smso`` with the layer's own weights, Sigma, gamma and beta."""
    assert layer.gamma is not None
    assert layer.beta is not None
    params = [layer.weight, layer.running_cov, layer.gamma, layer.beta]
    w, sigma, gamma, beta = (t.detach().double().numpy() for t in params)
    return reference_smso(x.numpy(), w, sigma, gamma, beta)


def randomize(layer: SMSOPooling) -> SMSOPooling:
    """Non-trivial gamma, beta and running Sigma, so every term of the formula is exercised."""
    c = layer.in_channels
    with torch.no_grad():
        log_gamma, beta = affine_parameters(layer)
        log_gamma.normal_(0, 0.3)
        beta.normal_(0, 0.5)
        a = torch.randn(c, c)
        layer.running_cov.copy_(a @ a.T / c + 0.5 * torch.eye(c))
    return layer.eval()


# (c, p, h, w): n < c, n = c, n > c, non-square, p > c, p < c.
GRID = [
    (16, 8, 2, 3),
    (16, 32, 4, 4),
    (32, 8, 3, 5),
    (8, 4, 7, 9),
    (64, 128, 6, 6),
    (24, 2048, 4, 4),
    (256, 64, 7, 7),
    (256, 64, 28, 28),
]


@pytest.mark.parametrize(("c", "p", "h", "w"), GRID)
def test_forms_agree_and_match_the_formula(c: int, p: int, h: int, w: int) -> None:
    conv = randomize(SMSOPooling(c, p, form="conv"))
    cov = SMSOPooling(c, p, form="covariance").eval()
    cov.load_state_dict(conv.state_dict())
    x = torch.randn(3, c, h, w) * 2 + 0.5
    with torch.no_grad():
        a, b = conv(x), cov(x)
    ref = reference_for(conv, x)
    scale = np.abs(ref).max()
    assert a.shape == (3, p)
    assert np.abs(a.double().numpy() - b.double().numpy()).max() <= 1e-5 * scale
    np.testing.assert_allclose(a.double().numpy(), ref, rtol=0, atol=1e-5 * scale)


def test_state_dicts_have_the_same_names_in_both_forms() -> None:
    conv, cov = SMSOPooling(8, 4, form="conv"), SMSOPooling(8, 4, form="covariance")
    assert {k: v.shape for k, v in conv.state_dict().items()} == {
        k: v.shape for k, v in cov.state_dict().items()
    }


def hand_computed_z_prime(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Eq. 1, 3 and 6 for Sigma = I, one position and one channel at a time in float64:
    x (B, c, h, w), w (p, c) -> z' (B, p)."""
    b, c, h, wd = x.shape
    n = h * wd
    out = np.zeros((b, len(w)))
    for i in range(b):
        positions = [[float(x[i, k, r, s]) for k in range(c)] for r in range(h) for s in range(wd)]
        mu = [sum(pos[k] for pos in positions) / n for k in range(c)]
        for j, row in enumerate(w):
            u = [sum(row[k] * (pos[k] - mu[k]) for k in range(c)) for pos in positions]
            z = sum(v * v for v in u) / (n - 1)  # w_j^T Y w_j
            sigma = sum(v * v for v in row)  # w_j^T I w_j
            out[i, j] = math.sqrt(2 * (n - 1) * z / sigma) - math.sqrt(2 * (n - 1) - 1)
    return out


@pytest.mark.parametrize("form", FORMS)
def test_fresh_layer_outputs_standardised_z(form: Form) -> None:
    """A new layer (gamma = 1, beta = 0, Sigma = I) outputs Eq. 6's z' as such."""
    layer = SMSOPooling(8, 4, form=form).eval()
    x = torch.randn(2, 8, 5, 5)
    w = layer.weight.detach().double().numpy()
    with torch.no_grad():
        out = layer(x).double().numpy()
    np.testing.assert_allclose(out, hand_computed_z_prime(x.double().numpy(), w), atol=1e-5)


@pytest.mark.parametrize("form", FORMS)
def test_fresh_layer_on_a_covariance_proportional_to_sigma_gives_the_closed_form(
    form: Form,
) -> None:
    """Two channels at 2 x 2 positions, +-1 patterns orthogonal to each other: Y = 4/3 I = 4/3
    Sigma, so q = (n-1) z / (w^T Sigma w) = 4 whatever W, and z' = sqrt(8) - sqrt(5)."""
    layer = SMSOPooling(2, 5, form=form).eval()
    pattern = torch.tensor([[[1.0, -1.0], [1.0, -1.0]], [[1.0, 1.0], [-1.0, -1.0]]])
    x = (pattern + torch.tensor([3.0, -7.0])[:, None, None])[None]  # offsets: the mean is removed
    with torch.no_grad():
        out = layer(x)
    expected = math.sqrt(8) - math.sqrt(5)  # 0.5924...
    np.testing.assert_allclose(out.double().numpy(), np.full((1, 5), expected), atol=1e-5)


def test_any_resolution_uses_its_own_n() -> None:
    layer = randomize(SMSOPooling(8, 4))
    for h, w in [(1, 2), (3, 3), (14, 14), (5, 31)]:
        x = torch.randn(2, 8, h, w)
        with torch.no_grad():
            out = layer(x).double().numpy()
        np.testing.assert_allclose(out, reference_for(layer, x), atol=1e-4)


@pytest.mark.parametrize("affine", AFFINES)
def test_affine_variants_have_their_parameters(affine: str) -> None:
    layer = SMSOPooling(8, 4, affine=affine)
    names = {name for name, _ in layer.named_parameters()}
    expected = {"weight"}
    if affine in ("both", "gamma"):
        expected.add("log_gamma")
    if affine in ("both", "beta"):
        expected.add("beta")
    assert names == expected
    x = torch.randn(2, 8, 4, 4)
    assert layer.eval()(x).shape == (2, 4)


def test_gamma_stays_positive_under_any_update() -> None:
    layer = SMSOPooling(8, 4)
    with torch.no_grad():
        affine_parameters(layer)[0].fill_(-50.0)
    assert layer.gamma is not None
    assert bool((layer.gamma > 0).all())


@pytest.mark.parametrize("form", FORMS)
def test_running_sigma_updates_in_training_only(form: Form) -> None:
    layer = SMSOPooling(4, 3, form=form, momentum=0.5)
    x = torch.randn(6, 4, 5, 5) * 3
    layer(x)
    expected = (
        0.5 * torch.eye(4)
        + 0.5
        * torch.from_numpy(
            np.mean([np.cov(img.reshape(4, -1)) for img in x.numpy()], axis=0)
        ).float()
    )
    torch.testing.assert_close(layer.running_cov, expected, rtol=1e-5, atol=1e-5)
    assert layer.num_batches_tracked.item() == 1
    layer.eval()
    before = layer.running_cov.clone()
    layer(x)
    assert torch.equal(layer.running_cov, before)


def test_cumulative_average_without_momentum() -> None:
    layer = SMSOPooling(4, 3, momentum=None)
    batches = [torch.randn(3, 4, 4, 4) * s for s in (1.0, 2.0, 3.0)]
    for x in batches:
        layer(x)
    pooled = [SMSOPooling.pooled_covariance(x) for x in batches]
    torch.testing.assert_close(layer.running_cov, sum(pooled) / 3)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("transform", ["sqrt", "log", "cuberoot", "none"])
def test_constant_input_gives_finite_outputs_and_gradients(form: Form, transform: str) -> None:
    layer = SMSOPooling(8, 4, form=form, transform=transform)
    x = torch.full((2, 8, 5, 5), 3.0, requires_grad=True)
    out = layer(x)
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert x.grad is not None
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("form", FORMS)
def test_autocast_computes_in_float32(form: Form) -> None:
    layer = randomize(SMSOPooling(16, 8, form=form))
    x = torch.randn(2, 16, 6, 6).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, layer(x.float()), rtol=1e-6, atol=1e-6)


def test_gradcheck_float64() -> None:
    layer = randomize(SMSOPooling(4, 3, form="conv")).double()
    x = torch.randn(2, 4, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,))
    layer.form = "covariance"
    assert torch.autograd.gradcheck(layer, (x,))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"form": "matrix"}, "valid forms: conv, covariance"),
        ({"transform": "exp"}, "valid transforms: sqrt, cuberoot, log, none"),
        ({"affine": "scale"}, "valid values: both, beta, gamma, none"),
        ({"momentum": 0.0}, "momentum must be in"),
    ],
)
def test_bad_settings_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SMSOPooling(8, 4, **kwargs)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((2, 8, 4), r"expects a feature map \(B, c, h, w\)"),
        ((2, 6, 4, 4), "built for 8 channels"),
        ((2, 8, 1, 1), "at least 2 spatial positions"),
    ],
)
def test_bad_inputs_are_named(shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SMSOPooling(8, 4)(torch.randn(*shape))
