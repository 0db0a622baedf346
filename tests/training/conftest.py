"""Fixtures for training tests: a tiny Fashion-MNIST in Debian's idx layout."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array as an idx file (gzip-compressed when the name ends in .gz)."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def learnable_images(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """28x28 grey images whose class (0-9) is a bright horizontal band at row 2k + 4, plus noise."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % 10
    images = rng.integers(0, 60, size=(count, 28, 28))
    for i, k in enumerate(labels):
        images[i, 2 * k + 4 : 2 * k + 6, 4:24] = 220
    return images.astype(np.uint8), labels.astype(np.uint8)


def write_fashion_mnist(root: Path, n_train: int, n_test: int, gz: bool = True) -> Path:
    """A Fashion-MNIST folder in Debian's layout with learnable synthetic images."""
    root.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    for prefix, count, seed in (("train", n_train, 1), ("t10k", n_test, 2)):
        images, labels = learnable_images(count, seed)
        write_idx(root / f"{prefix}-images-idx3-ubyte{suffix}", images)
        write_idx(root / f"{prefix}-labels-idx1-ubyte{suffix}", labels)
    return root


@pytest.fixture(scope="session")
def tiny_fashion_mnist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 training and 60 test images."""
    return write_fashion_mnist(tmp_path_factory.mktemp("fmnist"), 200, 60)
