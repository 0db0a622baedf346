"""bench.search: the retrieval measures on cases worked by hand, the augmented images, and a
small run of the whole benchmark on real images through the shipped model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import search
from bench.lib import wrk
from bench.lib.augment import augmented
from bench.lib.retrieval import average_precision, precision, recall, self_found

GALLERY_LABELS = np.array([0, 0, 1, 1, 2])


def test_precision_counts_the_neighbours_with_the_querys_label():
    rows = np.array([[0, 1, 2], [2, 4, 3]])  # labels (0, 0, 1) and (1, 2, 1)
    assert precision(rows, GALLERY_LABELS, np.array([0, 1])) == pytest.approx(4 / 6)


def test_average_precision_weighs_each_hit_by_the_precision_at_its_rank():
    rows = np.array([[0, 2, 1], [4, 3, 0], [2, 3, 4]])
    # query 0 (label 0): hits at 1 and 3 -> (1/1 + 2/3) / 2; query 1 (label 1): a hit at 2 -> 1/2;
    # query 2 (label 0): no hit -> 0
    expected = ((1 + 2 / 3) / 2 + 1 / 2 + 0) / 3
    assert average_precision(rows, GALLERY_LABELS, np.array([0, 1, 0])) == pytest.approx(expected)


def test_recall_is_the_share_of_the_exact_neighbours_found():
    exact = np.array([[1, 2, 3], [4, 5, 6]])
    found = np.array([[3, 1, 9], [6, 5, 4]])
    assert recall(found, exact) == pytest.approx(5 / 6)
    rows, similarities = np.array([[0], [5], [2]]), np.array([[1.0], [1.0], [0.99]])
    assert self_found(rows, similarities, np.array([0, 1, 2]), 0.999) == pytest.approx(1 / 3)


def test_augmented_images_are_deterministic_and_unlike_their_source():
    train = np.random.default_rng(0).integers(0, 256, (10, 28, 28), dtype=np.uint8)
    first = augmented(train, 10, 5)
    assert first.shape == (5, 28, 28)
    assert first.dtype == np.uint8
    assert np.array_equal(first, augmented(train, 10, 5))
    assert np.array_equal(first[2], augmented(train, 12, 1)[0])  # image i is always the same
    assert not np.array_equal(first[0], train[0])


@pytest.mark.slow
def test_a_small_run_writes_every_section(tmp_path: Path):
    pytest.importorskip("faiss")
    out = tmp_path / "search.json"
    sizes = ["--sizes", "2500", "--quality-items", "2500", "--queries", "200"]
    sizes += ["--serve-rounds", "1", "--serve-seconds", "1"]
    argv = [*sizes, "--dtypes", "f32,b1", "--cache", str(tmp_path / "cache"), "--out", str(out)]
    assert search.main(argv) == 0
    results = json.loads(out.read_text())
    quality = results["quality"][0]
    assert quality["dimension"] == 64
    assert quality["top1_accuracy"] > 0.8
    assert quality["codes"]["f32"]["precision_at_10"] > 0.8
    assert quality["codes"]["f32"]["self_first_at_0_999"] == 1.0
    assert [row["items"] for row in results["crossover"]] == [500, 1000, 2000]
    codes = results["recall"][0]["codes"]
    assert set(codes) == {"f32", "b1", "faiss f32"}
    assert codes["f32"]["recall_at_10"] > 0.95
    assert codes["faiss f32"]["recall_at_10"] > 0.95
    assert codes["b1"]["recall_at_10_of_the_codes"] > codes["b1"]["recall_at_10"]
    assert all(code["rss_after_search_bytes"] > 0 for code in codes.values())
    if not wrk.available():
        assert "serve" not in results
        return
    served = results["serve"]
    assert served["self_retrieval"]["path"] == "train/00000.png"
    assert served["self_retrieval"]["similarity"] >= 0.999
    assert all(route["errors"] == 0 for route in served["routes"].values())
