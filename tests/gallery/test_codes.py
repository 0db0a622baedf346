"""The codes against numpy: the standardisation, int8 and bit codes, and their similarities."""

from __future__ import annotations

import numpy as np
import pytest

from gallery.codes import I8_RANGE, Codec, Dtype, Standardisation


def embeddings(n: int = 2_000, p: int = 16, seed: int = 0) -> np.ndarray:
    """SMSO-like embeddings: beta + gamma * N(0, 1) per dimension, the same beta and gamma
    (of ``p`` dimensions) whatever the ``seed`` of the draws."""
    shape = np.random.default_rng(p)
    beta, gamma = shape.normal(0, 3, p), shape.uniform(0.5, 2.0, p)
    draws = np.random.default_rng(seed).standard_normal((n, p))
    return (beta + gamma * draws).astype(np.float32)


def test_standardisation_undoes_each_dimensions_scale_and_shift():
    x = embeddings()
    fitted = Standardisation.fit(x)
    u = fitted.apply(x)
    np.testing.assert_allclose(u.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(u.std(axis=0), 1, atol=1e-4)
    np.testing.assert_allclose(fitted.threshold, np.median(u, axis=0), atol=1e-5)
    assert fitted.check.max_abs_skewness < 0.2
    assert fitted.check.max_abs_excess_kurtosis < 0.4
    assert fitted.check.beyond_i8_range < 1e-3


def test_a_constant_dimension_is_kept_finite():
    x = embeddings(100, 4)
    x[:, 2] = 7.0
    u = Standardisation.fit(x).apply(x)
    assert np.isfinite(u).all()
    np.testing.assert_array_equal(u[:, 2], 0.0)


def test_standardisation_round_trips_through_json():
    fitted = Standardisation.fit(embeddings())
    back = Standardisation.from_json(fitted.to_json(), 16)
    np.testing.assert_array_equal(back.center, fitted.center)
    np.testing.assert_array_equal(back.scale, fitted.scale)
    with pytest.raises(ValueError, match="is not 15 finite numbers"):
        Standardisation.from_json(fitted.to_json(), 15)
    broken = fitted.to_json() | {"scale": [0.0] * 16}
    with pytest.raises(ValueError, match="<= 0"):
        Standardisation.from_json(broken, 16)


def test_int8_codes_are_the_standardised_values_on_one_scale():
    x = embeddings()
    codec = Codec(Dtype.I8, Standardisation.fit(x))
    codes = codec.encode(x)
    u = codec.standardisation.apply(x)
    assert codes.dtype == np.int8
    want = np.clip(np.rint(u * 127 / I8_RANGE), -127, 127)
    np.testing.assert_array_equal(codes, want)


def test_bits_are_the_standardised_values_above_their_median_packed_for_usearch():
    x = embeddings(1_000, 20)
    codec = Codec(Dtype.B1, Standardisation.fit(x))
    codes = codec.encode(x)
    assert codes.shape == (1_000, 3)
    assert codes.dtype == np.uint8
    bits = np.unpackbits(codes, axis=1)[:, :20].astype(bool)
    np.testing.assert_array_equal(
        bits, codec.standardisation.apply(x) > codec.standardisation.threshold
    )
    assert abs(bits.mean() - 0.5) < 0.01  # the median splits each dimension in half


def test_similarities_from_usearchs_distances():
    codec = Codec(Dtype.F32, Standardisation.fit(embeddings(10, 8)))
    np.testing.assert_allclose(codec.similarity(np.array([0.0, 1.0, 2.0])), [1.0, 0.0, -1.0])
    bits = Codec(Dtype.B1, Standardisation.fit(embeddings(10, 8)))
    np.testing.assert_allclose(bits.similarity(np.array([0, 4, 8])), [1.0, 0.0, -1.0])


def test_normalised_galleries_normalise_their_queries():
    x = embeddings(200, 8)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    codec = Codec(Dtype.F32, Standardisation.fit(unit), normalized=True)
    np.testing.assert_allclose(codec.encode(x * 3.0), codec.encode(unit), atol=1e-5)


@pytest.mark.parametrize("dtype", list(Dtype))
def test_bytes_per_item(dtype):
    codes = Codec(dtype, Standardisation.fit(embeddings(10, 64))).encode(embeddings(10, 64))
    assert codes.nbytes // 10 == dtype.bytes_per_item(64)
