"""Every dataset in its published layout, on tiny trees: splits, classes, labels, partitions, the
seeded validation hold-out, the root variants each accepts, and the errors a wrong layout gives."""

from __future__ import annotations

import dataclasses
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from tests.training.conftest import tensors, write_idx
from training.datasets import DATASETS, PRESETS, DatasetLayoutError, Preset, Splits, load_splits
from training.datasets.base import ImageList, LabelledImages, stratified_holdout
from training.datasets.fashion_mnist import CLASSES, TensorImages, fashion_mnist
from training.datasets.presets import SmallImageTransform, erase_mask

# --- tiny trees in each dataset's published layout ------------------------------------------


def _image(path: Path, shade: int = 0) -> None:
    """A tiny RGB image (10 wide, 8 high), saved in the format its suffix names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (10, 8), (shade, 255 - shade, 128)).save(path)


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))


DTD_CLASSES = ["banded", "dotted", "zigzagged"]


def make_dtd(base: Path) -> Path:
    """``base/{images,labels}``: 3 images per class; partition k puts one per split, rotating."""
    for c in DTD_CLASSES:
        for i in range(1, 4):
            _image(base / "images" / c / f"{c}_{i:04d}.jpg", 40 * i)
    (base / "images" / "README").write_text("not a class\n")
    for k in range(1, 11):
        for j, split in enumerate(("train", "val", "test")):
            number = (k + j) % 3 + 1
            _write(
                base / "labels" / f"{split}{k}.txt",
                [f"{c}/{c}_{number:04d}.jpg" for c in DTD_CLASSES],
            )
    return base


MINC_CLASSES = ["brick", "carpet", "wood"]


def _minc_split(k: int, split: str) -> list[int]:
    test, validate = (k - 1) % 5 + 1, k % 5 + 1
    return {"test": [test], "validate": [validate]}.get(
        split, [i for i in range(1, 6) if i not in (test, validate)]
    )


def make_minc(base: Path) -> Path:
    """``base/{images,labels}``, 5 images per class: split k tests one, validates one, trains 3."""
    for c in MINC_CLASSES:
        for i in range(1, 6):
            _image(base / "images" / c / f"{c}_{i:06d}.jpg", 40 * i)
    for k in range(1, 6):
        for split in ("train", "validate", "test"):
            lines = [
                f"images/{c}/{c}_{i:06d}.jpg" for c in MINC_CLASSES for i in _minc_split(k, split)
            ]
            _write(base / "labels" / f"{split}{k}.txt", lines)
    return base


MIT_TRAIN = {"bakery": 10, "bar": 10, "kitchen": 20}  # train images per class; 2 test each


def make_mit(base: Path) -> Path:
    train: list[str] = []
    test: list[str] = []
    for c, n in MIT_TRAIN.items():
        for i in range(n + 2):
            _image(base / "Images" / c / f"{c}_{i:03d}.jpg", 10 * i)
            (train if i < n else test).append(f"{c}/{c}_{i:03d}.jpg")
    _write(base / "TrainImages.txt", train)
    _write(base / "TestImages.txt", test)
    return base


CUB_CLASSES = ["001.Black_footed_Albatross", "002.Laysan_Albatross", "003.Sooty_Albatross"]


def make_cub(base: Path) -> Path:
    """6 images per class, ids class by class: the first 4 of each class train, the last 2 test."""
    images: list[str] = []
    labels: list[str] = []
    split: list[str] = []
    for class_id, c in enumerate(CUB_CLASSES, 1):
        for i in range(1, 7):
            image_id = len(images) + 1
            relative = f"{c}/{c[4:]}_{i:04d}_{image_id}.jpg"
            _image(base / "images" / relative, 30 * i)
            images.append(f"{image_id} {relative}")
            labels.append(f"{image_id} {class_id}")
            split.append(f"{image_id} {int(i <= 4)}")
    _write(base / "images.txt", images)
    _write(base / "image_class_labels.txt", labels)
    _write(base / "train_test_split.txt", split)
    _write(base / "classes.txt", [f"{i} {c}" for i, c in enumerate(CUB_CLASSES, 1)])
    return base


FOLDER_TRAIN = {"cat": 10, "dog": 5}  # images per class in train/; 2 per class in test/


def make_folder(base: Path, with_val: bool = False) -> Path:
    suffixes = [".jpg", ".PNG", ".jpeg", ".png"]
    for c, n in FOLDER_TRAIN.items():
        for i in range(n):
            _image(base / "train" / c / f"{c}{i}{suffixes[i % 4]}", 20 * i)
        for i in range(2):
            _image(base / "test" / c / f"{c}{i}.jpg")
        if with_val:
            _image(base / "val" / c / f"{c}.png")
        (base / "train" / c / "notes.txt").write_text("not an image\n")
    _image(base / "train" / "cat" / "more" / "nested.bmp")  # any depth under the class folder
    return base


def make_fashion(base: Path, gz: bool = False, torchvision: bool = False) -> Path:
    """30 training images (pixel (0, 0) is the image's index, label index % 10) and 10 test."""
    folder = base / "FashionMNIST" / "raw" if torchvision else base
    folder.mkdir(parents=True, exist_ok=True)
    train = np.zeros((30, 28, 28), np.uint8)
    train[:, 0, 0] = np.arange(30)
    arrays: dict[str, np.ndarray] = {
        "train-images-idx3-ubyte": train,
        "train-labels-idx1-ubyte": np.arange(30) % 10,
        "t10k-images-idx3-ubyte": np.full((10, 28, 28), 7, np.uint8),
        "t10k-labels-idx1-ubyte": np.arange(10),
    }
    for name, array in arrays.items():
        write_idx(folder / (f"{name}.gz" if gz else name), array)
    return base


#: Every registered dataset and the tree builder its tests use.
TREES: dict[str, Callable[[Path], Path]] = {
    "dtd": make_dtd,
    "minc2500": make_minc,
    "mit_indoor": make_mit,
    "cub200": make_cub,
    "image_folder": make_folder,
    "fashion_mnist": make_fashion,
}
IMAGE_DATASETS = [name for name in TREES if name != "fashion_mnist"]


def small(name: str) -> Preset:
    return PRESETS[name].with_size(8)


def load(name: str, root: Path | None, partition: int = 1, seed: int = 0) -> Splits:
    return load_splits(name, root, small(name), partition, 5, seed)[0]


def files(dataset: LabelledImages) -> ImageList:
    """``dataset``, which a dataset of image files loads as an :class:`ImageList`."""
    assert isinstance(dataset, ImageList)
    return dataset


def names(dataset: LabelledImages) -> dict[str, str]:
    """File name -> class name of every sample."""
    return {path.name: dataset.classes[label] for path, label in files(dataset).samples}


def sizes(splits: Splits) -> tuple[int, int, int]:
    return len(splits.train), len(splits.val), len(splits.test)


# --- the registry ------------------------------------------------------------------------


def test_every_dataset_has_a_preset_and_a_test() -> None:
    assert set(DATASETS) == set(TREES)
    assert set(DATASETS) <= set(PRESETS)


@pytest.mark.parametrize("name", list(TREES))
def test_items_are_tensors_of_the_preset_size(tmp_path: Path, name: str) -> None:
    root = TREES[name](tmp_path / name)
    preset = PRESETS[name] if name == "fashion_mnist" else small(name)
    splits, used = load_splits(name, root, preset, val_size=5)
    assert used == preset
    for split in (splits.train, splits.val, splits.test):
        image, label = split[0]
        assert image.shape == (preset.channels, preset.image_size, preset.image_size)
        assert image.dtype == torch.float32
        assert 0 <= label < len(splits.classes)
    assert torch.equal(splits.test[0][0], splits.test[0][0])  # evaluation is deterministic


def test_with_size_scales_the_resize() -> None:
    assert (small("dtd").image_size, small("dtd").resize) == (8, 9)  # 512 * 8 / 448
    assert (small("minc2500").image_size, small("minc2500").resize) == (8, 9)  # 256 * 8 / 224
    assert PRESETS["fashion_mnist"].with_size(32).resize is None


def test_random_erasing_rectangles_follow_torchvision_bounds() -> None:
    """Erasing rate, rectangle shape, area and aspect within the published ranges; off: none."""
    torch.manual_seed(0)
    preset = dataclasses.replace(PRESETS["fashion_mnist"], erase=0.5)
    mask = erase_mask(4000, 28, preset)[:, 0]  # (B, S, S)
    erased = mask.flatten(1).any(1)
    assert abs(erased.float().mean().item() - 0.5) < 0.03
    for m in mask[erased][:200]:
        rows, cols = m.any(1).nonzero()[:, 0], m.any(0).nonzero()[:, 0]
        h, w = len(rows), len(cols)
        assert int(m.sum()) == h * w  # one solid rectangle
        assert rows[-1] - rows[0] + 1 == h
        assert cols[-1] - cols[0] + 1 == w
        assert 0.02 * 784 - 2 * 28 <= h * w <= 0.33 * 784 + 2 * 28  # area after rounding
        assert h < 28
        assert w < 28
    assert not erase_mask(100, 28, PRESETS["fashion_mnist"]).any()


def test_random_erasing_sets_the_mean_in_training_only() -> None:
    """Erased pixels are 0 after normalisation (the mean); evaluation never erases."""
    preset = dataclasses.replace(PRESETS["fashion_mnist"], erase=1.0, pad=0, flip=False)
    images = torch.full((64, 1, 28, 28), 255, dtype=torch.uint8)
    torch.manual_seed(0)
    train = SmallImageTransform(preset, train=True).batch(images)
    evaluation = SmallImageTransform(preset, train=False).batch(images)
    top = (255 / 255 - 0.2860) / 0.3530
    assert ((train == 0) | torch.isclose(train, torch.tensor(top))).all()
    assert (train == 0).flatten(1).any(1).float().mean() > 0.9
    assert torch.allclose(evaluation, torch.tensor(top))
    folder = dataclasses.replace(small("dtd"), erase=0.5).train_transform()
    assert isinstance(folder, v2.Compose)
    assert any(isinstance(op, v2.RandomErasing) for op in folder.transforms)


# --- DTD ---------------------------------------------------------------------------------


def test_dtd_splits_classes_and_labels(tmp_path: Path) -> None:
    splits = load("dtd", make_dtd(tmp_path / "dtd"))
    assert splits.classes == DTD_CLASSES
    assert sizes(splits) == (3, 3, 3)
    assert names(splits.train) == {f"{c}_0002.jpg": c for c in DTD_CLASSES}
    assert names(splits.val) == {f"{c}_0003.jpg": c for c in DTD_CLASSES}
    assert names(splits.test) == {f"{c}_0001.jpg": c for c in DTD_CLASSES}
    assert splits.train.targets == [0, 1, 2]


def test_dtd_partition_selects_its_lists(tmp_path: Path) -> None:
    root = make_dtd(tmp_path / "dtd")
    first, second = load("dtd", root, 1), load("dtd", root, 2)
    assert set(names(first.train)) != set(names(second.train))
    assert set(names(second.train)) == {f"{c}_0003.jpg" for c in DTD_CLASSES}
    assert set(names(load("dtd", root, 10).test)) == {f"{c}_0001.jpg" for c in DTD_CLASSES}


@pytest.mark.parametrize(
    ("where", "passed"),
    [("dtd", "dtd"), ("parent/dtd", "parent"), ("torchvision/dtd/dtd", "torchvision")],
    ids=["dtd-folder", "parent", "torchvision"],
)
def test_dtd_root_variants(tmp_path: Path, where: str, passed: str) -> None:
    make_dtd(tmp_path / where)
    assert sizes(load("dtd", tmp_path / passed)) == (3, 3, 3)


# --- MINC-2500 ---------------------------------------------------------------------------


def test_minc_splits_and_partitions(tmp_path: Path) -> None:
    root = make_minc(tmp_path / "minc-2500")
    splits = load("minc2500", root)
    assert splits.classes == MINC_CLASSES
    assert sizes(splits) == (9, 3, 3)
    assert names(splits.test) == {f"{c}_000001.jpg": c for c in MINC_CLASSES}
    assert names(splits.val) == {f"{c}_000002.jpg": c for c in MINC_CLASSES}
    second = load("minc2500", root, 2)
    assert set(names(second.test)) == {f"{c}_000002.jpg" for c in MINC_CLASSES}
    assert set(names(second.train)) != set(names(splits.train))
    assert sizes(load("minc2500", root, 5)) == (9, 3, 3)


def test_minc_categories_order_and_parent_root(tmp_path: Path) -> None:
    root = make_minc(tmp_path / "minc-2500")
    _write(root / "categories.txt", ["wood", "brick", "carpet"])
    splits = load("minc2500", tmp_path)  # the parent of minc-2500/
    assert splits.classes == ["wood", "brick", "carpet"]
    assert splits.train.targets == [1, 1, 1, 2, 2, 2, 0, 0, 0]


# --- MIT-Indoor and the stratified hold-out ----------------------------------------------


def test_mit_indoor_splits_and_holdout(tmp_path: Path) -> None:
    root = make_mit(tmp_path / "mit")
    splits = load("mit_indoor", root, seed=3)
    assert splits.classes == sorted(MIT_TRAIN)
    assert sizes(splits) == (36, 4, 6)
    assert Counter(names(splits.val).values()) == {"bakery": 1, "bar": 1, "kitchen": 2}
    assert Counter(names(splits.test).values()) == dict.fromkeys(MIT_TRAIN, 2)
    train, val = set(names(splits.train)), set(names(splits.val))
    assert not train & val
    listed = {line.split("/")[1] for line in (root / "TrainImages.txt").read_text().split()}
    assert train | val == listed
    held = files(splits.val).samples
    assert files(load("mit_indoor", root, seed=3).val).samples == held
    assert any(files(load("mit_indoor", root, seed=s).val).samples != held for s in range(5))


def test_stratified_holdout() -> None:
    samples = [(f"a{i}", 0) for i in range(25)] + [(f"b{i}", 1) for i in range(3)] + [("c", 2)]
    train, val = stratified_holdout(samples, 0.1, seed=0)
    assert Counter(label for _, label in val) == {0: 2, 1: 1}  # round(2.5) = 2; at least 1; none
    assert sorted(train + val) == sorted(samples)
    assert not set(train) & set(val)
    assert train == [s for s in samples if s in train]  # input order kept
    assert stratified_holdout(samples, 0.1, seed=0) == (train, val)
    assert stratified_holdout([("x", 0), ("y", 0)], 0.1, seed=0)[0] in ([("x", 0)], [("y", 0)])


# --- CUB-200-2011 ------------------------------------------------------------------------


def test_cub_splits_classes_and_labels(tmp_path: Path) -> None:
    splits = load("cub200", make_cub(tmp_path / "CUB_200_2011"))
    assert splits.classes == CUB_CLASSES
    assert sizes(splits) == (9, 3, 6)
    assert names(splits.test)["Laysan_Albatross_0005_11.jpg"] == "002.Laysan_Albatross"
    assert Counter(names(splits.val).values()) == dict.fromkeys(CUB_CLASSES, 1)
    assert not set(names(splits.train)) & set(names(splits.val))


def test_cub_follows_classes_txt_and_accepts_parent(tmp_path: Path) -> None:
    base = make_cub(tmp_path / "CUB_200_2011")
    _write(base / "classes.txt", ["3 Sooty", "1 Black_footed", "2 Laysan"])  # file order, not ids
    splits = load("cub200", tmp_path)
    assert splits.classes == ["Sooty", "Black_footed", "Laysan"]
    assert names(splits.test)["Sooty_Albatross_0006_18.jpg"] == "Sooty"
    assert names(splits.test)["Black_footed_Albatross_0006_6.jpg"] == "Black_footed"


# --- ImageFolder -------------------------------------------------------------------------


def test_image_folder_holdout_without_val(tmp_path: Path) -> None:
    splits = load("image_folder", make_folder(tmp_path / "tree"))
    assert splits.classes == ["cat", "dog"]
    assert sizes(splits) == (14, 2, 4)  # 11 cats (one nested) + 5 dogs; 1 of each held out
    everything = names(splits.train) | names(splits.val)
    assert everything["cat1.PNG"] == "cat"
    assert everything["nested.bmp"] == "cat"
    assert "notes.txt" not in everything


def test_image_folder_with_val(tmp_path: Path) -> None:
    splits = load("image_folder", make_folder(tmp_path / "tree", with_val=True))
    assert sizes(splits) == (16, 2, 4)
    assert names(splits.val) == {"cat.png": "cat", "dog.png": "dog"}


# --- errors ------------------------------------------------------------------------------


def _unlink(relative: str) -> Callable[[Path], list[str]]:
    def mutate(root: Path) -> list[str]:
        (root / relative).unlink()
        return [str(root / relative)]

    return mutate


def _rmtree(relative: str) -> Callable[[Path], list[str]]:
    def mutate(root: Path) -> list[str]:
        shutil.rmtree(root / relative)
        return [str(root / relative)]

    return mutate


def _missing_image(image: str, list_file: str, line: int) -> Callable[[Path], list[str]]:
    def mutate(root: Path) -> list[str]:
        (root / image).unlink()
        return [str(root / list_file), f"line {line}", str(root / image)]

    return mutate


def _append(list_file: str, text: str, line: int, *extra: str) -> Callable[[Path], list[str]]:
    def mutate(root: Path) -> list[str]:
        with (root / list_file).open("a") as f:
            f.write(f"{text}\n")
        return [str(root / list_file), f"line {line}", *extra]

    return mutate


def _replace(relative: str, old: str, new: str, *fragments: str) -> Callable[[Path], list[str]]:
    def mutate(root: Path) -> list[str]:
        path = root / relative
        path.write_text(path.read_text().replace(old, new, 1))
        return [str(path), *fragments]

    return mutate


def _minc_without_wood(root: Path) -> list[str]:
    _write(root / "categories.txt", ["brick", "carpet"])
    return [str(root / "labels" / "train1.txt"), "line 7", "'wood'", str(root / "categories.txt")]


def _folder_extra_class(root: Path) -> list[str]:
    _image(root / "test" / "horse" / "h.jpg")
    return [str(root / "test" / "horse"), str(root / "train")]


def _folder_empty_class(root: Path) -> list[str]:
    for path in (root / "train" / "dog").glob("*.*"):
        path.unlink()
    return [str(root / "train" / "dog")]


def _emptied(list_file: str) -> Callable[[Path], list[str]]:
    def mutate(root: Path) -> list[str]:
        (root / list_file).write_text("")
        return [str(root / list_file), "to list images, one per line, but it is empty"]

    return mutate


def _empty_class(folder: str, listed_in: str) -> Callable[[Path], list[str]]:
    """A class folder without images: a class every model would have an output for, untrained."""

    def mutate(root: Path) -> list[str]:
        (root / folder).mkdir(parents=True)
        name = repr(Path(folder).name)
        return [f"class {name} has no training image in {root / listed_in} (of the ", "every"]

    return mutate


def _cub_empty_class(root: Path) -> list[str]:
    with (root / "classes.txt").open("a") as f:
        f.write("4 004.Groove_billed_Ani\n")
    return ["'004.Groove_billed_Ani' has no training image", str(root / "classes.txt"), "marked 1"]


def _leak(list_file: str, image: str, other: str) -> Callable[[Path], list[str]]:
    """``image``, a training image, listed in ``list_file`` (test or validation) as well."""

    def mutate(root: Path) -> list[str]:
        with (root / list_file).open("a") as f:
            f.write(f"{image}\n")
        return [str(root / other), str(root / list_file), Path(image).name, "is in both"]

    return mutate


def _cub_leak(root: Path) -> list[str]:
    """Image id 19 (a test id) names the file of image 1 (a training image)."""
    relative = "001.Black_footed_Albatross/Black_footed_Albatross_0001_1.jpg"
    with (root / "images.txt").open("a") as f:
        f.write(f"19 {relative}\n")
    with (root / "image_class_labels.txt").open("a") as f:
        f.write("19 1\n")
    with (root / "train_test_split.txt").open("a") as f:
        f.write("19 0\n")
    return [relative, "is in both", "train_test_split.txt's training images and its test images"]


LAYOUT_ERRORS: dict[str, tuple[str, Callable[[Path], list[str]]]] = {
    "dtd-labels-file": ("dtd", _unlink("labels/val1.txt")),
    "dtd-images-folder": ("dtd", _rmtree("images")),
    "dtd-image": ("dtd", _missing_image("images/dotted/dotted_0001.jpg", "labels/test1.txt", 2)),
    "dtd-class": (
        "dtd",
        _append("labels/train1.txt", "nosuch/nosuch_0001.jpg", 4, "'nosuch'", "subfolders of"),
    ),
    "dtd-line": ("dtd", _append("labels/train1.txt", "banded_0001.jpg", 4, "'banded_0001.jpg'")),
    "minc-labels-file": ("minc2500", _unlink("labels/validate1.txt")),
    "minc-image": (
        "minc2500",
        _missing_image("images/carpet/carpet_000004.jpg", "labels/train1.txt", 5),
    ),
    "minc-class": ("minc2500", _minc_without_wood),
    "mit-test-list": ("mit_indoor", _unlink("TestImages.txt")),
    "mit-images-folder": ("mit_indoor", _rmtree("Images")),
    "mit-image": ("mit_indoor", _missing_image("Images/bar/bar_011.jpg", "TestImages.txt", 4)),
    "mit-class": ("mit_indoor", _append("TrainImages.txt", "garage/g.jpg", 41, "'garage'")),
    "cub-split-file": ("cub200", _unlink("train_test_split.txt")),
    "cub-classes-file": ("cub200", _unlink("classes.txt")),
    "cub-image": (
        "cub200",
        _missing_image(
            "images/001.Black_footed_Albatross/Black_footed_Albatross_0005_5.jpg", "images.txt", 5
        ),
    ),
    "cub-class": ("cub200", _replace("image_class_labels.txt", "3 1\n", "3 99\n", "line 3", "99")),
    "cub-split-value": ("cub200", _replace("train_test_split.txt", "2 1\n", "2 yes\n", "line 2")),
    "cub-malformed": ("cub200", _replace("images.txt", "\n2 ", "\n2\n", "line 2")),
    "cub-no-label": ("cub200", _replace("image_class_labels.txt", "4 1\n", "", "image id 4")),
    "folder-test": ("image_folder", _rmtree("test")),
    "folder-class": ("image_folder", _folder_extra_class),
    "folder-empty-class": ("image_folder", _folder_empty_class),
    # a split list with no line: named, not the validation list nor "no images"
    "dtd-empty-train-list": ("dtd", _emptied("labels/train1.txt")),
    "dtd-empty-test-list": ("dtd", _emptied("labels/test1.txt")),
    "minc-empty-list": ("minc2500", _emptied("labels/test1.txt")),
    "mit-empty-list": ("mit_indoor", _emptied("TrainImages.txt")),
    # a class with no training image, as image_folder refuses it
    "dtd-empty-class": ("dtd", _empty_class("images/pleated", "labels/train1.txt")),
    "minc-empty-class": ("minc2500", _empty_class("images/glass", "labels/train1.txt")),
    "mit-empty-class": ("mit_indoor", _empty_class("Images/garage", "TrainImages.txt")),
    "cub-empty-class": ("cub200", _cub_empty_class),
    # an id that is not a whole number: a malformed line, not a missing one
    "cub-id": ("cub200", _replace("images.txt", "\n2 ", "\nb2 ", "line 2", "whole-number id")),
    "cub-repeated-id": (
        "cub200",
        _replace("train_test_split.txt", "\n3 1\n", "\n02 1\n", "line 3", "id 2 is on line 2"),
    ),
    # an image both trained and tested (or validated) on
    "dtd-leak": ("dtd", _leak("labels/test1.txt", "banded/banded_0002.jpg", "labels/train1.txt")),
    "minc-leak": (
        "minc2500",
        _leak("labels/validate1.txt", "images/wood/wood_000003.jpg", "labels/train1.txt"),
    ),
    "mit-leak": ("mit_indoor", _leak("TestImages.txt", "bakery/bakery_000.jpg", "TrainImages.txt")),
    "cub-leak": ("cub200", _cub_leak),
}


@pytest.mark.parametrize("case", list(LAYOUT_ERRORS))
def test_layout_errors_name_the_file(tmp_path: Path, case: str) -> None:
    name, mutate = LAYOUT_ERRORS[case]
    root = TREES[name](tmp_path / "data")
    fragments = mutate(root)
    with pytest.raises(DatasetLayoutError) as error:
        load(name, root)
    for fragment in fragments:
        assert fragment in str(error.value)


@pytest.mark.parametrize("name", IMAGE_DATASETS)
def test_missing_root(tmp_path: Path, name: str) -> None:
    with pytest.raises(DatasetLayoutError, match="does not exist") as error:
        load(name, tmp_path / "absent")
    assert str(tmp_path / "absent") in str(error.value)


@pytest.mark.parametrize("name", IMAGE_DATASETS)
def test_root_is_required(name: str) -> None:
    with pytest.raises(DatasetLayoutError, match="--data-root"):
        load(name, None)


@pytest.mark.parametrize(
    ("name", "root"),
    [
        ("dtd", ["", "dtd", "dtd/dtd"]),
        ("minc2500", ["", "minc-2500"]),
        ("cub200", ["", "CUB_200_2011"]),
    ],
)
def test_empty_root_lists_the_places_searched(tmp_path: Path, name: str, root: list[str]) -> None:
    with pytest.raises(DatasetLayoutError) as error:
        load(name, tmp_path)
    for place in root:
        assert str(tmp_path / place) in str(error.value)


@pytest.mark.parametrize(
    ("name", "partition", "valid"),
    [
        ("dtd", 0, "1..10"),
        ("dtd", 11, "1..10"),
        ("minc2500", 6, "1..5"),
        ("mit_indoor", 2, "must be 1"),
        ("cub200", 2, "must be 1"),
        ("image_folder", 0, "must be 1"),
        ("fashion_mnist", 2, "must be 1"),
    ],
)
def test_bad_partition(tmp_path: Path, name: str, partition: int, valid: str) -> None:
    root = TREES[name](tmp_path / "data")
    with pytest.raises(ValueError, match="partition") as error:
        load(name, root, partition)
    assert valid in str(error.value)


# --- Fashion-MNIST -----------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
@pytest.mark.parametrize("torchvision", [False, True], ids=["debian", "torchvision"])
def test_fashion_mnist_layouts(tmp_path: Path, gz: bool, torchvision: bool) -> None:
    root = make_fashion(tmp_path, gz=gz, torchvision=torchvision)
    splits = fashion_mnist(root, val_size=5, seed=1)
    assert sizes(splits) == (25, 5, 10)
    assert splits.classes == CLASSES
    assert (CLASSES[0], CLASSES[-1], len(CLASSES)) == ("T-shirt/top", "Ankle boot", 10)
    assert isinstance(splits.train, TensorImages)
    train_ids = set(splits.train.images[:, 0, 0].tolist())
    val_ids = set(tensors(splits.val).images[:, 0, 0].tolist())
    assert not train_ids & val_ids
    assert train_ids | val_ids == set(range(30))
    assert splits.train.targets == [i % 10 for i in sorted(train_ids)]
    assert splits.test.targets == list(range(10))
    again = fashion_mnist(root, val_size=5, seed=1)
    assert torch.equal(tensors(again.val).images, tensors(splits.val).images)


def test_fashion_mnist_bad_magic(tmp_path: Path) -> None:
    path = make_fashion(tmp_path) / "train-images-idx3-ubyte"
    path.write_bytes(b"\x00\x00\x07" + path.read_bytes()[3:])
    with pytest.raises(DatasetLayoutError, match="bad magic number") as error:
        fashion_mnist(tmp_path, val_size=5)
    assert str(path) in str(error.value)


def test_fashion_mnist_truncated(tmp_path: Path) -> None:
    path = make_fashion(tmp_path) / "t10k-labels-idx1-ubyte"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(DatasetLayoutError, match="truncated") as error:
        fashion_mnist(tmp_path, val_size=5)
    assert str(path) in str(error.value)


@pytest.mark.parametrize(
    "damage", [lambda raw: b"not gzip" + raw, lambda raw: raw[: len(raw) // 2]], ids=["junk", "cut"]
)
def test_fashion_mnist_corrupt_gzip(tmp_path: Path, damage: Callable[[bytes], bytes]) -> None:
    path = make_fashion(tmp_path, gz=True) / "train-labels-idx1-ubyte.gz"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DatasetLayoutError, match="is not a readable gzip file") as error:
        fashion_mnist(tmp_path, val_size=5)
    assert str(path) in str(error.value)


def test_an_unreadable_image_is_named(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "tree")
    bad = root / "train" / "cat" / "cat0.jpg"
    bad.write_text("not a jpeg")
    splits = load("image_folder", root)
    train = files(splits.train)
    dataset = train if bad in [p for p, _ in train.samples] else files(splits.val)
    index = [p for p, _ in dataset.samples].index(bad)
    with pytest.raises(
        DatasetLayoutError, match=r"cannot read image .*cat0\.jpg .*replace or remove"
    ):
        dataset[index]


def test_unreadable_images_of_every_split_are_named_before_any_is_decoded(tmp_path: Path) -> None:
    from training.datasets import check_readable

    root = make_folder(tmp_path / "tree")
    check_readable(load("image_folder", root))  # every file an image: nothing to say
    (root / "test" / "dog" / "dog1.jpg").write_bytes(b"")  # empty
    (root / "train" / "cat" / "cat0.jpg").write_text("<html>not a jpeg</html>")
    with pytest.raises(DatasetLayoutError) as error:
        check_readable(load("image_folder", root))
    message = str(error.value)
    assert message.startswith("2 image file(s) cannot be read: ")
    assert f"test: {root / 'test' / 'dog' / 'dog1.jpg'} (cannot identify image file" in message
    assert f"{root / 'train' / 'cat' / 'cat0.jpg'} (cannot identify image file" in message
    assert message.endswith(": replace or remove them")
    for name in ("cat1.PNG", "cat2.jpeg", "cat3.png", "cat4.jpg"):
        (root / "train" / "cat" / name).write_text("x")
    with pytest.raises(DatasetLayoutError, match=r"^6 image file\(s\) .*; and 1 more: replace"):
        check_readable(load("image_folder", root))
    for name in ("cat1.PNG", "cat2.jpeg", "cat3.png", "cat4.jpg", "cat0.jpg"):
        _image(root / "train" / "cat" / name)
    check_readable(load("image_folder", root), test=False)  # the broken test image is not read
    with pytest.raises(DatasetLayoutError, match=r"^1 image file\(s\) .*: test: "):
        check_readable(load("image_folder", root))


def test_fashion_mnist_missing_file(tmp_path: Path) -> None:
    (make_fashion(tmp_path) / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DatasetLayoutError, match="t10k-labels-idx1-ubyte") as error:
        fashion_mnist(tmp_path, val_size=5)
    assert str(tmp_path) in str(error.value)
    assert str(tmp_path / "FashionMNIST" / "raw") in str(error.value)


@pytest.mark.parametrize(
    ("array", "says"),
    [
        (np.zeros((30, 10, 10), np.uint8), "are 10 x 10 uint8"),
        (np.zeros((30, 28, 28), np.float32), "are 28 x 28 float32"),
    ],
    ids=["size", "dtype"],
)
def test_fashion_mnist_images_of_another_kind_are_refused(
    tmp_path: Path, array: np.ndarray, says: str
) -> None:
    path = make_fashion(tmp_path) / "train-images-idx3-ubyte"
    if array.dtype == np.uint8:
        write_idx(path, array)
    else:  # an idx file of big-endian float32 (type code 0x0D)
        header = bytes([0, 0, 0x0D, 3]) + np.array(array.shape, ">u4").tobytes()
        path.write_bytes(header + array.astype(">f4").tobytes())
    with pytest.raises(DatasetLayoutError, match=f"{says}; Fashion-MNIST's are 28 x 28 uint8"):
        fashion_mnist(tmp_path, val_size=5)


def test_fashion_mnist_labels_outside_its_classes_are_refused(tmp_path: Path) -> None:
    path = make_fashion(tmp_path) / "t10k-labels-idx1-ubyte"
    write_idx(path, np.full(10, 12, np.uint8))
    with pytest.raises(DatasetLayoutError, match=r"outside its 10 classes \(0 to 9\): 12 to 12"):
        fashion_mnist(tmp_path, val_size=5)
