"""Typicality: the score's maths against a direct computation, its card round trip, the drift
test, and what the service answers with the shipped model (whose card has a reference)."""

from __future__ import annotations

import base64
import io
import json
import logging

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

from modelcard.typicality import Precision, Typicality, encode_array, energy
from service.models.drift import RARE, DriftMonitor, binomial_tail
from service.models.scoring import scored
from service.runtime.backend import OnnxBackend
from service.runtime.outputs import BackendOutputs
from service.runtime.runner import Batch

from .conftest import FASHION_MNIST as DEFAULT_ROOT
from .conftest import read_idx

pytest.importorskip("scipy", reason="the drift test's reference is scipy's (dev extra)")
pytest.importorskip("torch", reason="the reference is fitted by export, which needs torch")
from scipy import stats

from export import typicality as export_typicality
from export.typicality import fit


def outputs(n: int, p: int = 6, classes: int = 3, seed: int = 0):
    """Logits (n, classes), embeddings (n, p) around a mean per class, and labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    centres = rng.normal(0, 3, (classes, p))
    mixing = rng.normal(0, 1, (p, p))
    embedding = centres[labels] + rng.normal(0, 1, (n, p)) @ mixing
    logits = rng.normal(0, 1, (n, classes)) + 4 * np.eye(classes)[labels]
    return logits, embedding, labels


def ridged_inverse(covariance: np.ndarray) -> np.ndarray:
    p = covariance.shape[0]
    return np.linalg.inv(covariance + 1e-3 * np.trace(covariance) / p * np.eye(p))


def test_the_score_is_the_sum_of_three_standardised_terms_computed_directly():
    logits, z, labels = outputs(400)
    reference = fit(logits, z, labels)
    new_logits, new_z, _ = outputs(7, seed=1)
    # the definitions, written out
    mu = z.mean(0)
    inv = ridged_inverse(np.cov(z, rowvar=False))
    classes = np.unique(labels)
    means = np.stack([z[labels == c].mean(0) for c in classes])
    within = z - means[labels]
    inv_w = ridged_inverse(within.T @ within / (len(z) - len(classes)))

    def terms(lg, x):
        m_class = np.array([min((v - m) @ inv_w @ (v - m) for m in means) for v in x])
        m_all = np.array([(v - mu) @ inv @ (v - mu) for v in x])
        e = -np.log(np.exp(lg).sum(1))
        return np.stack([np.log(m_class), np.log(m_all), e], 1)

    a, b = terms(logits, z).mean(0), terms(logits, z).std(0)
    want = ((terms(new_logits, new_z) - a) / b).sum(1)
    np.testing.assert_allclose(reference.score(new_logits, new_z), want, rtol=1e-6, atol=1e-6)
    # the reference images' own p-values: the k-th most atypical of n gets (1 + k) / (n + 1)
    own = np.sort(reference.p_value(reference.score(logits, z)))
    np.testing.assert_allclose(own, (1 + np.arange(1, 401)) / 401, atol=1e-9)


def test_the_card_round_trip_keeps_every_score_and_p_value():
    logits, z, labels = outputs(300)
    reference = fit(logits, z, labels)
    card = json.loads(json.dumps(reference.to_card()))  # what a model card carries
    again = Typicality.from_card(card)
    new_logits, new_z, _ = outputs(20, seed=5)  # not the reference images: no ties with them
    scores = reference.score(new_logits, new_z)
    np.testing.assert_allclose(again.score(new_logits, new_z), scores, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(again.p_value(scores), reference.p_value(scores))
    assert card["images"] == 300
    assert card["embedding_dim"] == 6


def test_a_large_embedding_gets_a_low_rank_precision(monkeypatch):
    """Above FULL_RANK_MAX dimensions: probabilistic PCA, P = I / s2 + U diag(1/l - 1/s2) U^T."""
    monkeypatch.setattr(export_typicality, "FULL_RANK_MAX", 4)
    logits, z, labels = outputs(500, p=10)
    reference = fit(logits, z, labels)
    precision = reference.precision
    assert precision.basis.shape == (10, 4)
    assert precision.alpha > 0
    dense = precision.alpha * np.eye(10) + precision.basis @ np.diag(precision.weights) @ (
        precision.basis.T
    )
    x, centres = z[:5], z[5:8]
    want = np.array([[(v - c) @ dense @ (v - c) for c in centres] for v in x])
    np.testing.assert_allclose(precision.distances(x, centres), want, rtol=1e-9)
    # the kept directions are the covariance's top four, with their own variances
    values = np.linalg.eigvalsh(
        np.cov(z, rowvar=False) + 1e-3 * np.trace(np.cov(z, rowvar=False)) / 10 * np.eye(10)
    )
    np.testing.assert_allclose(  # fit returns the statistics as the card stores them: float32
        np.sort(1 / (precision.weights + precision.alpha)), values[-4:], rtol=1e-6
    )


def test_distances_match_the_quadratic_form():
    rng = np.random.default_rng(3)
    basis, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    precision = Precision(0.0, basis, rng.uniform(0.5, 2, 5))
    dense = basis @ np.diag(precision.weights) @ basis.T
    x, c = rng.normal(size=(4, 5)), rng.normal(size=(3, 5))
    want = np.array([[(v - m) @ dense @ (v - m) for m in c] for v in x])
    np.testing.assert_allclose(precision.distances(x, c), want, rtol=1e-9)


def test_energy_is_stable_for_large_logits():
    logits = np.array([[1000.0, 999.0], [-5.0, -7.0]])
    want = [-(1000 + np.log1p(np.exp(-1.0))), -(-5 + np.log1p(np.exp(-2.0)))]
    np.testing.assert_allclose(energy(logits), want)


def test_a_card_section_of_another_format_or_inconsistent_is_refused():
    logits, z, labels = outputs(100)
    card = fit(logits, z, labels).to_card()
    with pytest.raises(ValueError, match="format"):
        Typicality.from_card(card | {"format": 99})
    with pytest.raises(ValueError, match="inconsistent"):
        Typicality.from_card(card | {"class_means": encode_array(np.zeros((3, 5)))})
    with pytest.raises(ValueError, match="unreadable"):
        Typicality.from_card({"format": 1})
    with pytest.raises(ValueError, match="too few"):
        fit(logits[:5], z[:5], labels[:5])


def test_a_class_with_one_validation_image_gets_no_reference_and_is_named():
    """An image alone in its class is that class's mean, at distance 0: its log is rounding
    noise and would set the term's spread for every image, so fit refuses and says which."""
    logits, z, labels = outputs(100)
    labels = labels.copy()
    labels[labels == 2] = 1
    labels[7] = 2  # class 2 now holds one image
    with pytest.raises(ValueError, match=r"at least 2 validation images .*\(class 2: 1 image"):
        fit(logits, z, labels)
    with pytest.raises(ValueError, match=r"\(class 2 \(Pullover\): 1 image"):
        fit(logits, z, labels, class_names=["T-shirt/top", "Trouser", "Pullover"])
    labels[8] = 2
    assert fit(logits, z, labels).class_means.shape == (3, 6)


