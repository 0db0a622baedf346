"""The image sets of the confirmatory typicality evaluation that no earlier evaluation used.

Everything is made here, offline and from a seed, as uint8 grey ``(N, 28, 28)`` images (the
Fashion-MNIST format: a bright object on a black background):

* :func:`glyphs`: the 52 Latin letters ``A-Z a-z`` typeset in the 16 text faces bundled in
  matplotlib's wheel (DejaVu Sans, Sans Mono and Serif, STIX General; regular, bold, italic,
  bold italic), each drawn ``per_glyph`` times at a random size, position, tilt and brightness.
  A typeset-letter family, as notMNIST is for the MNIST family, and unlike the handwritten digits,
  photographs, noise and transformed garments used before.
* :func:`corrupt`: covariate shift of real test images, the corruptions and severities of
  CIFAR-10-C (Hendrycks and Dietterich, 2019; its severities 1, 3 and 5) on ``x`` in ``[0, 1]``::

      gaussian_noise  clip(x + N(0, s^2))                 s = 0.04, 0.08, 0.10
      gaussian_blur   gaussian_filter(x, sigma=s)         s = 0.4, 0.7, 1.0 (pixels; edges nearest)
      contrast        clip((x - mean(x)) s + mean(x))     s = 0.75, 0.4, 0.15 (mean per image)
      jpeg            JPEG round trip at quality s        s = 80, 58, 40 (Pillow, grey)

  then ``round(255 x)`` back to uint8.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = [
    "CORRUPTIONS",
    "FACES",
    "LETTERS",
    "SEVERITIES",
    "corrupt",
    "font_folder",
    "glyphs",
    "shift_sets",
]

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
#: matplotlib's bundled text faces (mpl-data/fonts/ttf): 4 families x 4 styles
FACES = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSansMono-Oblique.ttf",
    "DejaVuSansMono-BoldOblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSerif-BoldItalic.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf",
    "STIXGeneralBolIta.ttf",
)
#: the severities reported (CIFAR-10-C's levels 1, 3 and 5)
SEVERITIES = (1, 3, 5)
_LEVELS: dict[str, tuple[float, ...]] = {  # CIFAR-10-C's five levels of each corruption
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),
    "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1.0),
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
    "jpeg": (80, 65, 58, 50, 40),
}
CORRUPTIONS = tuple(_LEVELS)
_SIDE = 28


def font_folder() -> Path:
    """matplotlib's folder of bundled TrueType fonts (read from disk: no download)."""
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


def _letter(face: ImageFont.FreeTypeFont, letter: str) -> Image.Image:
    """``letter`` drawn white on black, cropped to its ink: an ``L`` image."""
    canvas = Image.new("L", (160, 160), 0)
    ImageDraw.Draw(canvas).text((30, 20), letter, fill=255, font=face)
    box = canvas.getbbox()
    if box is None:
        raise ValueError(f"{face.path!r} draws no ink for {letter!r}")
    return canvas.crop(box)


def glyphs(per_glyph: int = 6, seed: int = 0, letters: str = LETTERS) -> np.ndarray:
    """``len(FACES) * len(letters) * per_glyph`` letters, uint8 ``(N, 28, 28)``, in the order
    face, letter, draw. Each draw: the letter tilted by U(-15, 15) degrees, scaled so that its
    longer side is U{14..22} px, at brightness U{160..255}, placed uniformly where it fits
    2 px from every edge."""
    rng = np.random.default_rng(seed)
    folder = font_folder()
    out = np.zeros((len(FACES) * len(letters) * per_glyph, _SIDE, _SIDE), np.uint8)
    i = 0
    for name in FACES:
        face = ImageFont.truetype(str(folder / name), 96)
        for letter in letters:
            ink = _letter(face, letter)
            for _ in range(per_glyph):
                tilted = ink.rotate(
                    float(rng.uniform(-15, 15)), Image.Resampling.BILINEAR, expand=True
                )
                longer = int(rng.integers(14, 23))
                scale = longer / max(tilted.size)
                width = max(1, round(tilted.width * scale))
                height = max(1, round(tilted.height * scale))
                small = np.asarray(tilted.resize((width, height), Image.Resampling.LANCZOS))
                bright = int(rng.integers(160, 256))
                y = int(rng.integers(2, _SIDE - 2 - height + 1))
                x = int(rng.integers(2, _SIDE - 2 - width + 1))
                patch = np.round(small.astype(np.float64) * bright / 255)
                out[i, y : y + height, x : x + width] = patch.astype(np.uint8)
                i += 1
    return out


def _noise(x: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    return np.clip(x + rng.normal(0.0, s, x.shape), 0.0, 1.0)


def _blur(x: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    from scipy.ndimage import gaussian_filter

    return gaussian_filter(x, sigma=(0, s, s), mode="nearest")  # (N, H, W): not across images


def _contrast(x: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    mean = x.mean(axis=(1, 2), keepdims=True)  # (N, 1, 1)
    return np.clip((x - mean) * s + mean, 0.0, 1.0)


def _jpeg(x: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    out = np.empty_like(x)
    for i, image in enumerate(np.round(x * 255).astype(np.uint8)):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, "JPEG", quality=int(s))
        out[i] = np.asarray(Image.open(buffer)).astype(np.float64) / 255
    return out


_APPLY: dict[str, Callable[[np.ndarray, float, np.random.Generator], np.ndarray]] = {
    "gaussian_noise": _noise,
    "gaussian_blur": _blur,
    "contrast": _contrast,
    "jpeg": _jpeg,
}


def corrupt(images: np.ndarray, corruption: str, severity: int, seed: int = 0) -> np.ndarray:
    """``images`` (uint8 ``(N, 28, 28)``) under ``corruption`` at CIFAR-10-C's ``severity``
    (1-5; the module docstring has the formulas): uint8 ``(N, 28, 28)``. ``ValueError`` for an
    unknown corruption or severity."""
    if corruption not in _LEVELS:
        raise ValueError(f"unknown corruption {corruption!r}; known: {', '.join(CORRUPTIONS)}")
    if severity not in range(1, 6):
        raise ValueError(f"severity must be 1 to 5, got {severity}")
    x = images.astype(np.float64) / 255
    level = _LEVELS[corruption][severity - 1]
    shifted = _APPLY[corruption](x, level, np.random.default_rng(seed))
    return np.round(shifted * 255).astype(np.uint8)


def shift_sets(
    images: np.ndarray, corruptions: Sequence[str] = CORRUPTIONS, seed: int = 0
) -> dict[str, np.ndarray]:
    """Every corruption at every reported severity, named ``corruption-severity``."""
    return {f"{c}-{s}": corrupt(images, c, s, seed) for c in corruptions for s in SEVERITIES}
