"""What every dataset layout shares: the layout error, finding the root, reading split lists, the
seeded validation hold-out, and a dataset of labelled image files."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from training.datasets.presets import Preset

__all__ = [
    "IMAGE_EXTENSIONS",
    "VAL_FRACTION",
    "DatasetLayoutError",
    "ImageList",
    "Splits",
    "check_disjoint",
    "check_every_class",
    "check_partition",
    "check_readable",
    "class_folders",
    "holdout_rule",
    "image_splits",
    "locate",
    "need_root",
    "numbered_lines",
    "read_image_list",
    "read_lines",
    "require",
    "stratified_holdout",
]

T = TypeVar("T")

#: Share of each class's training images held out for validation where a dataset has no
#: validation split of its own (MIT-Indoor, CUB-200-2011, an ImageFolder tree without val/).
VAL_FRACTION = 0.1
#: File name endings read as images (case-insensitive) in ImageFolder trees.
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})


class DatasetLayoutError(FileNotFoundError):
    """A dataset root that is missing or does not have the layout its dataset publishes.

    The message names the file or folder that was expected and where.
    """


def require(path: Path, what: str, kind: str | None = None) -> Path:
    """Return ``path`` if it exists, else raise ``DatasetLayoutError`` naming it and ``what``.

    ``kind`` ``"file"`` or ``"folder"`` also requires that kind of entry.
    """
    if not path.exists():
        raise DatasetLayoutError(f"expected {what} at {path}, but it does not exist")
    if (kind == "file" and not path.is_file()) or (kind == "folder" and not path.is_dir()):
        raise DatasetLayoutError(f"expected {what} at {path} to be a {kind}, but it is not")
    return path


def need_root(root: Path | None, dataset: str) -> Path:
    """The dataset's root folder: it has no default location, so it must be given and exist."""
    if root is None:
        raise DatasetLayoutError(
            f"{dataset} has no default location; pass the folder holding it with --data-root"
        )
    return require(Path(root), f"the {dataset} dataset folder (--data-root)", "folder")


def locate(root: Path, candidates: Sequence[Path], markers: Sequence[str], dataset: str) -> Path:
    """The first of ``candidates`` that holds any of ``markers`` (the dataset's own entries)."""
    for folder in candidates:
        if any((folder / marker).exists() for marker in markers):
            return folder
    names = " and ".join(markers)
    places = ", ".join(str(c) for c in candidates)
    raise DatasetLayoutError(f"expected {dataset}'s {names} in one of: {places}; none found")


def check_partition(partition: int, count: int, dataset: str) -> None:
    """Raise ``ValueError`` unless ``1 <= partition <= count``."""
    if count == 1 and partition != 1:
        raise ValueError(f"{dataset} has a single partition: partition must be 1, got {partition}")
    if not 1 <= partition <= count:
        raise ValueError(f"{dataset} partition must be in 1..{count}, got {partition}")


def read_lines(path: Path, what: str) -> list[str]:
    """The non-empty, stripped lines of a required text file."""
    return [line for _, line in numbered_lines(path, what)]


def numbered_lines(path: Path, what: str) -> list[tuple[int, str]]:
    """``(line number from 1, stripped line)`` for the non-empty lines of a required text file."""
    try:
        text = require(path, what, "file").read_text()
    except UnicodeDecodeError:
        raise DatasetLayoutError(
            f"expected {what} at {path} to be a text file (UTF-8), but it is not"
        ) from None
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def class_folders(folder: Path, what: str) -> list[str]:
    """Sorted names of the (non-hidden) subfolders of a required folder; at least one."""
    names = sorted(
        p.name for p in require(folder, what, "folder").iterdir() if p.is_dir() and p.name[0] != "."
    )
    if not names:
        raise DatasetLayoutError(f"expected one subfolder per class in {folder}, found none")
    return names


