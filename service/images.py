"""Encoded image bytes -> the model's float32 input ``(C, S, S)``, as the model card says.

The steps, which reproduce the training pipeline's evaluation transform on a PIL image
(``training.datasets.presets``: torchvision's ``Resize`` and ``CenterCrop`` on PIL images, then
``ToImage``, ``ToDtype(scale=True)``, ``Normalize``) with Pillow and numpy alone:

1. read the header only and refuse images over the pixel limit (a decompression bomb costs
   nothing); JPEGs much larger than needed are decoded at reduced scale (Pillow's draft mode);
2. first frame of an animation; EXIF orientation applied;
3. colour: to ``L`` or ``RGB`` (palette, grey+alpha, RGBA, CMYK, 16- and 32-bit modes handled;
   alpha is dropped as Pillow's ``convert`` drops it, as training did);
4. resize the shorter side to ``resize`` (bilinear, antialiased; torchvision's size rounding),
   centre crop ``crop`` x ``crop`` (torchvision's offsets, zero padding when smaller);
5. ``x = (v / 255 - mean) / std`` per channel, ``(C, S, S)`` float32.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from service.card import Preprocessing

__all__ = ["ImageError", "ImageTooLargeError", "Preprocessor"]

# Pillow's own bomb check is replaced by the service's max_pixels, checked before decoding.
Image.MAX_IMAGE_PIXELS = None


class ImageError(ValueError):
    """The bytes are not a decodable image (status 400)."""


class ImageTooLargeError(ValueError):
    """The image has more pixels than the service accepts (status 413)."""


def _resized_size(width: int, height: int, size: int) -> tuple[int, int]:
    """torchvision's ``Resize(size)``: the shorter side becomes ``size``, the longer one
    ``int(size * long / short)``; returns ``(width, height)``."""
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def _to_mode(image: Image.Image, mode: str) -> Image.Image:
    """Convert any Pillow mode to ``L`` or ``RGB``."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        # 16/32-bit grey: Pillow's convert("L") clips at 255; scale the range down instead
        array = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") else max(float(array.max()), 1.0)
        image = Image.fromarray(np.clip(array * (255.0 / top), 0, 255).round().astype(np.uint8))
    if image.mode == "P":
        image = image.convert("RGBA")
    return image if image.mode == mode else image.convert(mode)


@dataclass(frozen=True)
class Preprocessor:
    """Decodes and preprocesses images for one model card."""

    spec: Preprocessing
    max_pixels: int

    @property
    def mode(self) -> str:
        return self.spec.colour

    def open(self, data: bytes, name: str = "image") -> Image.Image:
        """Decode ``data`` (first frame, EXIF orientation, the model's colour mode)."""
        if not data:
            raise ImageError(f"{name}: the file is empty")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # EXIF and palette-transparency chatter
                image = Image.open(io.BytesIO(data))
                width, height = image.size
                if width * height > self.max_pixels:
                    raise ImageTooLargeError(
                        f"{name}: {width}x{height} is {width * height:,} pixels, more than the "
                        f"{self.max_pixels:,} accepted"
                    )
                self._draft(image)
                image.seek(0)
                image.load()
                ImageOps.exif_transpose(image, in_place=True)  # else it copies even upright images
                return _to_mode(image, self.mode)
        except ImageTooLargeError:
            raise
        except UnidentifiedImageError:
            raise ImageError(f"{name}: not a recognised image format") from None
        except (OSError, ValueError, SyntaxError, EOFError) as error:
            raise ImageError(f"{name}: the image could not be decoded ({error})") from None

    def _draft(self, image: Image.Image) -> None:
        """Let a large JPEG decode at 1/2, 1/4 or 1/8 scale while staying >= 2x the resize."""
        if image.format != "JPEG" or self.spec.resize is None:
            return
        width, height = image.size
        target = 2 * self.spec.resize  # keep twice the resolution the resize needs
        if min(width, height) >= 2 * target:
            scale = min(width, height) / target
            image.draft(self.mode, (int(width / scale), int(height / scale)))

    def geometry(self, image: Image.Image) -> Image.Image:
        """Resize the shorter side to ``resize`` and centre crop ``crop`` (torchvision's rules)."""
        if self.spec.resize is not None:
            size = _resized_size(*image.size, self.spec.resize)
            if size != image.size:
                image = image.resize(size, Image.Resampling.BILINEAR)
        crop = self.spec.crop
        width, height = image.size
        if (width, height) != (crop, crop):
            if width < crop or height < crop:  # torchvision pads with zeros, then crops
                padded = Image.new(image.mode, (max(width, crop), max(height, crop)))
                padded.paste(image, ((max(crop - width, 0)) // 2, (max(crop - height, 0)) // 2))
                image, (width, height) = padded, padded.size
            top = round((height - crop) / 2.0)
            left = round((width - crop) / 2.0)
            image = image.crop((left, top, left + crop, top + crop))
        return image

    def tensor(self, image: Image.Image) -> np.ndarray:
        """``(C, S, S)`` float32: ``(v / 255 - mean) / std``.

        For 8-bit images (what :meth:`open` returns) each channel's 256 possible results are
        computed once (:attr:`_table`) and looked up per pixel (``np.take``, which runs without
        the GIL): the same float32 values as the arithmetic, in one pass instead of five.
        """
        pixels = np.asarray(image)
        planes = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)  # (C, S, S)
        table = self._table  # (C, 256)
        if pixels.dtype != np.uint8 or len(planes) != len(table):
            return self._normalise(planes)
        out = np.empty(planes.shape, np.float32)
        for channel, plane in enumerate(planes):
            np.take(table[channel], plane, out=out[channel])
        return out

    @cached_property
    def _table(self) -> np.ndarray:
        """``(C, 256)`` float32: :meth:`_normalise` of every 8-bit value, per channel."""
        values = np.arange(256, dtype=np.uint8)[None, None]  # (1, 1, 256)
        return self._normalise(values)[:, 0]

    def _normalise(self, planes: np.ndarray) -> np.ndarray:
        """``(v / 255 - mean) / std`` in float32 of ``(C, H, W)`` (or broadcastable) values."""
        array = planes.astype(np.float32) / 255.0
        mean = np.asarray(self.spec.mean, np.float32)[:, None, None]
        std = np.asarray(self.spec.std, np.float32)[:, None, None]
        return np.ascontiguousarray((array - mean) / std, dtype=np.float32)

    def __call__(self, data: bytes, name: str = "image") -> np.ndarray:
        """Encoded bytes -> ``(C, S, S)`` float32 model input."""
        return self.tensor(self.geometry(self.open(data, name)))
