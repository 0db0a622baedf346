"""The confirmatory typicality evaluation (``python -m experiments.typicality_confirm``): DeLong's
test against its pairwise definition and a simulation, the glyphs and corruptions against their
formulas, the sets a model's classes give, and a quick run end to end on a tiny model trained on
8 of 10 synthetic classes."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from sklearn.metrics import roc_auc_score

from experiments.auroc import Comparison, compare, delong
from experiments.confirm_sets import CORRUPTIONS, FACES, LETTERS, corrupt, glyphs, shift_sets
from experiments.typicality import Card
from experiments.typicality_confirm import (
    BASELINES,
    METHODS,
    Model,
    image_sets,
    labelled_test_images,
    main,
    table,
    tally,
)
from modelcard.typicality import Typicality
from tests.training.conftest import write_fashion_mnist
from tests.training.test_fmnist_table_records import record as run_record
from tests.training.test_fmnist_table_records import val_accuracies

# --- DeLong's test ------------------------------------------------------------------------------


def _pairwise(positives: np.ndarray, negatives: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AUROCs and DeLong's covariance by the definition: every (positive, negative) pair."""
    psi = (positives[:, :, None] > negatives[:, None, :]) + 0.5 * (
        positives[:, :, None] == negatives[:, None, :]
    )  # (k, m, n)
    v10, v01 = psi.mean(axis=2), psi.mean(axis=1)
    m, n = positives.shape[1], negatives.shape[1]
    return psi.mean(axis=(1, 2)), np.cov(v10) / m + np.cov(v01) / n


def test_delong_matches_the_pairwise_definition_and_sklearn() -> None:
    rng = np.random.default_rng(0)
    # rounded scores: many ties, within and across the classes
    negatives = np.round(rng.normal(0, 1, (3, 70)), 1)
    positives = np.round(rng.normal([[0.3], [1.0], [0.0]], 1, (3, 50)), 1)
    aurocs, covariance = delong(positives, negatives)
    expected_aurocs, expected_covariance = _pairwise(positives, negatives)
    np.testing.assert_allclose(aurocs, expected_aurocs, rtol=1e-12)
    np.testing.assert_allclose(covariance, expected_covariance, rtol=1e-10, atol=1e-15)
    labels = np.r_[np.zeros(70), np.ones(50)]
    for k in range(3):
        auroc = roc_auc_score(labels, np.r_[negatives[k], positives[k]])
        assert aurocs[k] == pytest.approx(auroc, abs=1e-12)


def test_delong_variance_of_a_difference_matches_a_simulation() -> None:
    """Two correlated scores on 80 + 60 images, drawn 600 times: the spread of their AUROC
    difference is what DeLong's variance says, and its 95 % interval covers the true
    difference about 95 % of the time."""
    rng = np.random.default_rng(1)
    differences, variances, covered = [], [], 0
    truth = []
    for _ in range(600):
        shared_neg, shared_pos = rng.normal(0, 1, 80), rng.normal(1.0, 1, 60)
        negatives = np.stack([shared_neg + rng.normal(0, 0.7, 80), shared_neg])
        positives = np.stack([shared_pos + rng.normal(0, 0.7, 60), shared_pos + 0.4])
        aurocs, covariance = delong(positives, negatives)
        result = compare(aurocs, covariance, 0, 1)
        differences.append(result.difference)
        variances.append(covariance[0, 0] + covariance[1, 1] - 2 * covariance[0, 1])
        truth.append((result.low, result.high))
    true_difference = float(np.mean(differences))  # the simulation's own estimate
    covered = sum(low <= true_difference <= high for low, high in truth)
    assert np.var(differences) == pytest.approx(np.mean(variances), rel=0.2)
    assert 0.91 <= covered / 600 <= 0.98
    assert true_difference < -0.05  # the second score separates better: a real difference


def test_verdicts_follow_the_interval() -> None:
    assert Comparison(0.02, 0.01, 0.03).verdict == "win"
    assert Comparison(-0.02, -0.03, -0.01).verdict == "loss"
    assert Comparison(0.01, -0.01, 0.03).verdict == "tie"
    aurocs, covariance = np.array([0.9, 0.9]), np.zeros((2, 2))
    assert compare(aurocs, covariance, 0, 1).to_dict() == {
        "difference": 0.0,
        "ci95": [0.0, 0.0],
        "verdict": "tie",
    }
    with pytest.raises(ValueError, match="at least 2 of each class"):
        delong(np.zeros((1, 1)), np.zeros((1, 5)))


# --- the sets -----------------------------------------------------------------------------------


