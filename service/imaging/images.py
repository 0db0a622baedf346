"""Encoded image bytes -> the model's float32 input ``(C, S, S)``, as the model card says.

The steps, which reproduce the training pipeline's evaluation transform on a PIL image
(``training.datasets.presets``: torchvision's ``Resize`` and ``CenterCrop`` on PIL images, then
``ToImage``, ``ToDtype(scale=True)``, ``Normalize``) with Pillow and numpy alone:

1. only the formats of :data:`FORMATS` are opened (Pillow's other plugins are never run on
   client bytes); the header alone decides whether the image is refused: over the pixel limit (a
   decompression bomb costs nothing) or an aspect ratio beyond :data:`MAX_ASPECT_RATIO`. JPEGs
   much larger than needed are decoded at reduced scale (Pillow's draft mode);
2. first frame of an animation; EXIF orientation applied;
3. colour: to ``L`` or ``RGB`` (palette, grey+alpha, RGBA, CMYK, 16- and 32-bit modes handled,
   the latter a band of rows at a time in integer or float32 arithmetic; alpha is dropped as
   Pillow's ``convert`` drops it, as training did);
4. resize the shorter side to ``resize`` (bilinear, antialiased; torchvision's size rounding),
   centre crop ``crop`` x ``crop`` (torchvision's offsets, zero padding when smaller). The
   resized image has at most ``MAX_ASPECT_RATIO * resize**2`` pixels. (Resampling only the
   crop's window with Pillow's ``resize(box=...)`` would make the ratio irrelevant, but Pillow
   reads the box as single-precision floats, which moves up to a quarter of the pixels by one
   grey level: beyond the 1e-3 parity with training);
5. ``x = (v / 255 - mean) / std`` per channel, ``(C, S, S)`` float32.

Every failure of a decoder (Pillow's plugins raise ``OSError``, ``SyntaxError``,
``NotImplementedError``, ``TypeError``, ``struct.error``...) is an :class:`ImageError` that names
the file.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from service.core.card import Preprocessing

# Pillow's warnings are about the client's file (corrupt EXIF, for one), not the server's to
# print. Ignored for the process once, here: warnings.catch_warnings around each decode would
# swap the process's filters from several decode threads at once, which is not thread-safe.
warnings.filterwarnings("ignore", module=r"PIL\.")

__all__ = [
    "FORMATS",
    "MAX_ASPECT_RATIO",
    "AspectRatioError",
    "ImageError",
    "ImageTooLargeError",
    "Preprocess",
    "Preprocessor",
    "UnsupportedFormatError",
    "crop_offsets",
    "resized_size",
    "to_mode",
]

#: What a served model decodes its uploads with: ``(encoded bytes, file name) -> (C, S, S)``
#: float32 (a :class:`Preprocessor`, or ``service.imaging.gpu_jpeg``'s for JPEGs on the GPU).
Preprocess = Callable[[bytes, str], np.ndarray]

# Pillow's own bomb check is replaced by the service's max_pixels, checked before decoding.
Image.MAX_IMAGE_PIXELS = None

# The formats the service decodes (Pillow's names): what cameras, phones, browsers and scanners
# produce. Pillow's other plugins (DDS, BLP, IM, PSD, EPS...) are rarely sent on purpose and
# raise errors of their own on crafted files; they never see client bytes.
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")

# Longer side / shorter side, at most. Resizing the shorter side to ``resize`` makes
# ``ratio * resize**2`` pixels (a 2 kB PNG of 1 x 1,000,000 would become 256 x 256,000,000), and
# so does the resize's horizontal pass (``resize`` x the source's height) when it enlarges: 64:1
# bounds both at 16.8 M pixels for the largest preset resize (512), a third of the default
# max_pixels. It keeps panoramas (up to about 12:1), web banners (about 11:1) and long
# screenshots (1080 x 20,000 is 19:1); beyond it the centre crop sees under 2 % of the image.
MAX_ASPECT_RATIO = 64

# 16- and 32-bit images are scaled to 8 bits a band of about this many pixels at a time.
_BAND_PIXELS = 1 << 20


class ImageError(ValueError):
    """The bytes are not a decodable image (status 400)."""


class UnsupportedFormatError(ImageError):
    """The image is in a format outside :data:`FORMATS` (status 400)."""


class AspectRatioError(ImageError):
    """The image is longer than :data:`MAX_ASPECT_RATIO` times its width, or wider (status 400)."""


class ImageTooLargeError(ValueError):
    """The image has more pixels than the service accepts (status 413)."""


@cache
def _formats() -> tuple[str, ...]:
    """:data:`FORMATS` that this Pillow can open (WebP needs libwebp)."""
    Image.init()
    return tuple(name for name in FORMATS if name in Image.OPEN)


def _accepted() -> str:
    return ", ".join(_formats())


def _sniff(prefix: bytes) -> str | None:
    """The Pillow format whose magic number ``prefix`` (the file's first 16 bytes) starts with,
    from the plugins' own checks; none of a plugin's parsing runs."""
    Image.init()
    for name, (_, accept) in Image.OPEN.items():
        try:
            found = accept is not None and accept(prefix)
        except Exception:  # a plugin's check is not ours to trust
            continue
        if found and not isinstance(found, str):  # a str is Pillow's "almost" (a warning)
            return name
    return None


def resized_size(width: int, height: int, size: int) -> tuple[int, int]:
    """torchvision's ``Resize(size)``: the shorter side becomes ``size``, the longer one
    ``int(size * long / short)``; returns ``(width, height)``."""
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def crop_offsets(width: int, height: int, crop: int) -> tuple[int, int]:
    """torchvision's ``CenterCrop``: the ``(top, left)`` of a ``crop`` x ``crop`` window in a
    ``width`` x ``height`` image at least that large."""
    return round((height - crop) / 2.0), round((width - crop) / 2.0)


def _eight_bit(image: Image.Image) -> Image.Image:
    """16/32-bit grey (``I;16*``, ``I``, ``F``) -> ``L``, a band of rows at a time.

    Pillow's ``convert("L")`` clips at 255; the range is scaled down instead: ``I;16`` by
    ``round(v / 257)`` in integers (``65535 -> 255``; no ties are possible), ``I`` and ``F`` by
    their largest finite value in float32 (NaN -> 0, +inf -> 255). Memory: the ``L`` result plus
    one band, never a float copy of the whole image.
    """
    width, height = image.size
    rows = max(1, _BAND_PIXELS // max(width, 1))
    bands = range(0, height, rows)

    def band(top: int) -> np.ndarray:  # (rows, W)
        return np.asarray(image.crop((0, top, width, min(top + rows, height))))

    out = Image.new("L", image.size)
    if image.mode.startswith("I;16"):
        for top in bands:
            scaled = (band(top).astype(np.uint32) + 128) // 257
            out.paste(Image.fromarray(scaled.astype(np.uint8)), (0, top))
        return out
    peak = 1.0
    for top in bands:
        values = band(top)
        values = values[np.isfinite(values)] if values.dtype.kind == "f" else values
        if values.size:
            peak = max(peak, float(values.max()))
    scale = np.float32(255.0 / peak)
    for top in bands:
        values = np.nan_to_num(band(top).astype(np.float32), nan=0.0, posinf=peak, neginf=0.0)
        np.clip(values, 0.0, peak, out=values)  # so that nothing overflows float32 below
        scaled = np.clip(np.rint(values * scale), 0, 255)
        out.paste(Image.fromarray(scaled.astype(np.uint8)), (0, top))
    return out


def to_mode(image: Image.Image, mode: str) -> Image.Image:
    """Convert any Pillow mode to ``L`` or ``RGB``."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        image = _eight_bit(image)
    if image.mode == "P":
        image = image.convert("RGBA")
    return image if image.mode == mode else image.convert(mode)


@dataclass(frozen=True)
class Preprocessor:
    """Decodes and preprocesses images for one model card: encoded bytes -> ``(C, S, S)``
    float32, the training pipeline's evaluation transform (see the module's docstring).

    Accepts the formats of :data:`FORMATS` with at most ``max_pixels`` pixels and an aspect ratio
    of at most :data:`MAX_ASPECT_RATIO`, both read from the header before decoding. Raises
    :class:`ImageTooLargeError` (413) over the pixel limit and :class:`ImageError` (400: empty,
    undecodable or truncated, another format, a longer aspect ratio), each naming the file.
    Memory: the decoded image (``max_pixels``), its 8-bit ``L``/``RGB`` conversion (16- and
    32-bit images a band at a time, no float64), and the resized image
    (``MAX_ASPECT_RATIO * resize**2`` pixels at most).
    """

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
            image = Image.open(io.BytesIO(data), formats=_formats())
            self.check_size(image, name)
            self._draft(image)
            image.seek(0)
            image.load()
            ImageOps.exif_transpose(image, in_place=True)  # else it copies even upright images
            return to_mode(image, self.mode)
        except (ImageError, ImageTooLargeError, MemoryError):
            raise
        except UnidentifiedImageError:
            found = _sniff(data[:16])
            if found is not None and found not in _formats():
                raise UnsupportedFormatError(
                    f"{name}: unsupported image format {found} (by its first bytes); "
                    f"accepted: {_accepted()}"
                ) from None
            raise ImageError(
                f"{name}: not a recognised image format (accepted: {_accepted()})"
            ) from None
        except Exception as error:  # any plugin's failure on crafted bytes is the file's fault
            raise ImageError(
                f"{name}: the image could not be decoded ({type(error).__name__}: {error})"
            ) from None

    def check_size(self, image: Image.Image, name: str) -> None:
        """Refuse, from the header, more than ``max_pixels`` pixels or too long a strip."""
        width, height = image.size
        if width * height > self.max_pixels:
            raise ImageTooLargeError(
                f"{name}: {width}x{height} is {width * height:,} pixels, more than the "
                f"{self.max_pixels:,} accepted"
            )
        if width < 1 or height < 1:
            raise ImageError(f"{name}: {width}x{height} has no pixels")
        if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
            raise AspectRatioError(
                f"{name}: {width}x{height} has an aspect ratio of "
                f"{max(width, height) / min(width, height):,.0f}:1; accepted: at most "
                f"{MAX_ASPECT_RATIO}:1"
            )

    def draft_size(self, width: int, height: int) -> tuple[int, int] | None:
        """The size a ``width`` x ``height`` JPEG is asked to decode at (Pillow's draft mode
        then picks 1/2, 1/4 or 1/8 scale, staying >= 2x the resize), or ``None`` where it is
        decoded whole (not at least 4x the resize on its shorter side, or no resize)."""
        if self.spec.resize is None:
            return None
        target = 2 * self.spec.resize  # keep twice the resolution the resize needs
        if min(width, height) < 2 * target:
            return None
        scale = min(width, height) / target
        return int(width / scale), int(height / scale)

    def _draft(self, image: Image.Image) -> None:
        """Let a large JPEG decode at reduced scale (:meth:`draft_size`)."""
        if image.format not in ("JPEG", "MPO"):
            return
        size = self.draft_size(*image.size)
        if size is not None:
            image.draft(self.mode, size)

    def geometry(self, image: Image.Image) -> Image.Image:
        """Resize the shorter side to ``resize`` and centre crop ``crop`` (torchvision's rules)."""
        if self.spec.resize is not None:
            size = resized_size(*image.size, self.spec.resize)
            if size != image.size:
                image = image.resize(size, Image.Resampling.BILINEAR)
        crop = self.spec.crop
        width, height = image.size
        if (width, height) != (crop, crop):
            if width < crop or height < crop:  # torchvision pads with zeros, then crops
                padded = Image.new(image.mode, (max(width, crop), max(height, crop)))
                padded.paste(image, ((max(crop - width, 0)) // 2, (max(crop - height, 0)) // 2))
                image, (width, height) = padded, padded.size
            top, left = crop_offsets(width, height, crop)
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
