"""``python -m training.datasets.image_tree``: Fashion-MNIST's idx files written as an ImageFolder
tree that ``--dataset image_folder`` reads, checked on a tiny idx folder in Debian's layout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from training.datasets import load_splits
from training.datasets.fashion_mnist import CLASSES, read_idx
from training.datasets.image_tree import (
    FOLDERS,
    ImageTreeError,
    folder_name,
    main,
    write_image_tree,
)

ROOT = Path(__file__).resolve().parents[2]


def _pngs(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.png"))


def test_folder_names_are_the_class_names_made_safe() -> None:
    assert folder_name("T-shirt/top") == "t-shirt-top"
    assert folder_name("Ankle boot") == "ankle-boot"
    assert len(set(FOLDERS)) == len(CLASSES) == 10
    assert all("/" not in name and name == name.lower() for name in FOLDERS)


def test_each_class_gets_its_first_images_in_file_order(tiny_fashion_mnist: Path, tmp_path):
    tree = write_image_tree(tmp_path / "my-images", 5, 2, data_root=tiny_fashion_mnist)
    assert tree.classes == sorted(FOLDERS)
    assert (tree.train_per_class, tree.test_per_class, tree.images) == (5, 2, 70)
    for split, prefix, count in (("train", "train", 5), ("test", "t10k", 2)):
        images = read_idx(tiny_fashion_mnist / f"{prefix}-images-idx3-ubyte.gz")
        labels = read_idx(tiny_fashion_mnist / f"{prefix}-labels-idx1-ubyte.gz")
        assert sorted(p.name for p in (tree.root / split).iterdir()) == sorted(FOLDERS)
        for label, name in enumerate(FOLDERS):
            files = _pngs(tree.root / split / name)
            assert [p.name for p in files] == [f"{i:03d}.png" for i in range(count)]
            expected = images[labels == label][:count]
            for file, pixels in zip(files, expected, strict=True):
                with Image.open(file) as image:
                    assert (image.mode, image.size) == ("L", (28, 28))
                    np.testing.assert_array_equal(np.asarray(image), pixels)


def test_the_image_folder_dataset_reads_the_tree(tiny_fashion_mnist: Path, tmp_path):
    classes = ["trouser", "bag", "ankle-boot"]
    tree = write_image_tree(tmp_path / "tree", 10, classes=classes, data_root=tiny_fashion_mnist)
    root = tree.root
    splits, _ = load_splits("image_folder", root)
    assert splits.classes == ["ankle-boot", "bag", "trouser"]  # sorted: label 0 is ankle-boot
    assert len(splits.train) + len(splits.val) == 30  # 10 of each, 10 % held out for validation
    assert len(splits.test) == 6  # a fifth of 10 each
    assert not (root / "val").exists()


def test_unknown_class_names_the_valid_ones(tiny_fashion_mnist: Path, tmp_path):
    with pytest.raises(ImageTreeError, match=r"no Fashion-MNIST class is called cat.*t-shirt-top"):
        write_image_tree(tmp_path / "t", 5, classes=["cat", "bag"], data_root=tiny_fashion_mnist)
    with pytest.raises(ImageTreeError, match="at least two classes"):
        write_image_tree(tmp_path / "t", 5, classes=["bag"], data_root=tiny_fashion_mnist)
    assert not (tmp_path / "t").exists()


def test_more_images_than_a_class_has_is_refused_and_leaves_nothing(
    tiny_fashion_mnist: Path, tmp_path
):
    with pytest.raises(ImageTreeError, match="has 20 images of t-shirt-top, fewer than the 21"):
        write_image_tree(tmp_path / "t", 21, 1, data_root=tiny_fashion_mnist)
    assert list(tmp_path.iterdir()) == []  # neither the tree nor its partial copy


def test_an_existing_folder_is_kept_as_it_is(tiny_fashion_mnist: Path, tmp_path):
    out = tmp_path / "my-images"
    (out / "train").mkdir(parents=True)
    with pytest.raises(ImageTreeError, match="already exists and is not an empty folder"):
        write_image_tree(out, 5, data_root=tiny_fashion_mnist)
    assert [p.name for p in out.iterdir()] == ["train"]
    (out / "train").rmdir()
    assert write_image_tree(out, 1, data_root=tiny_fashion_mnist).root == out  # an empty one: used


def test_the_command_prints_what_it_wrote(tiny_fashion_mnist: Path, tmp_path, capsys):
    out = tmp_path / "my-images"
    arguments = ["--out", str(out), "--per-class", "3", "--data-root", str(tiny_fashion_mnist)]
    assert main(arguments) == 0
    assert capsys.readouterr().out == (
        f"{out}: 10 classes, 3 training and 1 test images each (train/<class>/, test/<class>/)\n"
    )
    assert len(list(out.glob("*/*/*.png"))) == 40


def test_a_mistake_is_one_line_and_status_2(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "t"), "--per-class", "3", "--data-root", str(tmp_path)])
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("python -m training.datasets.image_tree: error: expected Fashion-MNIST")
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(tmp_path / "t"), "--per-class", "0"])
    assert exit_.value.code == 2


def test_it_runs_as_a_module(tiny_fashion_mnist: Path, tmp_path):
    arguments = ["--out", "t", "--per-class", "2", "--classes", "bag", "trouser", "--data-root"]
    done = subprocess.run(
        [sys.executable, "-m", "training.datasets.image_tree", *arguments, str(tiny_fashion_mnist)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "t" / "train").iterdir()) == ["bag", "trouser"]
