"""A folder of images in the class-per-folder layout, made from Fashion-MNIST, to try
"train on your own images" (``--dataset image_folder``) before having images of one's own.

::

    OUT/
    ├── train/<class>/000.png, 001.png, ...   per_class images of each class (training files)
    └── test/<class>/000.png, 001.png, ...    test_per_class images of each class (test files)

The layout is the one :mod:`training.datasets.folder` reads (no ``val/``: validation is then
10 % of each class of ``train/``). The class folders are Fashion-MNIST's class names made into
folder names (:func:`folder_name`: ``T-shirt/top`` -> ``t-shirt-top``, ``Ankle boot`` ->
``ankle-boot``); each holds the class's first images in the idx files' order, as 28 x 28 grey
PNG files, so one command always writes the same files. The idx files are read by
:func:`training.datasets.fashion_mnist.load_arrays` (Debian's ``dataset-fashion-mnist`` by
default: ``make data``).

Run as ``python -m training.datasets.image_tree --out my-images --per-class 100``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from training.datasets.base import DatasetLayoutError
from training.datasets.fashion_mnist import CLASSES, DEFAULT_ROOT, load_arrays

__all__ = ["FOLDERS", "ImageTree", "ImageTreeError", "folder_name", "main", "write_image_tree"]


def folder_name(label: str) -> str:
    """A class name as a folder name: lower case, each run of characters other than letters
    and digits one ``-`` (``T-shirt/top`` -> ``t-shirt-top``)."""
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


#: The class folders, in Fashion-MNIST's label order (``FOLDERS[k]`` holds label k's images).
FOLDERS = [folder_name(label) for label in CLASSES]


class ImageTreeError(ValueError):
    """A request for a tree that cannot be written as asked (the message says what to change)."""


@dataclass(frozen=True)
class ImageTree:
    """What :func:`write_image_tree` wrote."""

    root: Path  # the folder holding train/ and test/
    classes: list[str]  # the class folders written, sorted (smso-train's label order)
    train_per_class: int  # images in each train/<class>/
    test_per_class: int  # images in each test/<class>/

    @property
    def images(self) -> int:
        """Every image written, both splits."""
        return len(self.classes) * (self.train_per_class + self.test_per_class)


def _chosen(classes: Sequence[str] | None) -> list[int]:
    """The labels of the class folders named in ``classes`` (all ten when None), sorted."""
    if classes is None:
        return list(range(len(FOLDERS)))
    unknown = sorted(set(classes) - set(FOLDERS))
    if unknown:
        raise ImageTreeError(
            f"no Fashion-MNIST class is called {', '.join(unknown)}; the classes: "
            f"{', '.join(FOLDERS)}"
        )
    if len(set(classes)) < 2:
        raise ImageTreeError("a classifier needs at least two classes: name two or more")
    return sorted(FOLDERS.index(name) for name in set(classes))


def _write_split(
    folder: Path, images: np.ndarray, labels: np.ndarray, chosen: list[int], count: int
) -> None:
    """``folder/<class>/NNN.png``: the first ``count`` images ``(N, 28, 28)`` of each label."""
    for label in chosen:
        (index,) = np.nonzero(labels == label)
        if len(index) < count:
            raise ImageTreeError(
                f"{folder.name}: Fashion-MNIST has {len(index)} images of {FOLDERS[label]}, "
                f"fewer than the {count} asked for"
            )
        target = folder / FOLDERS[label]
        target.mkdir(parents=True)
        for i, k in enumerate(index[:count]):
            Image.fromarray(images[k]).save(target / f"{i:03d}.png")  # mode L, 28 x 28


def write_image_tree(
    out: Path,
    per_class: int,
    test_per_class: int | None = None,
    classes: Sequence[str] | None = None,
    data_root: Path = DEFAULT_ROOT,
) -> ImageTree:
    """Write ``out/train/<class>/`` (``per_class`` images each) and ``out/test/<class>/``
    (``test_per_class``, default a fifth of ``per_class`` and at least 1) from the Fashion-MNIST
    idx files in ``data_root``, for the class folders ``classes`` (default: all ten).

    ``out`` must not exist, or be an empty folder. The tree is written beside it under a hidden
    name and renamed into place whole, so a stopped run leaves no half tree at ``out``.
    """
    test_count = max(1, per_class // 5) if test_per_class is None else test_per_class
    if per_class < 1 or test_count < 1:
        raise ImageTreeError("--per-class and --test-per-class must be 1 or more")
    chosen = _chosen(classes)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ImageTreeError(f"{out} already exists and is not an empty folder: give another --out")
    train_images, train_labels = load_arrays(data_root, "train")  # (60000, 28, 28), (60000,)
    test_images, test_labels = load_arrays(data_root, "test")  # (10000, 28, 28), (10000,)
    partial = out.parent / f".{out.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)  # what a stopped run left
    try:
        _write_split(partial / "train", train_images, train_labels, chosen, per_class)
        _write_split(partial / "test", test_images, test_labels, chosen, test_count)
        if out.exists():
            out.rmdir()  # empty: checked above
        partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return ImageTree(out, sorted(FOLDERS[label] for label in chosen), per_class, test_count)


def _count(text: str) -> int:
    """An argparse ``type``: a whole number of images, 1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a number of images, 1 or more; got {text!r}")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m training.datasets.image_tree``; a mistake is one line on stderr, status 2."""
    parser = argparse.ArgumentParser(
        prog="python -m training.datasets.image_tree",
        description="Write Fashion-MNIST images as PNG files in the class-per-folder layout "
        "of --dataset image_folder: OUT/train/<class>/ and OUT/test/<class>/.",
    )
    parser.add_argument("--out", type=Path, required=True, help="the folder to create")
    parser.add_argument(
        "--per-class", type=_count, required=True, help="training images of each class"
    )
    parser.add_argument(
        "--test-per-class", type=_count, help="test images of each class (default: a fifth)"
    )
    parser.add_argument(
        "--classes", nargs="+", metavar="CLASS", help=f"class folders (default: all): {FOLDERS}"
    )
    parser.add_argument(
        "--data-root",
        type=Path,
        default=DEFAULT_ROOT,
        help="the folder of Fashion-MNIST's idx files (default: %(default)s, `make data`)",
    )
    args = parser.parse_args(argv)
    try:
        tree = write_image_tree(
            args.out, args.per_class, args.test_per_class, args.classes, args.data_root
        )
    except (ImageTreeError, DatasetLayoutError) as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    print(
        f"{tree.root}: {len(tree.classes)} classes, {tree.train_per_class} training and "
        f"{tree.test_per_class} test images each (train/<class>/, test/<class>/)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