# --- drift ------------------------------------------------------------------------------------


def test_the_binomial_tail_is_scipys():
    tail = binomial_tail(200, RARE)
    want = stats.binom.sf(np.arange(201) - 1, 200, RARE)
    np.testing.assert_allclose(tail, want, rtol=1e-9, atol=1e-280)  # scipy's tail ends at 0


def test_the_monitor_alarms_on_rare_images_once_and_recovers(caplog):
    reports = []
    monitor = DriftMonitor("m (1)", 200, 1e-7, lambda *r: reports.append(r))
    typical = np.full(200, 0.5)
    monitor.observe(typical)
    assert not monitor.alarm
    assert reports[-1] == (pytest.approx(1.0), 200, False)
    with caplog.at_level(logging.INFO, logger="service"):
        monitor.observe(np.full(13, 0.001))  # 13 of the last 200: P[B >= 13] > 1e-7
        assert not monitor.alarm
        monitor.observe(np.full(1, 0.001))  # 14: below
        assert monitor.alarm
        assert reports[-1][1:] == (200, True)
        assert reports[-1][0] == pytest.approx(stats.binom.sf(13, 200, RARE))
        monitor.observe(np.full(3, 0.001))  # still alarmed: no second warning
        monitor.observe(typical)  # the rare ones slide out
    assert not monitor.alarm
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "drift: model m (1): 14 of its last 200 images" in warnings[0].getMessage()
    assert any("drift over" in r.getMessage() for r in caplog.records)


