"""Caltech-UCSD Birds-200-2011 (Wah et al. 2011) in its published layout.

``root`` is the folder ``CUB_200_2011.tgz`` extracts to, or a folder holding ``CUB_200_2011/``::

    CUB_200_2011/
    ├── images/<class>/<file>.jpg
    ├── images.txt                lines "<image id> <path relative to images/>"
    ├── image_class_labels.txt    lines "<image id> <class id, 1-200>"
    ├── train_test_split.txt      lines "<image id> <1: train, 0: test>"
    └── classes.txt               lines "<class id> <name>", e.g. "1 001.Black_footed_Albatross"

Splits: test is the 5,794 images marked 0. There is no official validation split, so a seeded,
stratified 10% of the 5,994 training images (``stratified_holdout``) is held out for validation
and the rest is train. One partition only (1). Classes are named as in ``classes.txt``
(``001.Black_footed_Albatross``) and in its order.
"""

from __future__ import annotations

from pathlib import Path

from training.datasets.base import (
    VAL_FRACTION,
    DatasetLayoutError,
    Splits,
    check_disjoint,
    check_every_class,
    check_partition,
    holdout_rule,
    image_splits,
    locate,
    need_root,
    numbered_lines,
    require,
    stratified_holdout,
)
from training.datasets.presets import Preset

__all__ = ["cub200"]


def _table(path: Path) -> dict[int, tuple[int, str]]:
    """``id -> (line number, value)`` of a CUB ``<id> <value>`` file (ids are whole numbers:
    ``7`` and ``007`` are one id)."""
    rows: dict[int, tuple[int, str]] = {}
    for number, line in numbered_lines(path, f"CUB-200-2011's {path.name}"):
        text, _, value = line.partition(" ")
        key = int(text) if text.isdecimal() else None
        if key is None or not value.strip():
            raise DatasetLayoutError(
                f"{path}, line {number}: expected '<id> <value>' with a whole-number id, got "
                f"{line!r}"
            )
        if key in rows:
            raise DatasetLayoutError(
                f"{path}, line {number}: id {key} is on line {rows[key][0]} already, got {line!r}"
            )
        rows[key] = (number, value.strip())
    return rows


def _lookup(table: dict[int, tuple[int, str]], key: int, path: Path) -> tuple[int, str]:
    if key not in table:
        raise DatasetLayoutError(f"{path} has no line for image id {key}")
    return table[key]


def cub200(
    root: Path | None, preset: Preset, partition: int = 1, val_size: int = 0, seed: int = 0
) -> Splits:
    """CUB's train (less the held-out val, drawn with ``seed``) and test images."""
    check_partition(partition, 1, "CUB-200-2011")
    root = need_root(root, "CUB-200-2011")
    base = locate(root, [root, root / "CUB_200_2011"], ["images.txt"], "CUB-200-2011")
    images = require(base / "images", "CUB-200-2011's images/ folder", "folder")
    files = {
        name: base / f"{name}.txt"
        for name in ("classes", "images", "image_class_labels", "train_test_split")
    }
    class_rows = _table(files["classes"])
    classes = [name for _, name in class_rows.values()]
    class_ids = {str(key): i for i, key in enumerate(class_rows)}
    labels, split = _table(files["image_class_labels"]), _table(files["train_test_split"])
    train_all: list[tuple[Path, int]] = []
    test: list[tuple[Path, int]] = []
    for key, (number, relative) in _table(files["images"]).items():
        label_line, class_id = _lookup(labels, key, files["image_class_labels"])
        class_id = str(int(class_id)) if class_id.isdecimal() else class_id  # "007" is 7
        if class_id not in class_ids:
            raise DatasetLayoutError(
                f"{files['image_class_labels']}, line {label_line}: class id {class_id} is not "
                f"in {files['classes']}"
            )
        split_line, is_train = _lookup(split, key, files["train_test_split"])
        if is_train not in ("0", "1"):
            raise DatasetLayoutError(
                f"{files['train_test_split']}, line {split_line}: expected 1 (train) or 0 (test), "
                f"got {is_train!r}"
            )
        path = images / relative
        if not path.is_file():
            raise DatasetLayoutError(
                f"{files['images']}, line {number}: image {path} does not exist"
            )
        (train_all if is_train == "1" else test).append((path, class_ids[class_id]))
    split_file = files["train_test_split"]
    check_disjoint({f"{split_file}'s training images": train_all, "its test images": test})
    check_every_class(train_all, classes, f"{split_file}'s lines marked 1", str(files["classes"]))
    train, val = stratified_holdout(train_all, VAL_FRACTION, seed)
    rule = holdout_rule(VAL_FRACTION, seed, "train_test_split.txt's training images")
    return image_splits(train, val, test, classes, preset, rule)
