"""Every registered head: shapes at the paper's settings, the formula, gradients, blank input."""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import pytest
import scipy.linalg
import torch

from training.heads import HEADS, Head, HeadOptionError, HeadSpec, UnknownHeadError, create_head
from training.heads.compact_bilinear import RandomMaclaurin
from training.heads.deepo2p import SymmetricLog
from training.heads.lrbp import LowRankBilinear
from training.heads.mpn import newton_schulz_sqrt
from training.heads.vgg_fc import VGGClassifierHead
from training.second_order import covariance

# name -> (c, options, expected output_dim) at the paper's settings (docs/smso.md).
PAPER_SETTINGS: dict[str, list[tuple[int, dict[str, Any], int]]] = {
    "gap": [(2048, {}, 2048)],
    "vgg_fc": [(512, {}, 4096)],
    "bp": [(512, {}, 262_144), (256, {"vectorize": "triu"}, 32_896)],  # Table 1, Table 2
    "deepo2p": [(512, {}, 262_144)],
    "mpn": [(256, {}, 32_896)],
    "cbp_ts": [(512, {}, 8192)],
    "cbp_rm": [(512, {}, 8192)],
    "lrbp": [(512, {"num_classes": 67}, 67)],
    "flatten": [(256, {}, 65_536), (256, {"vectorize": "triu"}, 32_896)],
    "smso": [(256, {"dim": 64}, 64), (256, {"dim": 2048}, 2048), (256, {}, 2048)],
}

# name -> (c, options) small enough for float64 gradcheck.
SMALL: dict[str, tuple[int, dict[str, Any]]] = {
    "gap": (4, {}),
    "vgg_fc": (4, {"hidden": 8, "pool": 2}),
    "bp": (4, {}),
    "deepo2p": (4, {}),
    "mpn": (4, {}),
    "cbp_ts": (4, {"dim": 16}),
    "cbp_rm": (4, {"dim": 16}),
    "lrbp": (4, {"num_classes": 3, "projection_dim": 3, "rank": 2}),
    "flatten": (4, {}),
    "smso": (4, {"dim": 3}),
}

PAPER_CASES = [(name, *case) for name, cases in PAPER_SETTINGS.items() for case in cases]


def test_every_registered_head_is_covered() -> None:
    """Registering a head without adding it here fails: each table must name every head."""
    assert set(PAPER_SETTINGS) == set(HEADS)
    assert set(SMALL) == set(HEADS)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_every_head_is_a_head_in_each_form_its_spec_declares(name: str) -> None:
    c, options = SMALL[name]
    head = create_head(name, c, **options).eval()
    assert isinstance(head, Head)
    x = torch.randn(2, c, 3, 3)
    with torch.no_grad():
        ref = head(x)
        for form in HEADS[name].forms:  # one function, other arithmetic: same state, same output
            other = create_head(name, c, **{**options, "form": form}).eval()
            other.load_state_dict(head.state_dict())
            torch.testing.assert_close(other(x), ref, rtol=1e-4, atol=1e-5)


def test_a_spec_that_scores_classes_must_take_their_number() -> None:
    with pytest.raises(ValueError, match="must declare needs_num_classes"):
        HeadSpec(create_head, None, "x", scores_classes=True)
    with pytest.raises(ValueError, match="valid losses: cross_entropy, hinge"):
        HeadSpec(create_head, None, "x", loss="l2")


def test_unknown_head_lists_the_valid_names() -> None:
    with pytest.raises(
        UnknownHeadError, match="valid heads: bp, cbp_rm, cbp_ts, deepo2p, flatten, gap"
    ):
        create_head("nope", 8)


@pytest.mark.parametrize(("name", "c", "options", "dim"), PAPER_CASES)
def test_output_dim_at_paper_settings(name: str, c: int, options: dict, dim: int) -> None:
    head = create_head(name, c, **options).eval()
    assert head.output_dim == dim
    with torch.no_grad():
        out = head(torch.randn(1, c, 3, 3))
    assert out.shape == (1, dim)
    assert out.dtype == torch.float32