def read_image_list(
    list_file: Path,
    what: str,
    base: Path,
    class_index: Mapping[str, int],
    classes_from: str,
    class_part: int = 0,
) -> list[tuple[Path, int]]:
    """The labelled images a split list names, one path relative to ``base`` per line.

    An image's class is component ``class_part`` of its path (``brick`` in
    ``images/brick/brick_000001.jpg`` with ``class_part=1``). A line whose class is not in
    ``class_index`` (read from ``classes_from``, named in the message) or whose image is missing
    raises ``DatasetLayoutError`` with its line number; so does a list without a line.
    """
    lines = numbered_lines(list_file, what)
    if not lines:
        raise DatasetLayoutError(
            f"expected {what} at {list_file} to list images, one per line, but it is empty"
        )
    samples = []
    for number, line in lines:
        where = f"{list_file}, line {number}"
        parts = PurePosixPath(line).parts
        if len(parts) <= class_part + 1:
            raise DatasetLayoutError(
                f"{where}: expected an image path with its class as folder {class_part + 1}, "
                f"got {line!r}"
            )
        name = parts[class_part]
        if name not in class_index:
            raise DatasetLayoutError(
                f"{where}: class {name!r} of {line!r} is not one of the {len(class_index)} "
                f"classes in {classes_from}"
            )
        path = base.joinpath(*parts)
        if not path.is_file():
            raise DatasetLayoutError(f"{where}: image {path} does not exist")
        samples.append((path, class_index[name]))
    return samples


def check_every_class(
    samples: Sequence[tuple[Path, int]], classes: Sequence[str], listed_in: str, classes_from: str
) -> None:
    """``DatasetLayoutError`` naming the classes (read from ``classes_from``) of which
    ``samples``, the training images ``listed_in`` names, hold none: a class the model has an
    output for but never sees (an empty class folder, a class left out of the list)."""
    seen = {label for _, label in samples}
    empty = [name for label, name in enumerate(classes) if label not in seen]
    if empty:
        named = ", ".join(map(repr, empty[:5])) + (
            f" and {len(empty) - 5} more" if len(empty) > 5 else ""
        )
        which = f"class {named} has" if len(empty) == 1 else f"classes {named} have"
        raise DatasetLayoutError(
            f"{which} no training image in {listed_in} (of the {len(classes)} classes in "
            f"{classes_from}): every class needs training images; list some there, or remove "
            f"the class from {classes_from}"
        )


def check_disjoint(splits: Mapping[str, Sequence[tuple[Path, int]]]) -> None:
    """``DatasetLayoutError`` naming an image that two of ``splits`` (named by where they were
    read, e.g. ``{"TrainImages.txt": ..., "TestImages.txt": ...}``) both hold: an image tested
    or validated on must not be one trained on."""
    seen: dict[Path, str] = {}
    for name, samples in splits.items():
        for path, _ in samples:
            earlier = seen.setdefault(path, name)
            if earlier != name:
                raise DatasetLayoutError(
                    f"image {path} is in both {earlier} and {name}: an image the model is "
                    "tested or validated on must not be one it trains on; remove it from one "
                    "of them"
                )


def stratified_holdout(
    samples: Sequence[tuple[T, int]], fraction: float = VAL_FRACTION, seed: int = 0
) -> tuple[list[tuple[T, int]], list[tuple[T, int]]]:
    """Split ``(item, label)`` pairs into ``(train, val)``, ``fraction`` of each class to val.

    Per class of n samples, ``round(n * fraction)`` go to val, but at least one when n >= 2 and
    never all of them (a class of one sample stays in train). Which ones is drawn by a generator
    seeded with ``seed``, so the same samples and seed give the same split; both lists keep the
    input order.
    """
    by_label: dict[int, list[int]] = defaultdict(list)
    for index, (_, label) in enumerate(samples):
        by_label[label].append(index)
    rng = np.random.default_rng(seed)
    held: set[int] = set()
    for label in sorted(by_label):
        indices = by_label[label]
        n = len(indices)
        k = min(max(round(n * fraction), 1), n - 1) if n >= 2 else 0
        held.update(indices[i] for i in rng.permutation(n)[:k])
    train = [s for i, s in enumerate(samples) if i not in held]
    val = [s for i, s in enumerate(samples) if i in held]
    return train, val


def holdout_rule(fraction: float, seed: int, split: str) -> str:
    """``stratified_holdout``'s rule in words, for ``Splits.validation``."""
    return f"{fraction:.0%} of each class of {split} held out at random (seed {seed})"


