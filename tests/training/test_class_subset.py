"""Training on some of Fashion-MNIST's classes (``classes``): the splits hold exactly those
classes' images, relabelled in label order; bad values are one clear error; a run's checkpoint
and the splits its export reads agree."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.training.conftest import learnable_images, tensors, write_fashion_mnist
from training.checkpoint import load_checkpoint
from training.config import ConfigError, TrainConfig, parse_train_config
from training.datasets import load_splits
from training.datasets.fashion_mnist import CLASSES, check_classes, fashion_mnist
from training.evaluate import load_with_splits
from training.train import fit

ROOT = Path(__file__).resolve().parents[2]
HELD_OUT_CONFIG = ROOT / "configs" / "fashion-mnist-smso-heldout.toml"


@pytest.fixture(scope="module")
def fmnist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 training and 100 test images, 30 and 10 per class (the conftest's synthetic ones)."""
    return write_fashion_mnist(tmp_path_factory.mktemp("fmnist"), 300, 100)


def test_each_split_holds_the_kept_classes_relabelled(fmnist: Path) -> None:
    splits = fashion_mnist(fmnist, val_size=50, seed=3, classes=[7, 2, 5])
    train_images, train_labels = learnable_images(300, seed=1)  # what the files hold
    test_images, test_labels = learnable_images(100, seed=2)
    assert splits.classes == ["Pullover", "Sandal", "Sneaker"]  # labels 2, 5, 7 -> 0, 1, 2
    val, train, test = tensors(splits.val), tensors(splits.train), tensors(splits.test)
    assert (len(val), len(train), len(test)) == (50, 90 - 50, 30)
    # every kept training image is in train or val, once, with its new label
    kept = np.isin(train_labels, [2, 5, 7])
    ours = np.concatenate([train.images.numpy(), val.images.numpy()])
    labels = np.concatenate([train.labels.numpy(), val.labels.numpy()])
    order = np.lexsort(ours.reshape(len(ours), -1).T)
    theirs = train_images[kept]
    expected = np.searchsorted([2, 5, 7], train_labels[kept])
    reference = np.lexsort(theirs.reshape(len(theirs), -1).T)
    np.testing.assert_array_equal(ours[order], theirs[reference])
    np.testing.assert_array_equal(labels[order], expected[reference])
    np.testing.assert_array_equal(test.images.numpy(), test_images[np.isin(test_labels, [2, 5, 7])])
    np.testing.assert_array_equal(
        test.labels.numpy(),
        np.searchsorted([2, 5, 7], test_labels[np.isin(test_labels, [2, 5, 7])]),
    )
    assert "classes [2, 5, 7]" in splits.validation


def test_all_classes_is_the_split_without_the_option(fmnist: Path) -> None:
    every = fashion_mnist(fmnist, val_size=50, seed=3, classes=list(range(10)))
    plain = fashion_mnist(fmnist, val_size=50, seed=3)
    assert every.classes == plain.classes == CLASSES
    for split in ("train", "val", "test"):
        a, b = tensors(getattr(every, split)), tensors(getattr(plain, split))
        assert torch.equal(a.images, b.images), split
        assert torch.equal(a.labels, b.labels), split


@pytest.mark.parametrize(
    ("classes", "message"),
    [
        ([3], "at least two classes"),
        ([], "at least two classes"),
        ([0, 10], "classes [10] are not Fashion-MNIST labels"),
        ([-1, 2], "classes [-1] are not Fashion-MNIST labels"),
        ([1, 1, 2], "classes [1] given more than once"),
        ([0, "Shirt"], "integers 0-9"),
        ([0, True], "integers 0-9"),
    ],
)
def test_bad_classes_are_named(classes: list, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_classes(classes)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        TrainConfig(classes=classes)


def test_classes_belong_to_fashion_mnist_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="read by fashion_mnist only, not dtd"):
        TrainConfig(dataset="dtd", data_root=str(tmp_path), classes=[0, 1])
    with pytest.raises(ValueError, match="read by fashion_mnist only, not dtd"):
        load_splits("dtd", tmp_path, classes=[0, 1])


def test_classes_from_a_file_and_from_flags(tmp_path: Path) -> None:
    held_out = parse_train_config(["--config", str(HELD_OUT_CONFIG)])
    assert held_out.classes == [0, 1, 2, 3, 4, 5, 8, 9]  # Shirt (6) and Sneaker (7) held out
    shipped = parse_train_config(["--config", str(ROOT / "configs" / "fashion-mnist-smso.toml")])
    # the held-out model's recipe is the shipped one, but for its classes
    assert held_out.to_dict() == shipped.to_dict() | {"classes": [0, 1, 2, 3, 4, 5, 8, 9]}
    assert parse_train_config(["--classes", "4", "0"]).classes == [4, 0]
    config = tmp_path / "run.toml"
    config.write_text('classes = "0 1"\n')
    with pytest.raises(ConfigError, match="setting classes must be list or null"):
        parse_train_config(["--config", str(config)])
    with pytest.raises(SystemExit):  # argparse: not an integer
        parse_train_config(["--classes", "Shirt"])
    saved = parse_train_config(["--classes", "0", "1"]).to_dict()
    assert TrainConfig.from_dict(json.loads(json.dumps(saved))).classes == [0, 1]


@pytest.mark.slow
def test_a_run_on_some_classes_and_the_splits_its_export_reads(fmnist: Path, tmp_path: Path):
    cfg = TrainConfig(
        dataset="fashion_mnist",
        data_root=str(fmnist),
        classes=[0, 1, 2, 3, 4, 5, 8, 9],
        val_size=40,
        head_options={"dim": 4},
        reduce_dim=8,
        epochs=1,
        batch_size=32,
        workers=0,
        channels_last=False,
        out=str(tmp_path / "run"),
    )
    result = fit(cfg)
    payload = load_checkpoint(tmp_path / "run" / "best.pt")
    names = [CLASSES[c] for c in cfg.classes or []]
    assert payload["classes"] == names
    assert result.model.eval()(torch.zeros(2, 1, 28, 28)).logits.shape == (2, 8)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["classes"] == [0, 1, 2, 3, 4, 5, 8, 9]
    test = json.loads((tmp_path / "run" / "test.json").read_text())
    assert test["test_images"] == 80  # 10 test images of each of the 8 classes
    assert test["classes"] == names
    _, loaded, splits = load_with_splits(tmp_path / "run" / "best.pt")
    assert loaded.classes == cfg.classes
    assert splits.classes == names
    direct = fashion_mnist(fmnist, val_size=40, seed=0, classes=cfg.classes)
    assert torch.equal(tensors(splits.val).images, tensors(direct.val).images)
    assert sorted(set(tensors(splits.test).labels.tolist())) == list(range(8))
