"""A generic ImageFolder tree: one subfolder per class in each split.

::

    root/
    ├── train/<class>/<image>     required
    ├── val/<class>/<image>       optional
    └── test/<class>/<image>      required

Images are files ending in .jpg .jpeg .png .bmp .gif .webp .tif or .tiff (any case), at any depth
under their class folder; other files are ignored. Classes are the sorted subfolders of
``train/``; a class folder in ``val/`` or ``test/`` must also be in ``train/``.

Splits: train and test are their folders. Validation is ``val/`` when it exists, else a seeded,
stratified 10% of ``train/`` (``stratified_holdout``) held out of train. One partition only (1).
"""

from __future__ import annotations

from pathlib import Path

from training.datasets.base import (
    IMAGE_EXTENSIONS,
    VAL_FRACTION,
    DatasetLayoutError,
    Splits,
    check_partition,
    class_folders,
    holdout_rule,
    image_splits,
    need_root,
    stratified_holdout,
)
from training.datasets.presets import Preset

__all__ = ["image_folder"]


def _images(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*")
        if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file() and not p.name.startswith(".")
    )


def _samples(split: Path, index: dict[str, int]) -> list[tuple[Path, int]]:
    samples = []
    for name in class_folders(split, f"the {split.name}/ folder of the ImageFolder tree"):
        if name not in index:
            raise DatasetLayoutError(
                f"class folder {split / name} is not a class of {split.parent / 'train'}"
            )
        samples += [(path, index[name]) for path in _images(split / name)]
    return samples


def _nonempty(samples: list[tuple[Path, int]], split: Path) -> list[tuple[Path, int]]:
    """``samples``, unless there are none: a split without images is a layout error."""
    if not samples:
        endings = " ".join(sorted(IMAGE_EXTENSIONS))
        raise DatasetLayoutError(
            f"expected images in the class folders of {split}, found none (images end in {endings})"
        )
    return samples


def image_folder(
    root: Path | None, preset: Preset, partition: int = 1, val_size: int = 0, seed: int = 0
) -> Splits:
    """The tree's train, val (or held-out part of train, drawn with ``seed``) and test images."""
    check_partition(partition, 1, "ImageFolder")
    root = need_root(root, "ImageFolder")
    classes = class_folders(root / "train", "the train/ folder of the ImageFolder tree")
    index = {name: i for i, name in enumerate(classes)}
    train = _samples(root / "train", index)
    found = {label for _, label in train}
    for name in classes:
        if index[name] not in found:
            raise DatasetLayoutError(f"expected images in {root / 'train' / name}, found none")
    test = _nonempty(_samples(root / "test", index), root / "test")
    if (root / "val").exists():
        val = _nonempty(_samples(root / "val", index), root / "val")
        rule = f"the images of {root / 'val'}"
    else:
        train, val = stratified_holdout(train, VAL_FRACTION, seed)
        rule = holdout_rule(VAL_FRACTION, seed, str(root / "train"))
    return image_splits(train, val, test, classes, preset, rule)
