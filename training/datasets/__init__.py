"""Datasets in their published layouts, with the paper's presets.

``load_splits(name, root, preset, ...)`` returns the train / validation / test splits of one
dataset, already transformed by the preset; ``DATASETS`` lists the names. The image datasets
(DTD, MINC-2500, MIT-Indoor, CUB-200-2011, an ImageFolder tree) have no default location and
need a root; only Fashion-MNIST reads ``val_size`` and ``classes`` (a subset of its labels), and
only DTD (1-10) and MINC-2500 (1-5) have more than one ``partition``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

from training.datasets.base import (
    DatasetLayoutError,
    LabelledImages,
    Splits,
    check_partition,
    check_readable,
)
from training.datasets.cub import cub200
from training.datasets.dtd import dtd
from training.datasets.fashion_mnist import VAL_SIZE, fashion_mnist
from training.datasets.folder import image_folder
from training.datasets.minc import minc2500
from training.datasets.mit_indoor import mit_indoor
from training.datasets.presets import PRESETS, Preset

__all__ = [
    "DATASETS",
    "PRESETS",
    "DatasetLayoutError",
    "LabelledImages",
    "Preset",
    "Splits",
    "check_readable",
    "load_splits",
]


def _fashion_mnist(
    root: Path | None,
    preset: Preset,
    partition: int,
    val_size: int,
    seed: int,
    classes: Sequence[int] | None = None,
) -> Splits:
    check_partition(partition, 1, "fashion_mnist")
    return fashion_mnist(
        root,
        preset.train_transform(),
        preset.eval_transform(),
        val_size,
        seed,
        classes=classes,
    )


#: name -> builder(root, preset, partition, val_size, seed) -> Splits
DATASETS: dict[str, Callable[[Path | None, Preset, int, int, int], Splits]] = {
    "dtd": dtd,
    "minc2500": minc2500,
    "mit_indoor": mit_indoor,
    "cub200": cub200,
    "image_folder": image_folder,
    "fashion_mnist": _fashion_mnist,
}


def load_splits(
    name: str,
    root: str | Path | None,
    preset: Preset | None = None,
    partition: int = 1,
    val_size: int | None = None,
    seed: int = 0,
    classes: Sequence[int] | None = None,
) -> tuple[Splits, Preset]:
    """The splits of dataset ``name`` under ``root`` and the preset that transformed them.
    ``val_size``: Fashion-MNIST's held-out training images (None: 5,000); the other datasets
    have their own validation split and ignore it. ``classes``: Fashion-MNIST's labels to keep
    (None: all ten), relabelled ``0..K-1``.

    Raises:
        ValueError: unknown dataset name (the message lists the valid ones); ``classes`` for
            another dataset than Fashion-MNIST, or labels that are not Fashion-MNIST's.
        DatasetLayoutError: the root or a file of the layout is missing; the message names it.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid datasets: {', '.join(sorted(DATASETS))}")
    preset = preset or PRESETS[name]
    root_path = None if root is None else Path(root)
    held_out = VAL_SIZE if val_size is None else val_size
    builder = DATASETS[name]
    if classes is not None:
        if name != "fashion_mnist":
            raise ValueError(
                f"classes (a subset of the labels) is read by fashion_mnist only, not {name}: "
                "leave it out, or give your own images a folder per class you want"
            )
        builder = functools.partial(_fashion_mnist, classes=classes)
    splits = builder(root_path, preset, partition, held_out, seed)
    for split in ("train", "val", "test"):
        if len(getattr(splits, split)) == 0:
            # how the validation split was made names its source; the others' come from the
            # layout (whose loaders name an empty list file themselves)
            made = splits.validation if split == "val" and splits.validation else "its layout"
            raise DatasetLayoutError(
                f"the {split} split of {name} in {root_path or 'its default folder'} has no "
                f"images (from {made}): a run needs images in each of train, val and test"
            )
    return splits, preset