class LabelledImages(Dataset[tuple[Any, int]]):
    """What every split is: a map-style dataset of ``(image, label)`` items with a length, its
    labels and its class names (torch's ``Dataset`` declares no ``__len__``)."""

    classes: list[str]

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int) -> tuple[Any, int]:
        raise NotImplementedError

    @property
    def targets(self) -> list[int]:
        """Labels in item order."""
        raise NotImplementedError

    def unreadable(self) -> list[str]:
        """What makes items unreadable before any is read, one line per item (``"path
        (reason)"``); none for images held in memory."""
        return []


class ImageList(LabelledImages):
    """Labelled image files: item ``i`` is ``(transform(RGB image), label)``.

    Args:
        samples: ``(path, label)`` pairs, labels in ``[0, len(classes))``.
        classes: class names in label order.
        transform: applied to the PIL image (None: the PIL image itself).
        mode: PIL mode the images are converted to (``"RGB"``, or ``"L"`` for grey).
    """

    def __init__(
        self,
        samples: Sequence[tuple[Path, int]],
        classes: Sequence[str],
        transform: Callable[[Image.Image], Any] | None = None,
        mode: str = "RGB",
    ) -> None:
        self.samples = list(samples)
        self.classes = list(classes)
        self.transform = transform
        self.mode = mode

    @property
    def targets(self) -> list[int]:
        """Labels in item order."""
        return [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        try:
            with Image.open(path) as img:
                image = img.convert(self.mode)
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
            # not an image, truncated, or a format PIL cannot decode: name the file
            raise DatasetLayoutError(
                f"cannot read image {path} ({error}): replace or remove it"
            ) from None
        return (self.transform(image) if self.transform else image), label

    def unreadable(self) -> list[str]:
        """Files whose header PIL cannot read (empty, not an image, a format PIL does not
        know): ``"path (reason)"`` each. Headers only, about 0.1 ms a file; a file cut short
        after its header is found when it is decoded."""
        bad = []
        for path, _ in self.samples:
            try:
                with Image.open(path):
                    pass
            except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
                bad.append(f"{path} ({error})")
        return bad

    def with_transform(self, transform: Callable[[Image.Image], Any] | None) -> ImageList:
        """The same images and labels behind another transform."""
        return ImageList(self.samples, self.classes, transform, self.mode)


@dataclass(frozen=True)
class Splits:
    """A dataset's train / validation / test splits (already transformed) and its class names.

    ``train_eval`` holds the training images with the evaluation transform (no augmentation): the
    data for statistics of the trained model's inputs, such as SMSO's recalibrated ``Sigma``.
    ``validation`` says in words where the validation images came from (saved with the run).
    """

    train: LabelledImages
    val: LabelledImages
    test: LabelledImages
    classes: list[str]
    train_eval: LabelledImages
    validation: str = ""  # how the validation split was made, e.g. "10% of each class of train"


def check_readable(splits: Splits, test: bool = True) -> None:
    """``DatasetLayoutError`` naming the files of the train, validation and (``test``) test
    splits that cannot be read as images (up to five of them, and how many in all), so that a
    broken test image is found before training rather than after it."""
    named = [("train", splits.train), ("val", splits.val)] + [("test", splits.test)] * test
    bad = [f"{name}: {line}" for name, split in named for line in split.unreadable()]
    if bad:
        more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise DatasetLayoutError(
            f"{len(bad)} image file(s) cannot be read: {'; '.join(bad[:5])}{more}: replace or "
            "remove them"
        )


def image_splits(
    train: Sequence[tuple[Path, int]],
    val: Sequence[tuple[Path, int]],
    test: Sequence[tuple[Path, int]],
    classes: Sequence[str],
    preset: Preset,
    validation: str = "",
) -> Splits:
    """RGB ``ImageList`` splits: train with the preset's training transform, val and test with
    its evaluation transform; ``validation`` says where val came from."""
    train_tf, eval_tf = preset.train_transform(), preset.eval_transform()
    train_images = ImageList(train, classes, train_tf)
    return Splits(
        train=train_images,
        val=ImageList(val, classes, eval_tf),
        test=ImageList(test, classes, eval_tf),
        classes=list(classes),
        train_eval=train_images.with_transform(eval_tf),
        validation=validation,
    )
