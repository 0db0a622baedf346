"""The real Fashion-MNIST, as Debian's dataset-fashion-mnist installs it (``make data``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.training.conftest import tensors
from training.checkpoint import load_model
from training.datasets import load_splits
from training.datasets.fashion_mnist import CLASSES, DEFAULT_ROOT, fashion_mnist

pytestmark = pytest.mark.skipif(
    not (DEFAULT_ROOT / "t10k-labels-idx1-ubyte.gz").is_file(),
    reason="Debian's dataset-fashion-mnist is not installed (`make data` installs it)",
)


def test_the_real_splits() -> None:
    splits = fashion_mnist(val_size=5000, seed=0)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (55_000, 5_000, 10_000)
    assert splits.classes == CLASSES
    train_and_val = np.bincount(
        np.concatenate([tensors(splits.train).labels, tensors(splits.val).labels])
    )
    assert train_and_val.tolist() == [6000] * 10
    assert np.bincount(tensors(splits.test).labels.numpy()).tolist() == [1000] * 10
    image, label = splits.test[0]
    assert tuple(image.shape) == (1, 28, 28)
    assert label == 9  # the first test image is an ankle boot


def published_test_accuracy(path: Path) -> str:
    """The shipped model's test accuracy as ``path`` (README, the results page) prints it."""
    found = set(re.findall(r"\*\*(\d+\.\d+) % test accuracy\*\*", path.read_text()))
    assert len(found) == 1, f"{path}: {found}"
    return found.pop()


def test_the_shipped_model_scores_its_published_accuracy_on_the_whole_test_split() -> None:
    """models/fashion-mnist-smso/model.pt rebuilds alone and, on all 10,000 test images, gets
    exactly test.json's confusion matrix and the accuracy README and the results page publish:
    one image in 10,000 is the evaluation's resolution, and the smallest top-2 logit margin
    (about 2e-3) is far above float32 rounding, so nothing is tolerated."""
    root = Path(__file__).resolve().parents[2]
    shipped = root / "models" / "fashion-mnist-smso"
    model, payload = load_model(shipped / "model.pt")
    assert payload["classes"] == CLASSES
    assert "optimizer" not in payload  # shipped slim
    report = json.loads((shipped / "test.json").read_text())
    splits, _ = load_splits("fashion_mnist", None)  # the preset's evaluation transform
    labels = tensors(splits.test).labels
    predicted = []
    with torch.no_grad():
        for start in range(0, len(splits.test), 1000):
            images = torch.stack([splits.test[i][0] for i in range(start, start + 1000)])
            predicted.append(model(images).logits.argmax(1))
    predictions = torch.cat(predicted)
    correct = int((predictions == labels).sum())
    confusion = np.zeros((10, 10), np.int64)
    np.add.at(confusion, (labels.numpy(), predictions.numpy()), 1)
    assert len(labels) == report["test_images"] == 10_000
    assert confusion.tolist() == report["confusion"]
    assert correct == round(report["test_accuracy"] * 10_000)
    for page in (root / "README.md", root / "docs" / "results" / "fashion-mnist.md"):
        assert published_test_accuracy(page) == f"{correct / 100:.2f}"
