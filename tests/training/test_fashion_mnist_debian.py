"""The real Fashion-MNIST, as Debian's dataset-fashion-mnist installs it (``make data``)."""

from __future__ import annotations

import json
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


def test_the_shipped_model_classifies_real_test_images() -> None:
    """models/fashion-mnist-smso/model.pt rebuilds alone and agrees with its own test report."""
    root = Path(__file__).resolve().parents[2] / "models" / "fashion-mnist-smso"
    model, payload = load_model(root / "model.pt")
    assert payload["classes"] == CLASSES
    assert "optimizer" not in payload  # shipped slim
    report = json.loads((root / "test.json").read_text())
    splits, _ = load_splits("fashion_mnist", None)  # the preset's evaluation transform
    images = torch.stack([splits.test[i][0] for i in range(1000)])
    labels = tensors(splits.test).labels[:1000]
    with torch.no_grad():
        accuracy = (model(images).logits.argmax(1) == labels).float().mean().item()
    assert accuracy == pytest.approx(report["test_accuracy"], abs=0.03)
