"""Fixtures for training tests: a tiny Fashion-MNIST in Debian's idx layout, a tiny image folder."""

from __future__ import annotations

import gzip
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from training.datasets.base import LabelledImages
from training.datasets.fashion_mnist import TensorImages


def tensors(dataset: LabelledImages) -> TensorImages:
    """``dataset``, which Fashion-MNIST loads as :class:`TensorImages` (images and labels in
    memory)."""
    assert isinstance(dataset, TensorImages)
    return dataset


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


#: The generated image folder's classes, in the order smso-train numbers them (sorted names).
FOLDER_CLASSES = ("checks", "green_vertical", "noise", "red_horizontal")


def folder_image(name: str, rng: np.random.Generator, side: int = 40) -> np.ndarray:
    """A ``(side, side, 3)`` uint8 image of class ``name``: a colour and a pattern, with random
    brightness, period, phase and noise, so no two images are alike."""
    period = int(rng.integers(4, 9))
    phase = int(rng.integers(0, period))
    rows, cols = np.mgrid[:side, :side]
    base = rng.uniform(0.6, 1.0)
    if name == "red_horizontal":
        mask, colour = ((rows + phase) % period) < period // 2, (220, 50, 40)
    elif name == "green_vertical":
        mask, colour = ((cols + phase) % period) < period // 2, (50, 190, 60)
    elif name == "checks":
        mask = (((rows + phase) // period) + ((cols + phase) // period)) % 2 == 0
        colour = (60, 80, 210)
    else:
        mask, colour = rng.random((side, side)) < 0.5, (170, 170, 170)
    image = np.where(mask[..., None], np.array(colour) * base, 30.0)
    image = image + rng.normal(0, 20, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def write_image_folder(root: Path, per_class: int, test_per_class: int, seed: int = 0) -> Path:
    """An ImageFolder tree (train/<class>/, test/<class>/ of 40x40 PNGs) of ``FOLDER_CLASSES``."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", per_class), ("test", test_per_class)):
        for name in FOLDER_CLASSES:
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.fromarray(folder_image(name, rng)).save(folder / f"{i:03d}.png")
    return root


@pytest.fixture(scope="session")
def tiny_image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 classes of 75 training and 15 test images (300 + 60), 40x40 RGB."""
    return write_image_folder(tmp_path_factory.mktemp("folder"), 75, 15)


@pytest.fixture(scope="session")
def tiny_fashion_mnist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 training and 60 test images."""
    return write_fashion_mnist(tmp_path_factory.mktemp("fmnist"), 200, 60)


def _can_create_in(folder: Path) -> bool:
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False
    return True


@pytest.fixture
def read_only() -> Iterator[Callable[[Path], Path]]:
    """``read_only(folder)``: ``folder`` made a place this process cannot create files in, for
    the test: its write permission taken away or, for root (whom permissions do not stop),
    marked immutable (``chattr +i``); the test is skipped where neither works. Undone after."""
    undo: list[Callable[[], object]] = []

    def make(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        undo.append(lambda: folder.chmod(mode))
        if _can_create_in(folder) and shutil.which("chattr"):
            made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
            if made.returncode == 0:
                undo.append(lambda: subprocess.run(["chattr", "-i", str(folder)], check=False))
        if _can_create_in(folder):
            pytest.skip("no way to make a folder read-only for this user here")
        return folder

    yield make
    for step in reversed(undo):
        step()
