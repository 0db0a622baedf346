"""The Describable Textures Dataset (Cimpoi et al. 2014) in its published layout.

``root`` is the folder the tarball ``dtd-r1.0.1.tar.gz`` extracts to, torchvision's ``DTD`` root
(which keeps it at ``<root>/dtd/dtd``), or a folder holding ``dtd/``::

    dtd/
    ├── images/<class>/<name>.jpg      47 classes, 120 images each
    └── labels/
        ├── train1.txt ... train10.txt  lines "<class>/<name>.jpg", relative to images/
        ├── val1.txt   ... val10.txt
        └── test1.txt  ... test10.txt

Splits: partition k (1-10) reads ``train{k}``, ``val{k}`` and ``test{k}``, 40 images per class
each. Classes are the sorted subfolders of ``images/``.
"""

from __future__ import annotations

from pathlib import Path

from training.datasets.base import (
    Splits,
    check_disjoint,
    check_every_class,
    check_partition,
    class_folders,
    image_splits,
    locate,
    need_root,
    read_image_list,
    require,
)
from training.datasets.presets import Preset

__all__ = ["PARTITIONS", "dtd", "find_dtd"]

PARTITIONS = 10


def find_dtd(root: Path) -> Path:
    """The folder holding ``images/`` and ``labels/``: root, root/dtd or root/dtd/dtd."""
    return locate(root, [root, root / "dtd", root / "dtd" / "dtd"], ["images/", "labels/"], "DTD")


def dtd(
    root: Path | None, preset: Preset, partition: int = 1, val_size: int = 0, seed: int = 0
) -> Splits:
    """DTD's train / val / test lists of ``partition``; ``val_size`` and ``seed`` are unused."""
    check_partition(partition, PARTITIONS, "DTD")
    base = find_dtd(need_root(root, "DTD"))
    images = require(base / "images", "DTD's images/ folder", "folder")
    classes = class_folders(images, "DTD's images/ folder")
    labels = require(base / "labels", "DTD's labels/ folder", "folder")
    index = {name: i for i, name in enumerate(classes)}
    source = f"the subfolders of {images}"
    lists = {
        str(labels / f"{split}{partition}.txt"): read_image_list(
            labels / f"{split}{partition}.txt", "DTD's split list", images, index, source
        )
        for split in ("train", "val", "test")
    }
    check_disjoint(lists)
    train, val, test = lists.values()
    check_every_class(train, classes, str(labels / f"train{partition}.txt"), source)
    rule = f"DTD's val{partition}.txt"
    return image_splits(train, val, test, classes, preset, rule)