# --- the service ------------------------------------------------------------------------------


def fmnist_png(index: int) -> bytes:
    pixels = read_idx(DEFAULT_ROOT / "t10k-images-idx3-ubyte.gz")[index]
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def noise_png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (28, 28), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def backend(shipped_model: str) -> OnnxBackend:
    return OnnxBackend(shipped_model)


def test_the_shipped_model_carries_a_reference_from_its_validation_images(backend):
    section = backend.card_dict["typicality"]
    assert section["images"] == 5000
    assert section["embedding_dim"] == 64
    reference = Typicality.from_card(section)
    assert reference.class_means.shape == (10, 64)


def test_classify_and_embed_answer_each_images_typicality(make_client, backend):
    client = make_client(backend)
    files = [
        ("file", ("boot.png", fmnist_png(0), "image/png")),
        ("file", ("noise.png", noise_png(0), "image/png")),
    ]
    classify = client.post("/classify", files=files).json()["results"]
    embed = client.post("/embed", files=files).json()["results"]
    for results in (classify, embed):
        boot, noise = (r["typicality"] for r in results)
        assert noise["score"] > boot["score"]
        assert noise["p_value"] < 0.01 < boot["p_value"]
    assert classify[0]["typicality"] == embed[0]["typicality"]
    metadata = client.get("/metadata").json()
    assert metadata["typicality"] is True
    assert metadata["card"]["typicality"]["reference_images"] == 5000
    assert "mean" not in metadata["card"]["typicality"]  # the arrays stay in the file
    oip = client.get(f"/v2/models/{metadata['model']['name']}").json()
    assert {"name": "typicality", "datatype": "FP32", "shape": [-1]} in oip["outputs"]


def test_the_protocol_answers_typicality_outputs_asked_for_by_name(make_client, backend):
    client = make_client(backend)
    name = client.get("/metadata").json()["model"]["name"]
    body = {
        "inputs": [
            {
                "name": "image_bytes",
                "datatype": "BYTES",
                "shape": [2],
                "data": [base64.b64encode(f).decode() for f in (fmnist_png(1), noise_png(1))],
            }
        ],
        "outputs": [{"name": "typicality"}, {"name": "typicality_p_value"}],
    }
    answer = client.post(f"/v2/models/{name}/infer", json=body).json()
    scores, p_values = (o["data"] for o in answer["outputs"])
    assert [o["name"] for o in answer["outputs"]] == ["typicality", "typicality_p_value"]
    assert scores[1] > scores[0]
    classify = client.post("/classify", files=[("file", ("a.png", fmnist_png(1), "image/png"))])
    assert classify.json()["results"][0]["typicality"]["p_value"] == pytest.approx(
        p_values[0], abs=1e-6
    )


def test_without_a_reference_or_with_scoring_off_there_is_no_typicality(make_client, backend):
    fake = make_client()  # a backend whose card has no reference
    files = [("file", ("a.png", fmnist_png(2), "image/png"))]
    assert "typicality" not in fake.post("/classify", files=files).json()["results"][0]
    name = fake.get("/metadata").json()["model"]["name"]
    body = {
        "inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [1], "data": ["AA=="]}],
        "outputs": [{"name": "typicality"}],
    }
    refused = fake.post(f"/v2/models/{name}/infer", json=body)
    assert refused.status_code == 400
    assert "unknown output 'typicality'; outputs: logits, embedding" in refused.json()["error"]
    off = make_client(backend, typicality=False)
    assert "typicality" not in off.post("/classify", files=files).json()["results"][0]
    assert "smso_drift_p_value{" not in off.get("/metrics").text