@pytest.mark.parametrize("name", sorted(HEADS))
def test_gradcheck_float64(name: str) -> None:
    c, options = SMALL[name]
    head = create_head(name, c, **options).double().eval()  # eval: SMSO's Sigma stays fixed
    x = torch.randn(2, c, 3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(head, (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", sorted(HEADS))
@pytest.mark.parametrize("value", [0.0, 1.5])
def test_blank_input_gives_finite_outputs_and_gradients(name: str, value: float) -> None:
    c, options = SMALL[name]
    head = create_head(name, 2 * c, **options)
    x = torch.full((2, 2 * c, 4, 4), value, requires_grad=True)
    out = head(x)
    out.square().sum().backward()
    assert torch.isfinite(out).all()
    assert x.grad is not None
    assert torch.isfinite(x.grad).all()
    for pname, param in head.named_parameters():
        assert param.grad is None or torch.isfinite(param.grad).all(), pname


@pytest.mark.parametrize("name", sorted(set(HEADS) - {"vgg_fc"}))  # first-order: AMP is fine
def test_autocast_runs_the_second_order_heads_in_float32(name: str) -> None:
    c, options = SMALL[name]
    head = create_head(name, c, **options).eval()
    x = torch.randn(2, c, 4, 4)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = head(x.bfloat16())
    assert out.dtype == torch.float32


# --- each head against its formula, computed independently in numpy/scipy -------------------


H = TypeVar("H", bound=Head)


def created(kind: type[H], name: str, c: int, **options: Any) -> H:
    """``create_head(name, c, **options)``, checked to be the class ``kind``."""
    head = create_head(name, c, **options)
    assert isinstance(head, kind)
    return head


def _positions(x: torch.Tensor) -> np.ndarray:
    """(B, c, h, w) tensor -> (B, n, c) float64 array of positions."""
    return x.flatten(2).transpose(1, 2).double().numpy()


def _bp_normalise(z: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    y = np.sign(z) * (np.sqrt(np.abs(z) + eps) - np.sqrt(eps))
    return y / np.linalg.norm(y, axis=1, keepdims=True)


def test_gap_is_the_mean() -> None:
    x = torch.randn(2, 6, 3, 5)
    np.testing.assert_allclose(create_head("gap", 6)(x).numpy(), _positions(x).mean(1), atol=1e-6)


def test_bp_matches_formula() -> None:
    x = torch.randn(2, 5, 3, 4)
    pos = _positions(x)
    gram = np.einsum("bni,bnj->bij", pos, pos) / pos.shape[1]
    ref = _bp_normalise(gram.reshape(2, -1))
    np.testing.assert_allclose(create_head("bp", 5)(x).numpy(), ref, atol=1e-6)


def test_bp_upper_triangle_is_the_same_numbers_once_each() -> None:
    x = torch.randn(2, 5, 3, 4)
    pos = _positions(x)
    gram = np.einsum("bni,bnj->bij", pos, pos) / pos.shape[1]
    rows, cols = np.triu_indices(5)
    ref = _bp_normalise(gram[:, rows, cols])
    np.testing.assert_allclose(create_head("bp", 5, vectorize="triu")(x).numpy(), ref, atol=1e-6)


@pytest.mark.parametrize("vectorize", ["full", "triu"])
def test_flatten_is_the_covariance_vectorised(vectorize: str) -> None:
    x = torch.randn(2, 6, 3, 5)
    covs = np.stack([np.cov(img.T) for img in _positions(x)])  # Eq. 1: mean removed, n - 1
    rows, cols = np.triu_indices(6)
    ref = covs.reshape(2, -1) if vectorize == "full" else covs[:, rows, cols]
    out = create_head("flatten", 6, vectorize=vectorize)(x).numpy()
    np.testing.assert_allclose(out, ref, atol=1e-6)


def test_deepo2p_matches_scipy_logm() -> None:
    x = torch.randn(2, 6, 2, 2)  # n = 4 < c = 6: the covariance is singular, eps makes it SPD
    head = create_head("deepo2p", 6, eps=1e-3)
    ref = [
        scipy.linalg.logm(np.cov(img.T) + 1e-3 * np.eye(6)).real.reshape(-1)
        for img in _positions(x)
    ]
    np.testing.assert_allclose(head(x).numpy(), np.stack(ref), atol=1e-5)


def test_symmetric_log_backward_matches_autograd_eigh() -> None:
    a = torch.randn(2, 5, 5, dtype=torch.float64)
    spd = a @ a.transpose(1, 2) + 0.5 * torch.eye(5, dtype=torch.float64)
    g = torch.randn(2, 5, 5, dtype=torch.float64)
    mine = spd.clone().requires_grad_()
    (SymmetricLog.apply(mine, 1e-12) * g).sum().backward()
    ref = spd.clone().requires_grad_()
    evals, evecs = torch.linalg.eigh(ref)
    ((evecs * evals.log()[:, None, :]) @ evecs.transpose(1, 2) * g).sum().backward()
    torch.testing.assert_close(mine.grad, ref.grad)


def test_symmetric_log_gradient_is_finite_at_repeated_eigenvalues() -> None:
    a = (2.0 * torch.eye(4, dtype=torch.float64))[None].requires_grad_()
    SymmetricLog.apply(a, 1e-12).sum().backward()
    # d/dA sum(log A) at A = 2I is the identity... divided by 2 (and symmetrised ones off-diagonal)
    assert a.grad is not None
    torch.testing.assert_close(a.grad[0], torch.full((4, 4), 0.5, dtype=torch.float64))


def test_mpn_square_root_squared_recovers_the_covariance() -> None:
    x = torch.randn(2, 16, 8, 8, dtype=torch.float64)
    y = covariance(x, ddof=0)
    root = newton_schulz_sqrt(y, iterations=20)
    torch.testing.assert_close(root @ root, y, rtol=1e-8, atol=1e-10)
    ref = np.stack([scipy.linalg.sqrtm(m).real for m in y.numpy()])
    np.testing.assert_allclose(root.numpy(), ref, atol=1e-8)
    # The paper's 5 iterations already approximate it on a well-conditioned covariance.
    x = torch.randn(2, 8, 20, 20, dtype=torch.float64)
    y = covariance(x, ddof=0)
    root = newton_schulz_sqrt(y, iterations=5)
    assert ((root @ root - y).norm() / y.norm()) < 1e-2


def test_mpn_head_is_the_upper_triangle_of_the_root() -> None:
    head = create_head("mpn", 6, iterations=20).double()
    x = torch.randn(2, 6, 5, 5, dtype=torch.float64)
    ref = [
        scipy.linalg.sqrtm(np.cov(img.T, bias=True)).real[np.triu_indices(6)]
        for img in _positions(x)
    ]
    np.testing.assert_allclose(head(x).numpy(), np.stack(ref), atol=1e-8)


def test_tensor_sketch_matches_circular_convolution_of_count_sketches() -> None:
    c, d = 5, 32
    head = create_head("cbp_ts", c, dim=d).double()
    x = torch.randn(2, c, 3, 3, dtype=torch.float64)
    sketches = []
    for k in (1, 2):
        matrix = np.zeros((c, d))  # count sketch as an explicit c x d matrix
        bucket, sign = (getattr(head, f"{name}{k}").numpy() for name in ("bucket", "sign"))
        matrix[np.arange(c), bucket] = sign
        sketches.append(_positions(x) @ matrix)  # (B, n, d)
    conv = np.fft.ifft(np.fft.fft(sketches[0]) * np.fft.fft(sketches[1])).real  # circular conv
    np.testing.assert_allclose(head(x).numpy(), _bp_normalise(conv.sum(1)), atol=1e-7)


def test_random_maclaurin_matches_formula() -> None:
    c, d = 5, 32
    head = created(RandomMaclaurin, "cbp_rm", c, dim=d)
    x = torch.randn(2, c, 3, 3)
    pos = _positions(x)
    w1, w2 = head.proj1.double().numpy(), head.proj2.double().numpy()
    assert set(np.unique(w1)) == {-1.0, 1.0}
    ref = _bp_normalise(((pos @ w1) * (pos @ w2)).sum(1) / np.sqrt(d))
    np.testing.assert_allclose(head(x).numpy(), ref, atol=1e-5)


@pytest.mark.parametrize("name", ["cbp_ts", "cbp_rm"])
def test_compact_bilinear_approximates_the_bilinear_kernel(name: str) -> None:
    """Gao et al.'s premise: <phi(X), phi(X')> ~ <BP(X), BP(X')> before normalisation."""
    c, d = 16, 8192
    head = create_head(name, c, dim=d)
    first = torch.randn(1, c, 1, 2)
    x = torch.cat([first, first + 0.7 * torch.randn(1, c, 1, 2)])  # two related images
    pos = _positions(x)
    exact = (np.einsum("ni,mi->nm", pos[0], pos[1]) ** 2).sum()
    bp = [np.einsum("ni,nj->ij", p, p).reshape(-1) for p in pos]
    cosine_exact = exact / np.linalg.norm(bp[0]) / np.linalg.norm(bp[1])
    # Undo the signed square root: sign(y) y^2 is proportional to the raw sketch z (eps aside).
    out = head(x).double().numpy()
    raw = np.sign(out) * out**2
    cosine = (raw[0] @ raw[1]) / np.linalg.norm(raw[0]) / np.linalg.norm(raw[1])
    assert cosine_exact > 0.3
    assert abs(cosine - cosine_exact) < 0.05


def test_lrbp_matches_formula_and_scores_classes() -> None:
    c, k, m, r = 6, 4, 5, 4
    head = created(LowRankBilinear, "lrbp", c, num_classes=k, projection_dim=m, rank=r)
    with torch.no_grad():
        head.bias.normal_()
    spec = HEADS["lrbp"]
    assert spec.needs_num_classes
    assert spec.scores_classes
    assert spec.loss == "hinge"
    x = torch.randn(2, c, 3, 3)
    pos = _positions(x)
    p_t = head.projection.detach().double().numpy()  # (m, c)
    u = head.factors.detach().double().numpy().reshape(k, r, m)  # U_k^T, rows: + then -
    ref = np.zeros((2, k))
    for b in range(2):
        y = pos[b].T @ pos[b] / pos.shape[1]  # (c, c)
        for cls in range(k):
            plus, minus = u[cls, : r // 2].T, u[cls, r // 2 :].T  # (m, r/2)
            w = plus @ plus.T - minus @ minus.T  # (m, m)
            ref[b, cls] = np.trace(w.T @ p_t @ y @ p_t.T)
    ref += head.bias.detach().double().numpy()
    np.testing.assert_allclose(head(x).detach().numpy(), ref, atol=1e-5)


def test_lrbp_scaled_square_root_comes_first() -> None:
    """Kong & Fowlkes' ``sign(x) sqrt(|x| / s)`` on the features, then the same classifier."""
    options = {"num_classes": 4, "projection_dim": 5, "rank": 4}
    plain = create_head("lrbp", 6, **options)
    rooted = create_head("lrbp", 6, **options, sqrt_scale=2e5, eps=0.0)
    rooted.load_state_dict(plain.state_dict())
    x = torch.randn(2, 6, 3, 3) * 100
    expected = plain(torch.sign(x) * torch.sqrt(x.abs() / 2e5))
    torch.testing.assert_close(rooted(x), expected)
    blank = torch.zeros(2, 6, 3, 3, requires_grad=True)  # with its eps the root has a gradient
    create_head("lrbp", 6, num_classes=4, sqrt_scale=2e5, projection_dim=5)(blank).sum().backward()
    assert blank.grad is not None
    assert torch.isfinite(blank.grad).all()


def test_lrbp_projection_from_gram_svd() -> None:
    head = created(LowRankBilinear, "lrbp", 6, num_classes=3, projection_dim=2)
    feats = torch.randn(10, 6, 4, 4) * torch.tensor([5.0, 1, 1, 1, 3, 1])[None, :, None, None]
    head.init_projection(feats)
    top = head.projection.detach().abs().argmax(dim=1).tolist()
    assert top == [0, 4]  # the two directions with the largest energy


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("lrbp", {"num_classes": 3, "rank": 3}, "rank must be an even number"),
        ("lrbp", {"num_classes": 3, "projection_dim": 99}, "projection_dim must be in"),
        ("mpn", {"iterations": 0}, "iterations must be >= 1"),
        ("deepo2p", {"eps": 0.0}, "eps must be > 0"),
        ("lrbp", {"num_classes": 3, "projection_dim": 4, "sqrt_scale": 0.0}, "sqrt_scale must be"),
        ("bp", {"vectorize": "lower"}, "valid values: full, triu"),
    ],
)
def test_bad_head_options_are_named(name: str, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create_head(name, 8, **options)


def test_bad_input_shape_is_named() -> None:
    with pytest.raises(ValueError, match="built for 8 channels, got 6"):
        create_head("bp", 8)(torch.randn(1, 6, 3, 3))


def test_vgg_fc_is_pool5_fc6_fc7_and_takes_torchvision_weights() -> None:
    head = created(VGGClassifierHead, "vgg_fc", 4, hidden=8, pool=2).eval()
    state = {
        "classifier.0.weight": torch.randn(8, 16),
        "classifier.0.bias": torch.randn(8),
        "classifier.3.weight": torch.randn(8, 8),
        "classifier.3.bias": torch.randn(8),
    }
    head.load_torchvision_classifier(state)
    x = torch.randn(2, 4, 4, 4)
    pooled = torch.nn.functional.max_pool2d(x, 2).flatten(1)  # 4x4 -> 2x2 = the 2x2 avg pool
    fc6 = torch.relu(pooled @ state["classifier.0.weight"].T + state["classifier.0.bias"])
    fc7 = torch.relu(fc6 @ state["classifier.3.weight"].T + state["classifier.3.bias"])
    torch.testing.assert_close(head(x), fc7)


@pytest.mark.parametrize("name", ["cbp_ts", "cbp_rm"])
def test_a_sketch_of_no_dimensions_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=r"the sketch's dimension d\) must be >= 1, got 0"):
        create_head(name, 8, dim=0)


def test_an_option_a_head_does_not_take_is_named_with_those_it_takes() -> None:
    with pytest.raises(HeadOptionError, match="head 'smso' has no option 'dimm'; its options: dim"):
        create_head("smso", 8, dimm=4)
    with pytest.raises(HeadOptionError, match="head 'smso': option dim must be a whole number"):
        create_head("smso", 8, dim="a")
