"""What every dataset layout shares: the layout error, and a dataset of labelled image files."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image
from torch.utils.data import Dataset

__all__ = ["DatasetLayoutError", "ImageList", "Splits", "read_lines", "require"]


class DatasetLayoutError(FileNotFoundError):
    """A dataset root that is missing or does not have the layout its dataset publishes.

    The message names the file or folder that was expected and where.
    """


def require(path: Path, what: str) -> Path:
    """Return ``path`` if it exists, else raise ``DatasetLayoutError`` naming it and ``what``."""
    if not path.exists():
        raise DatasetLayoutError(f"expected {what} at {path}, but it does not exist")
    return path


def read_lines(path: Path, what: str) -> list[str]:
    """The non-empty, stripped lines of a required text file."""
    return [line.strip() for line in require(path, what).read_text().splitlines() if line.strip()]


class ImageList(Dataset):
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
        with Image.open(path) as img:
            image = img.convert(self.mode)
        return (self.transform(image) if self.transform else image), label


@dataclass(frozen=True)
class Splits:
    """A dataset's train / validation / test splits (already transformed) and its class names."""

    train: Dataset
    val: Dataset
    test: Dataset
    classes: list[str]