def test_glyphs_are_letters_drawn_bright_on_black_and_repeatable() -> None:
    letters = glyphs(per_glyph=2, seed=0, letters="AgQ")
    assert letters.shape == (len(FACES) * 3 * 2, 28, 28)
    assert letters.dtype == np.uint8
    np.testing.assert_array_equal(letters, glyphs(per_glyph=2, seed=0, letters="AgQ"))
    assert not np.array_equal(letters, glyphs(per_glyph=2, seed=1, letters="AgQ"))
    # a 2-pixel black frame, ink inside, at the drawn brightness
    frame = np.ones((28, 28), bool)
    frame[2:-2, 2:-2] = False
    assert letters[:, frame].max() == 0
    ink = (letters > 0).sum(axis=(1, 2))
    assert ink.min() >= 20
    assert (letters.max(axis=(1, 2)) >= 100).all()
    assert len(LETTERS) == 52


def test_every_face_draws_every_letter_differently() -> None:
    one = glyphs(per_glyph=1, seed=0, letters="Rk")  # (faces x 2, 28, 28)
    flat = one.reshape(len(one), -1)
    assert len({row.tobytes() for row in flat}) == len(one)


def _grey(value: int, count: int = 4) -> np.ndarray:
    return np.full((count, 28, 28), value, np.uint8)


def test_corruptions_follow_their_formulas() -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(60, 200, (6, 28, 28)).astype(np.uint8)
    x = images / 255
    # contrast: (x - mean) s + mean, per image (no clipping inside 60..200)
    for severity, s in ((1, 0.75), (3, 0.4), (5, 0.15)):
        mean = x.mean(axis=(1, 2), keepdims=True)
        expected = np.round(((x - mean) * s + mean) * 255)
        np.testing.assert_array_equal(corrupt(images, "contrast", severity), expected)
    # noise: the added values have the level's standard deviation (in 1/255 units)
    for severity, s in ((1, 0.04), (5, 0.10)):
        added = corrupt(_grey(128, 40), "gaussian_noise", severity).astype(float) - 128
        assert added.std() == pytest.approx(s * 255, rel=0.03)
        assert abs(added.mean()) < 0.5
    # blur: a constant image stays, one bright pixel spreads as a Gaussian of the level's sigma
    np.testing.assert_array_equal(corrupt(_grey(90), "gaussian_blur", 5), _grey(90))
    dot = np.zeros((1, 28, 28), np.uint8)
    dot[0, 14, 14] = 255
    for severity, sigma in ((3, 0.7), (5, 1.0)):
        spread = corrupt(dot, "gaussian_blur", severity)[0].astype(float)
        rows = np.arange(28) - 14
        weights = spread.sum(axis=1) / spread.sum()
        assert np.sqrt((weights * rows**2).sum()) == pytest.approx(sigma, rel=0.1)
    # JPEG: a stronger level moves the images further; each image separately
    errors = [np.abs(corrupt(images, "jpeg", s).astype(float) - images).mean() for s in (1, 3, 5)]
    assert 0 < errors[0] < errors[1] < errors[2]
    np.testing.assert_array_equal(corrupt(images[:1], "jpeg", 3), corrupt(images, "jpeg", 3)[:1])


def test_bad_corruptions_are_named() -> None:
    with pytest.raises(ValueError, match="unknown corruption 'fog'"):
        corrupt(_grey(0), "fog", 1)
    with pytest.raises(ValueError, match="severity must be 1 to 5"):
        corrupt(_grey(0), "jpeg", 6)
    names = list(shift_sets(_grey(100, 2)))
    assert names == [f"{c}-{s}" for c in CORRUPTIONS for s in (1, 3, 5)]


