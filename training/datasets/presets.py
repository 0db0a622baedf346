"""Per-dataset input presets: size, resize and crop policy, normalisation, augmentation.

Training follows Lin et al. (B-CNN), as the paper does: resize the shorter side, take a random
crop of the input size and flip horizontally. Evaluation resizes the same way and takes the centre
crop. Random erasing (Zhong et al., AAAI 2020) is off unless a recipe asks for it. The same policy
is written into the exported model card so the service preprocesses alike.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from torchvision.transforms import v2

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "PRESETS", "Preset"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: Random erasing's rectangle: area fraction of the crop and log-uniform aspect ratio h / w,
#: torchvision's defaults; the rectangle is set to 0, the mean after normalisation.
ERASE_SCALE = (0.02, 0.33)
ERASE_RATIO = (0.3, 3.3)


@dataclass(frozen=True)
class Preset:
    """How images of one dataset are fed to the model."""

    image_size: int  # side of the square crop the model sees
    resize: int | None  # shorter side is resized to this first; None: no resize
    channels: int  # 3 (RGB) or 1 (grey)
    mean: tuple[float, ...]  # per-channel mean after scaling to [0, 1]
    std: tuple[float, ...]  # per-channel standard deviation
    pad: int = 0  # zero padding before the random crop (small images)
    flip: bool = True  # random horizontal flip in training
    erase: float = 0.0  # probability of random erasing in training (0: off)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for checkpoints and the model card."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Preset:
        """Inverse of ``to_dict`` (lists read back from JSON become tuples)."""
        return cls(**{**data, "mean": tuple(data["mean"]), "std": tuple(data["std"])})

    def with_size(self, image_size: int) -> Preset:
        """The same policy at another input size (resize scaled in proportion)."""
        resize = None if self.resize is None else round(self.resize * image_size / self.image_size)
        return dataclasses.replace(self, image_size=image_size, resize=resize)

    def _resize(self) -> list[v2.Transform]:
        return [] if self.resize is None else [v2.Resize(self.resize, antialias=True)]

    def _finish(self) -> list[v2.Transform]:
        # Resize and crop run before ToImage: on a PIL image they are Pillow's own resize and
        # crop, which the service (Pillow, no torch) reproduces exactly.
        return [
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(self.mean, self.std),
        ]

    def train_transform(self) -> v2.Compose | SmallImageTransform:
        """PIL image or uint8 tensor -> normalised float tensor ``(C, S, S)``, augmented.

        Without a resize (small images such as Fashion-MNIST's) this is ``SmallImageAugment``,
        the same operations written on whole batches of tensors: torchvision's per-image pipeline
        would cost about a third of the small model's training step.
        """
        if self.resize is None:
            return SmallImageTransform(self, train=True)
        ops: list[v2.Transform] = [*self._resize()]
        ops.append(v2.RandomCrop(self.image_size, padding=self.pad or None, pad_if_needed=True))
        if self.flip:
            ops.append(v2.RandomHorizontalFlip())
        ops += self._finish()
        if self.erase > 0:
            ops.append(v2.RandomErasing(self.erase, ERASE_SCALE, ERASE_RATIO, value=0))
        return v2.Compose(ops)

    def eval_transform(self) -> v2.Compose | SmallImageTransform:
        """PIL image or uint8 tensor -> normalised float tensor ``(C, S, S)``, centre crop."""
        if self.resize is None:
            return SmallImageTransform(self, train=False)
        ops = [*self._resize(), v2.CenterCrop(self.image_size)]
        return v2.Compose(ops + self._finish())


class SmallImageTransform:
    """Pad, random crop and random flip (training) or centre crop (eval), normalise, and erase.

    For small images without a resize step, written on whole batches: ``batch`` maps
    ``(B, C, H, W)`` uint8 -> ``(B, C, S, S)`` float32 in a few tensor operations, and a single
    image ``(C, H, W)`` (tensor or PIL) goes through the same code. Randomness comes from torch's
    global generator, so it follows ``torch.manual_seed`` and the data loader's worker seeds.
    """

    def __init__(self, preset: Preset, train: bool) -> None:
        self.preset = preset
        self.train = train
        self.mean = torch.tensor(preset.mean).view(1, -1, 1, 1)
        self.std = torch.tensor(preset.std).view(1, -1, 1, 1)

    def __call__(self, image: torch.Tensor | Image.Image) -> torch.Tensor:
        x = image if isinstance(image, torch.Tensor) else v2.functional.pil_to_tensor(image)
        return self.batch(x[None])[0]

    def batch(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` uint8 -> ``(B, C, S, S)`` float32, normalised."""
        size = self.preset.image_size
        pad = self.preset.pad if self.train else 0
        h, w = x.shape[-2:]
        extra_h, extra_w = max(0, size - h - 2 * pad), max(0, size - w - 2 * pad)
        x = torch.nn.functional.pad(x, (pad, pad + extra_w, pad, pad + extra_h))  # (B, C, H', W')
        b, _, h, w = x.shape
        if self.train:
            top = torch.randint(h - size + 1, (b, 1, 1))
            left = torch.randint(w - size + 1, (b, 1, 1))
        else:
            top = torch.full((b, 1, 1), (h - size) // 2)
            left = torch.full((b, 1, 1), (w - size) // 2)
        rows = top + torch.arange(size).view(1, -1, 1)  # (B, S, 1)
        cols = left + torch.arange(size).view(1, 1, -1)  # (B, 1, S)
        if self.train and self.preset.flip:
            flip = torch.rand(b, 1, 1) < 0.5
            cols = torch.where(flip, 2 * left + size - 1 - cols, cols)
        x = x[torch.arange(b).view(-1, 1, 1), :, rows, cols]  # (B, S, S, C)
        x = x.permute(0, 3, 1, 2).float() / 255.0  # (B, C, S, S)
        x = (x - self.mean) / self.std
        if self.train and self.preset.erase > 0:
            x = x.masked_fill(erase_mask(b, size, self.preset), 0.0)
        return x


def erase_mask(batch: int, size: int, preset: Preset, attempts: int = 10) -> torch.Tensor:
    """Random erasing's rectangles for a batch of ``size`` x ``size`` crops: ``(B, 1, S, S)`` bool.

    Each image is erased with probability ``preset.erase``. As torchvision's ``RandomErasing``,
    a rectangle has area ``a ~ U(scale) * S^2`` and aspect ``r = h / w`` log-uniform in ``ratio``,
    ``h = round(sqrt(a r))``, ``w = round(sqrt(a / r))``; of ``attempts`` draws the first with
    ``h, w < S`` is used (none fits: no erasing), placed uniformly inside the crop.
    """
    low, high = ERASE_SCALE
    area = size * size * (low + (high - low) * torch.rand(batch, attempts))
    log_low, log_high = math.log(ERASE_RATIO[0]), math.log(ERASE_RATIO[1])
    ratio = torch.exp(log_low + (log_high - log_low) * torch.rand(batch, attempts))
    h = torch.sqrt(area * ratio).round().long()  # (B, A)
    w = torch.sqrt(area / ratio).round().long()
    fits = (h < size) & (w < size)
    first = fits.float().argmax(dim=1, keepdim=True)  # the first fitting draw (0 if none)
    h, w = h.gather(1, first), w.gather(1, first)  # (B, 1)
    apply = fits.any(dim=1, keepdim=True) & (torch.rand(batch, 1) < preset.erase)
    top = (torch.rand(batch, 1) * (size - h + 1)).long().clamp(max=size - 1)  # (B, 1)
    left = (torch.rand(batch, 1) * (size - w + 1)).long().clamp(max=size - 1)
    span = torch.arange(size).view(1, -1)  # (1, S)
    rows = (span >= top) & (span < top + h) & apply  # (B, S)
    cols = (span >= left) & (span < left + w)
    return (rows[:, :, None] & cols[:, None, :])[:, None]  # (B, 1, S, S)


PRESETS: dict[str, Preset] = {
    "dtd": Preset(448, 512, 3, IMAGENET_MEAN, IMAGENET_STD),
    "mit_indoor": Preset(448, 512, 3, IMAGENET_MEAN, IMAGENET_STD),
    "cub200": Preset(448, 512, 3, IMAGENET_MEAN, IMAGENET_STD),
    "minc2500": Preset(224, 256, 3, IMAGENET_MEAN, IMAGENET_STD),
    "image_folder": Preset(224, 256, 3, IMAGENET_MEAN, IMAGENET_STD),
    "fashion_mnist": Preset(28, None, 1, (0.2860,), (0.3530,), pad=2),
}
