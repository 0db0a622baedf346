"""MIT Indoor 67 (Quattoni & Torralba 2009) in its published layout.

``root`` holds the extracted ``indoorCVPR_09.tar`` (``Images/``) and the two split lists that are
published beside it::

    root/
    ├── Images/<class>/<file>.jpg   67 classes
    ├── TrainImages.txt             lines "<class>/<file>.jpg", relative to Images/ (80 per class)
    └── TestImages.txt              the same (20 per class)

Splits: test is ``TestImages.txt``. There is no official validation split, so a seeded,
stratified 10% of ``TrainImages.txt`` (``stratified_holdout``: at least one image of each class
with two or more) is held out for validation and the rest is train. One partition only (1).
Classes are the sorted subfolders of ``Images/``.
"""

from __future__ import annotations

from pathlib import Path

from training.datasets.base import (
    VAL_FRACTION,
    Splits,
    check_disjoint,
    check_every_class,
    check_partition,
    class_folders,
    holdout_rule,
    image_splits,
    need_root,
    read_image_list,
    stratified_holdout,
)
from training.datasets.presets import Preset

__all__ = ["mit_indoor"]


def mit_indoor(
    root: Path | None, preset: Preset, partition: int = 1, val_size: int = 0, seed: int = 0
) -> Splits:
    """MIT-Indoor's train (less the held-out val, drawn with ``seed``) and test lists."""
    check_partition(partition, 1, "MIT-Indoor")
    root = need_root(root, "MIT-Indoor")
    images = root / "Images"
    classes = class_folders(images, "MIT-Indoor's Images/ folder")
    index = {name: i for i, name in enumerate(classes)}
    source = f"the subfolders of {images}"
    train_all = read_image_list(
        root / "TrainImages.txt", "MIT-Indoor's train list", images, index, source
    )
    test = read_image_list(root / "TestImages.txt", "MIT-Indoor's test list", images, index, source)
    check_disjoint({str(root / "TrainImages.txt"): train_all, str(root / "TestImages.txt"): test})
    check_every_class(train_all, classes, str(root / "TrainImages.txt"), source)
    train, val = stratified_holdout(train_all, VAL_FRACTION, seed)
    rule = holdout_rule(VAL_FRACTION, seed, "TrainImages.txt")
    return image_splits(train, val, test, classes, preset, rule)