def test_the_sets_of_a_model_trained_on_some_classes() -> None:
    test = np.arange(40 * 28 * 28, dtype=np.int64).reshape(40, 28, 28).astype(np.uint8)
    test[:, 0, 0] = np.arange(40)  # each image told apart by its first pixel
    labels = np.arange(40) % 10
    args = argparse.Namespace(quick=False, glyphs_per_letter=1, set_size=0)
    held_out = Model("held_out", Path("m.onnx"), {"classes": [0, 1, 2, 3, 4, 5, 8, 9]})
    ids, ood, shift = image_sets(held_out, test, labels, args)
    assert list(ood) == ["held_out_classes", "glyphs"]
    np.testing.assert_array_equal(ood["held_out_classes"][:, 0, 0], [6, 7, 16, 17, 26, 27, 36, 37])
    np.testing.assert_array_equal(ids["held_out_labels"], [6, 7, 6, 7, 6, 7, 6, 7])
    assert len(ids["test"]) == 32
    kept = ids["test"][:, 0, 0] % 10
    np.testing.assert_array_equal(
        ids["test_labels"], np.searchsorted([0, 1, 2, 3, 4, 5, 8, 9], kept)
    )
    assert all(len(v) == 32 for v in shift.values())
    shipped = Model("shipped", Path("m.onnx"), {"classes": None})
    ids, ood, _ = image_sets(shipped, test, labels, args)
    assert list(ood) == ["glyphs"]
    assert "held_out_labels" not in ids
    np.testing.assert_array_equal(ids["test_labels"], labels)
    quick = argparse.Namespace(quick=True, glyphs_per_letter=1, set_size=5)
    ids, ood, _ = image_sets(held_out, test, labels, quick)  # the labels drawn with the images
    np.testing.assert_array_equal(ood["held_out_classes"][:, 0, 0] % 10, ids["held_out_labels"])
    np.testing.assert_array_equal(
        np.searchsorted([0, 1, 2, 3, 4, 5, 8, 9], ids["test"][:, 0, 0] % 10), ids["test_labels"]
    )


# --- end to end ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_quick_run_on_a_tiny_held_out_model(tmp_path: Path, capsys: pytest.CaptureFixture):
    """Train 1 epoch on 8 of 10 synthetic classes, export, serve, score every set."""
    from export.onnx_export import export_checkpoint
    from training.config import TrainConfig
    from training.train import fit

    data = write_fashion_mnist(tmp_path / "fmnist", 600, 200)
    run = tmp_path / "run"
    fit(
        TrainConfig(
            dataset="fashion_mnist",
            data_root=str(data),
            classes=[0, 1, 2, 3, 4, 5, 8, 9],
            val_size=300,  # a features term needs 2 x 128 validation images
            head_options={"dim": 8},
            reduce_dim=8,
            epochs=1,
            batch_size=32,
            workers=0,
            channels_last=False,
            out=str(run),
        )
    )
    export_checkpoint(run / "best.pt", run / "model.onnx")
    out = tmp_path / "confirm.json"
    argv = ["--held-out", str(run), "--no-shipped", "--data-root", str(data), "--quick"]
    markdown = tmp_path / "confirmation.md"
    assert main([*argv, "--set-size", "120", "--out", str(out), "--markdown", str(markdown)]) == 0
    result = json.loads(out.read_text())

    model = result["models"]["held_out"]
    assert model["classes"] == [0, 1, 2, 3, 4, 5, 8, 9]
    assert model["test_images"] == 120  # of the 160 test images of the 8 classes
    assert model["validation_images"] == 300
    assert model["served_vs_in_process_logits_max_difference"] < 1e-4
    assert model["served_vs_numpy_score_max_difference"] < 1e-2
    sets = model["sets"]
    assert [k for k, v in sets.items() if v["kind"] == "ood"] == ["held_out_classes", "glyphs"]
    assert sets["held_out_classes"]["images"] == 40  # the 20 Shirt and 20 Sneaker test images
    parts = {k: v["images"] for k, v in sets.items() if v["kind"] == "by_class"}
    assert list(parts) == ["held_out_classes: Shirt", "held_out_classes: Sneaker"]
    assert sum(parts.values()) == 40
    assert result["wins_losses_ties"]["held_out"]["msp"] == tally(model)["msp"]
    assert sum(tally(model)["msp"].values()) == 2  # the two OOD sets, not the classes
    assert len([k for k, v in sets.items() if v["kind"] == "shift"]) == 12
    for name, entry in sets.items():
        assert list(entry["methods"]) == list(METHODS), name
        for method, row in entry["methods"].items():
            assert 0.0 <= row["auroc"] <= 1.0, (name, method)
        for baseline in BASELINES:
            verdict = entry["versus"][baseline]
            low, high = verdict["ci95"]
            assert low <= verdict["difference"] <= high, (name, baseline)
            assert verdict["verdict"] in ("win", "loss", "tie")
        assert ("accuracy" in entry) == (entry["kind"] == "shift")
    # the held-out classes' AUROCs again, from the file in this process and the card's
    # statistics, with the distances written out in full (P = alpha I + U diag(w) U^T)
    args = argparse.Namespace(quick=True, glyphs_per_letter=1, set_size=120)
    held_out = Model.read("held_out", run)
    ids, ood, _ = image_sets(held_out, *labelled_test_images(data), args)
    card = Card.read(held_out.path)
    typicality = Typicality.from_card(card.raw["typicality"])
    session = onnxruntime.InferenceSession(str(held_out.path), providers=["CPUExecutionProvider"])
    within, means = typicality.feature_within, typicality.feature_means
    assert within is not None
    assert means is not None
    q = within.alpha * np.eye(len(within.basis)) + within.basis @ np.diag(within.weights) @ (
        within.basis.T
    )
    scores = {}
    for name, images in (("id", ids["test"]), ("ood", ood["held_out_classes"])):
        logits, embedding, features = session.run(
            ["logits", "embedding", "features"], {"image": card.preprocess(images)}
        )
        centred = features[:, None, :] - means[None]  # (N, K, C)
        lee = np.einsum("nkc,cd,nkd->nk", centred, q, centred).min(axis=1)
        scores[name] = (typicality.score(logits, embedding, features), lee)
    labels = np.r_[np.zeros(len(ids["test"])), np.ones(len(ood["held_out_classes"]))]
    for k, method in enumerate(("typicality", "mahalanobis_features")):
        expected = roc_auc_score(labels, np.r_[scores["id"][k], scores["ood"][k]])
        got = sets["held_out_classes"]["methods"][method]["auroc"]
        assert got == pytest.approx(expected, abs=0.01), method
    assert result["wins_losses_ties"]["held_out"] == tally(model)
    assert result["primary"] == [["held_out", "held_out_classes"], ["shipped", "glyphs"]]
    printed = capsys.readouterr().out
    assert "| **held_out_classes**" in printed
    assert "gaussian_blur-5 (shift)" in printed
    tables = printed.split("\nResults written to ")[0]  # the JSON's path comes last
    assert markdown.read_text().strip() == tables.strip()


