"""Fashion-MNIST (Xiao et al. 2017) read from its idx files.

Looks for ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte`` and
``t10k-labels-idx1-ubyte`` (each optionally ``.gz``) in the root, or in ``root/FashionMNIST/raw``
(torchvision's download layout). Debian's package ``dataset-fashion-mnist`` installs them in
``/usr/share/datasets/fashion-mnist``, the default root.

Splits: ``val_size`` images (5,000 by default) are held out of the 60,000 training images by a
seeded permutation; the 10,000 test images are only for the reported accuracy.

``classes`` keeps some of the ten labels (an open-set experiment trains on 8 and holds 2 out as
unknown): every split then holds only the images of those classes, relabelled ``0..K-1`` in
label order, and the validation images are held out of the kept classes' training images.
"""

from __future__ import annotations

import copy
import gzip
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import DTypeLike
from torch import Tensor

from training.datasets.base import DatasetLayoutError, LabelledImages, Splits

#: Training images held out for validation by default.
VAL_SIZE = 5000

__all__ = [
    "CLASSES",
    "DEFAULT_ROOT",
    "TensorImages",
    "check_classes",
    "fashion_mnist",
    "keep_classes",
    "read_idx",
]

DEFAULT_ROOT = Path("/usr/share/datasets/fashion-mnist")
#: Class names as the dataset names them, in label order.
CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", 60_000),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", 10_000),
}
_DTYPES: dict[int, DTypeLike] = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def read_idx(path: Path) -> np.ndarray:
    """Read an idx file (LeCun's MNIST format), gzip-compressed or not, into an array.

    Header: two zero bytes, a type code, the number of dimensions d, then d big-endian uint32
    sizes; the data follows in C order.
    """
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as error:  # not gzip, truncated, corrupt
            raise DatasetLayoutError(
                f"{path} is not a readable gzip file ({error}): download it again, or put the "
                "uncompressed idx file beside it"
            ) from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise DatasetLayoutError(f"{path} is not an idx file (bad magic number)")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise DatasetLayoutError(
            f"{path} is truncated: its header names {ndim} dimensions, the file ends before "
            "their sizes"
        )
    shape = tuple(int(s) for s in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    dtype = np.dtype(_DTYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    data = raw[4 + 4 * ndim :]
    if len(data) != expected:
        raise DatasetLayoutError(
            f"{path} is truncated or padded: header says {shape} ({expected} bytes), "
            f"file has {len(data)} bytes of data"
        )
    return np.frombuffer(data, dtype).reshape(shape)


def _find(root: Path, name: str) -> Path:
    for folder in (root, root / "FashionMNIST" / "raw"):
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    raise DatasetLayoutError(
        f"expected Fashion-MNIST file {name}[.gz] in {root} or {root / 'FashionMNIST' / 'raw'}; "
        "install Debian's dataset-fashion-mnist (make data) or pass --data-root"
    )


def load_arrays(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images ``(N, 28, 28)`` uint8 and labels ``(N,)`` of the ``train`` or ``test`` files."""
    images_name, labels_name, _ = _FILES[split]
    images, labels = read_idx(_find(root, images_name)), read_idx(_find(root, labels_name))
    if images.ndim != 3 or labels.shape != (images.shape[0],):
        raise DatasetLayoutError(
            f"Fashion-MNIST {split} files in {root} disagree: images {images.shape}, "
            f"labels {labels.shape}"
        )
    if images.shape[1:] != (28, 28) or images.dtype != np.uint8:
        height, width, kind = *images.shape[1:], images.dtype.name
        raise DatasetLayoutError(
            f"the Fashion-MNIST {split} images in {root} are {height} x {width} {kind}; "
            "Fashion-MNIST's are 28 x 28 uint8 (another dataset's files? train your own images "
            "with --dataset image_folder)"
        )
    if labels.max(initial=0) >= len(CLASSES) or labels.min(initial=0) < 0:
        raise DatasetLayoutError(
            f"Fashion-MNIST labels in {root} are outside its 10 classes (0 to 9): "
            f"{labels.min()} to {labels.max()}"
        )
    return images, labels.astype(np.int64)


class TensorImages(LabelledImages):
    """In-memory grey images: item ``i`` is ``(transform(images[i] as (1, H, W) uint8), label)``."""

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        classes: list[str],
        transform: Callable[[Tensor], Any] | None = None,
    ) -> None:
        self.images = torch.from_numpy(np.array(images, copy=True))  # (N, H, W) uint8
        self.labels = torch.from_numpy(np.array(labels, copy=True))  # (N,) int64
        self.classes = classes
        self.transform = transform

    @property
    def targets(self) -> list[int]:
        return self.labels.tolist()

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image = self.images[index][None]  # (1, H, W)
        return (self.transform(image) if self.transform else image), int(self.labels[index])

    def with_transform(self, transform: Callable[[Tensor], Any] | None) -> TensorImages:
        """The same images and labels (shared, not copied) behind another transform."""
        other = copy.copy(self)
        other.transform = transform
        return other

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, int]]:
        """A batch at once (the data loader's fast path): one batched transform when it has one."""
        batch_fn = getattr(self.transform, "batch", None)
        if batch_fn is None:
            return [self[i] for i in indices]
        index = torch.as_tensor(indices)
        images = batch_fn(self.images[index][:, None])  # (B, 1, S, S)
        return list(zip(images, self.labels[index].tolist(), strict=True))


def check_classes(classes: Sequence[int]) -> list[int]:
    """``classes`` sorted, or ``ValueError`` saying what is wrong: at least two distinct labels
    from 0 to 9 (integers, not names)."""
    labels = list(classes)
    if any(not isinstance(c, int) or isinstance(c, bool) for c in labels):
        raise ValueError(
            f"classes must be Fashion-MNIST labels (integers 0-9), got {labels!r}; "
            f"the labels: {', '.join(f'{i} {name}' for i, name in enumerate(CLASSES))}"
        )
    outside = sorted({c for c in labels if not 0 <= c < len(CLASSES)})
    if outside:
        raise ValueError(
            f"classes {outside} are not Fashion-MNIST labels: give labels from 0 to "
            f"{len(CLASSES) - 1} ({', '.join(f'{i} {name}' for i, name in enumerate(CLASSES))})"
        )
    twice = sorted({c for c in labels if labels.count(c) > 1})
    if twice:
        raise ValueError(f"classes {twice} given more than once: name each class once")
    if len(labels) < 2:
        raise ValueError(f"classes {labels}: a classifier needs at least two classes")
    return sorted(labels)


def keep_classes(
    images: np.ndarray, labels: np.ndarray, classes: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """The images ``(N, H, W)`` whose label is in ``classes`` (sorted), and their labels
    renumbered by position in ``classes``: ``(M, H, W)``, ``(M,)`` int64."""
    kept = np.asarray(classes)
    mask = np.isin(labels, kept)
    return images[mask], np.searchsorted(kept, labels[mask]).astype(np.int64)


def fashion_mnist(
    root: str | Path | None = None,
    train_transform: Callable[[Tensor], Any] | None = None,
    eval_transform: Callable[[Tensor], Any] | None = None,
    val_size: int = VAL_SIZE,
    seed: int = 0,
    download: bool = False,
    classes: Sequence[int] | None = None,
) -> Splits:
    """Fashion-MNIST's train (60,000 - val_size), validation (val_size) and test (10,000) splits.

    ``classes`` (labels 0-9, at least two): only those classes' images, relabelled ``0..K-1`` in
    label order; ``val_size`` is then held out of their training images. ``download=True``
    fetches the files with torchvision when they are missing (needs internet).
    """
    kept = None if classes is None else check_classes(classes)
    root = Path(root) if root is not None else DEFAULT_ROOT
    if download:
        try:
            _find(root, _FILES["test"][0])
        except DatasetLayoutError:
            import torchvision

            torchvision.datasets.FashionMNIST(str(root), train=True, download=True)
            torchvision.datasets.FashionMNIST(str(root), train=False, download=True)
    images, labels = load_arrays(root, "train")
    test_images, test_labels = load_arrays(root, "test")
    names, which = list(CLASSES), "training images"
    if kept is not None:
        images, labels = keep_classes(images, labels, kept)
        test_images, test_labels = keep_classes(test_images, test_labels, kept)
        names = [CLASSES[c] for c in kept]
        which = f"training images of classes {kept}"
    if not 0 < val_size < len(labels):
        raise ValueError(f"val_size must be in (0, {len(labels)}), got {val_size}")
    order = np.random.default_rng(seed).permutation(len(labels))
    val_idx, train_idx = np.sort(order[:val_size]), np.sort(order[val_size:])
    train = TensorImages(images[train_idx], labels[train_idx], names, train_transform)
    return Splits(
        train=train,
        val=TensorImages(images[val_idx], labels[val_idx], names, eval_transform),
        test=TensorImages(test_images, test_labels, names, eval_transform),
        classes=list(names),
        train_eval=train.with_transform(eval_transform),
        validation=f"{val_size} of the {len(labels)} {which} held out at random (seed {seed})",
    )
