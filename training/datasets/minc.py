"""MINC-2500 (Bell et al. 2015), the patch subset of the Materials in Context database.

``root`` is the folder ``minc-2500.tar.gz`` extracts to, or a folder holding ``minc-2500/``::

    minc-2500/
    ├── categories.txt                 optional: one class per line, label order (23 classes)
    ├── images/<class>/<class>_NNNNNN.jpg   2,500 per class
    └── labels/
        ├── train1.txt    ... train5.txt     lines "images/<class>/<class>_NNNNNN.jpg",
        ├── validate1.txt ... validate5.txt  relative to minc-2500/
        └── test1.txt     ... test5.txt

Splits: split k (1-5) reads ``train{k}`` (2,125 per class), ``validate{k}`` (125) and ``test{k}``
(250). Classes are in ``categories.txt``'s order if it is there, else the sorted subfolders of
``images/``.
"""

from __future__ import annotations

from pathlib import Path

from training.datasets.base import (
    DatasetLayoutError,
    Splits,
    check_disjoint,
    check_every_class,
    check_partition,
    class_folders,
    image_splits,
    locate,
    need_root,
    read_image_list,
    read_lines,
    require,
)
from training.datasets.presets import Preset

__all__ = ["PARTITIONS", "minc2500"]

PARTITIONS = 5


def _classes(base: Path) -> tuple[list[str], str]:
    """The class names in label order, and where they were read."""
    categories = base / "categories.txt"
    if not categories.exists():
        images = base / "images"
        return class_folders(images, "MINC-2500's images/ folder"), f"the subfolders of {images}"
    classes = read_lines(categories, "MINC-2500's categories.txt")
    if not classes or len(set(classes)) != len(classes):
        raise DatasetLayoutError(f"{categories} should list each class once, one per line")
    return classes, str(categories)


def minc2500(
    root: Path | None, preset: Preset, partition: int = 1, val_size: int = 0, seed: int = 0
) -> Splits:
    """MINC-2500's train / validate / test lists of ``partition``; ``val_size``, ``seed`` unused."""
    check_partition(partition, PARTITIONS, "MINC-2500")
    root = need_root(root, "MINC-2500")
    base = locate(root, [root, root / "minc-2500"], ["images/", "labels/"], "MINC-2500")
    require(base / "images", "MINC-2500's images/ folder", "folder")
    labels = require(base / "labels", "MINC-2500's labels/ folder", "folder")
    classes, source = _classes(base)
    index = {name: i for i, name in enumerate(classes)}
    lists = {
        str(labels / f"{split}{partition}.txt"): read_image_list(
            labels / f"{split}{partition}.txt", "MINC-2500's split list", base, index, source, 1
        )
        for split in ("train", "validate", "test")
    }
    check_disjoint(lists)
    train, val, test = lists.values()
    check_every_class(train, classes, str(labels / f"train{partition}.txt"), source)
    rule = f"MINC-2500's validate{partition}.txt"
    return image_splits(train, val, test, classes, preset, rule)