# --- the published results ----------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results"
RECORDS = DOCS / "records"


def _rows(page: str, label: str) -> list[str]:
    """The cells after the first of the table row of ``page`` that starts with ``| label``."""
    row = next(line for line in page.splitlines() if line.startswith(f"| {label}"))
    return [cell.strip() for cell in row.split("|")[2:-1]]


def test_the_published_tables_are_the_records() -> None:
    """typicality-confirmation.md prints the tables of its JSON record verbatim, and
    typicality.md's summary rows (AUROCs and verdicts) and the README's AUROCs are the
    record's."""
    record = json.loads((RECORDS / "typicality-confirmation.json").read_text())
    page = (DOCS / "typicality-confirmation.md").read_text()
    assert table(record).strip() in page
    sets = {role: model["sets"] for role, model in record["models"].items()}
    quoted = [
        ("held_out", "held_out_classes", "unseen classes: Shirt and Sneaker"),
        ("shipped", "glyphs", "typeset letters (shipped model)"),
    ]
    summary = (DOCS / "typicality.md").read_text()
    for role, name, label in quoted:
        methods, versus = sets[role][name]["methods"], sets[role][name]["versus"]
        cells = [cell.strip("*") for cell in _rows(summary, label)]
        assert cells[0] == f"{methods['typicality']['auroc']:.3f}"
        for cell, baseline in zip(cells[1:], BASELINES, strict=True):
            verdict = versus[baseline]["verdict"]
            assert cell.replace("*", "") == f"{methods[baseline]['auroc']:.3f} ({verdict})"
    readme = (DOCS.parents[1] / "README.md").read_text()
    for role, name, method in [
        ("shipped", "glyphs", "typicality"),
        ("held_out", "held_out_classes", "typicality"),
        ("held_out", "held_out_classes", "msp"),
    ]:
        assert f"{sets[role][name]['methods'][method]['auroc']:.3f}" in readme
    assert record["primary"] == [["held_out", "held_out_classes"], ["shipped", "glyphs"]]
    assert not record["quick"]


def test_the_second_run_repeats_every_entry_of_the_first() -> None:
    """The pre-registered run (first record) and the run that added the exploratory classes
    (second record, the one quoted) agree on every entry the first has."""
    first = json.loads((RECORDS / "typicality-confirmation-first-run.json").read_text())
    second = json.loads((RECORDS / "typicality-confirmation.json").read_text())
    assert first["commit"] != second["commit"]
    assert first["wins_losses_ties"] == second["wins_losses_ties"]
    for role, model in first["models"].items():
        again = second["models"][role]
        assert {k: v for k, v in again.items() if k != "sets"} == {
            k: v for k, v in model.items() if k != "sets"
        }
        added = {k for k, v in again["sets"].items() if v["kind"] == "by_class"}
        assert set(again["sets"]) - added == set(model["sets"])
        for name, entry in model["sets"].items():
            assert again["sets"][name] == entry, (role, name)