def alarm(metrics: str) -> float:
    line = next(li for li in metrics.splitlines() if li.startswith("smso_drift_alarm{"))
    return float(line.rsplit(" ", 1)[1])


def test_out_of_distribution_traffic_raises_the_drift_alarm(make_client, backend, caplog):
    client = make_client(backend, drift_window=20, drift_alarm_p=1e-4)
    typical = [("file", (f"{i}.png", fmnist_png(i), "image/png")) for i in range(20)]
    client.post("/classify", files=typical)
    metrics = client.get("/metrics").text
    assert "smso_drift_alarm{" in metrics
    assert 'smso_drift_window{model="fashion_mnist-small_cnn-smso"' in metrics
    assert alarm(metrics) == 0.0
    noisy = [("file", (f"n{i}.png", noise_png(i), "image/png")) for i in range(6)]
    with caplog.at_level(logging.WARNING, logger="service"):
        client.post("/classify", files=noisy)
    metrics = client.get("/metrics").text
    assert alarm(metrics) == 1.0
    assert any(
        r.getMessage().startswith("drift: model fashion_mnist-small_cnn-smso")
        for r in caplog.records
    )
    assert "smso_typicality_score_count{" in metrics


def test_a_features_term_is_a_fourth_class_conditional_distance():
    """Where the file has the backbone's averaged features, the score adds their
    class-conditional Mahalanobis term, standardised like the others; it needs them."""
    logits, z, labels = outputs(400)
    features = np.random.default_rng(7).normal(size=(400, 5)) + 2.0 * np.eye(5)[labels % 5]
    reference = Typicality.from_card(
        json.loads(json.dumps(fit(logits, z, labels, features).to_card()))
    )
    assert reference.uses_features
    assert reference.standardise.shape == (4, 2)
    three = fit(logits, z, labels)
    terms = reference.terms(logits[:9], z[:9], features[:9])
    np.testing.assert_allclose(terms[:, :3], three.terms(logits[:9], z[:9]), rtol=1e-5)
    means = np.stack([features[labels == c].mean(0) for c in range(3)])
    within = features - means[labels]
    inv = ridged_inverse(within.T @ within / (400 - 3))
    want = [np.log(min((f - m) @ inv @ (f - m) for m in means)) for f in features[:9]]
    np.testing.assert_allclose(terms[:, 3], want, rtol=1e-5)
    with pytest.raises(ValueError, match="features output"):
        reference.score(logits[:2], z[:2])


def test_the_service_serves_the_files_own_score_as_its_numpy_score(backend, shipped_model):
    """The shipped file computes its score: the service's p-values from it are those numpy
    gives from the file's logits, embedding and features."""
    typicality = Typicality.from_card(backend.card_dict["typicality"])
    assert backend.outputs == ["logits", "embedding", "typicality"]
    file = ort.InferenceSession(shipped_model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    images = np.concatenate([rng.random((6, 1, 28, 28)), np.zeros((2, 1, 28, 28))]).astype(
        np.float32
    )
    names = ["logits", "embedding", "typicality"]

    def own(x: Batch) -> BackendOutputs:
        logits, embedding, score = file.run(names, {"image": x})
        return BackendOutputs(logits=logits, embedding=embedding, typicality=score)

    def features(x: Batch) -> BackendOutputs:
        logits, embedding, pooled = file.run(["logits", "embedding", "features"], {"image": x})
        return BackendOutputs(logits=logits, embedding=embedding, features=pooled)

    got, want = scored(own, typicality)(images), scored(features, typicality)(images)
    assert got.typicality is not None
    assert want.typicality is not None
    np.testing.assert_allclose(got.typicality, want.typicality, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(got.p_value, want.p_value)