def test_the_pages_own_tables_are_the_records() -> None:
    """typicality-confirmation.md's hand-set tables (the primary AUROCs with the best in bold,
    DeLong's differences and intervals, the covariate-shift tallies, the exploratory classes)
    and its tally sentence, rebuilt from the JSON record without the study's formatting."""
    record = json.loads((RECORDS / "typicality-confirmation.json").read_text())
    page = (DOCS / "typicality-confirmation.md").read_text().split("### The tables as printed")[0]
    sets = {role: model["sets"] for role, model in record["models"].items()}
    primary = [
        ("held_out", "held_out_classes", "held-out model, **held-out classes** (near-OOD; "),
        ("shipped", "glyphs", "shipped model, **glyphs** (far-OOD; "),
        ("held_out", "held_out_classes: Shirt", "Shirt ("),
        ("held_out", "held_out_classes: Sneaker", "Sneaker ("),
    ]
    for role, name, label in primary:
        entry = sets[role][name]
        assert f"| {label}{entry['images']:,} images)" in page
        aurocs = [entry["methods"][method]["auroc"] for method in METHODS]
        expected = [f"{value:.3f}" for value in aurocs]
        best = max(range(len(aurocs)), key=aurocs.__getitem__)
        expected[best] = f"**{expected[best]}**"
        assert _rows(page, label) == expected, name
    verdicts = {"win": 0, "loss": 0, "tie": 0}
    for role, name, label in [
        ("held_out", "held_out_classes", "held-out model, held-out classes"),
        ("shipped", "glyphs", "shipped model, glyphs"),
    ]:
        for cell, baseline in zip(_rows(page, label), BASELINES, strict=True):
            versus = sets[role][name]["versus"][baseline]
            low, high = versus["ci95"]
            verdict = "win" if low > 0 else "loss" if high < 0 else "tie"
            assert verdict == versus["verdict"]
            verdicts[verdict] += 1
            want = f"{verdict}: {versus['difference']:+.3f} [{low:.3f}, {high:.3f}]"
            assert cell.replace("*", "") == want, (name, baseline)
    assert (
        f"Of the 8 primary comparisons, the served score wins {verdicts['win']}, ties "
        f"{verdicts['tie']} (energy, near-OOD) and loses {verdicts['loss']}"
    ) in re.sub(r"\s+", " ", page)
    for role, label in [("held_out", "held-out |"), ("shipped", "shipped |")]:
        shift = [entry for entry in sets[role].values() if entry["kind"] == "shift"]
        assert len(shift) == 12
        cells = []
        for baseline in BASELINES:
            count = {v: sum(e["versus"][baseline]["verdict"] == v for e in shift) for v in verdicts}
            signs = zip(("win", "loss", "tie"), "+-=", strict=True)
            cells.append(", ".join(f"{count[v]} {sign}" for v, sign in signs if count[v]))
        assert _rows(page, label) == cells, role


def test_the_held_out_models_records_are_the_model_evaluated() -> None:
    """docs/results/records/typicality-heldout holds the file the record scored (its sha256),
    the run that made it (the classes, the test pass), its best.pt at the first validation
    arg-max, and the page quotes those records."""
    models = json.loads((RECORDS / "typicality-confirmation.json").read_text())["models"]
    record = models["held_out"]
    folder = RECORDS / "typicality-heldout"
    assert hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest() == record["sha256"]
    config = run_record(folder, "config.json")
    assert config["classes"] == record["classes"] == [0, 1, 2, 3, 4, 5, 8, 9]
    test = run_record(folder, "test.json")
    assert test["test_accuracy"] == record["test_accuracy"]
    accuracies = val_accuracies(folder)  # epochs 1, 2, ... in order
    best = max(accuracies)
    epoch = 1 + accuracies.index(best)  # the first of ties
    assert test["epoch"] == epoch
    assert test["recalibration"]["val_accuracy_before"] == best
    page = re.sub(r"\s+", " ", (DOCS / "typicality-confirmation.md").read_text())
    after = test["recalibration"]["val_accuracy_after"]
    assert (
        f"best validation accuracy was {100 * best:.2f} % (epoch {epoch}; "
        f"{100 * after:.2f} % after Sigma's re-estimation, which was kept)"
    ) in page
    assert test["recalibration"]["kept"]
    assert f"**{100 * test['test_accuracy']:.2f} %** on the {record['test_images']:,} test" in page
