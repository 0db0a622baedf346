"""The service's decoding and preprocessing against the training pipeline's own transform."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from service.core.card import Preprocessing
from service.imaging.images import ImageError, ImageTooLargeError, Preprocessor
from tests.service.conftest import png

pytest.importorskip("torch", reason="the reference is training's transform: torch (dev extra)")
from training.datasets.presets import PRESETS, Preset

ROOT = Path(__file__).resolve().parents[3]


def spec_of(preset: Preset) -> Preprocessing:
    return Preprocessing(
        colour="L" if preset.channels == 1 else "RGB",
        resize=preset.resize or preset.image_size,
        crop=preset.image_size,
        mean=list(preset.mean),
        std=list(preset.std),
    )


def photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A smooth RGB image with some texture (not constant, not pure noise)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([np.sin(x / 17.0), np.cos(y / 11.0), np.sin((x + y) / 23.0)], axis=-1)
    image = 127.5 + 100 * base + rng.normal(0, 12, (height, width, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("name", ["dtd", "minc2500"])
@pytest.mark.parametrize(("width", "height"), [(640, 480), (300, 517), (256, 256), (200, 150)])
def test_preprocessing_matches_the_training_eval_transform(name, width, height):
    preset = PRESETS[name]
    data = png(photo(width, height))
    expected = preset.eval_transform()(Image.open(io.BytesIO(data)).convert("RGB")).numpy()
    got = Preprocessor(spec_of(preset), 10**8)(data)
    assert got.shape == expected.shape == (3, preset.image_size, preset.image_size)
    assert np.abs(got - expected).max() <= 1e-3


def test_grey_preprocessing_matches_fashion_mnist_eval_transform():
    preset = PRESETS["fashion_mnist"]
    pixels = photo(28, 28)[..., 0]
    expected = preset.eval_transform()(Image.fromarray(pixels)).numpy()
    got = Preprocessor(spec_of(preset), 10**8)(png(pixels))
    assert got.shape == (1, 28, 28)
    assert np.abs(got - expected).max() <= 1e-3


@pytest.mark.parametrize(
    ("mode", "make"),
    [
        ("P", lambda im: im.convert("P", palette=Image.Palette.ADAPTIVE)),
        ("LA", lambda im: im.convert("LA")),
        ("RGBA", lambda im: im.convert("RGBA")),
        ("CMYK", lambda im: im.convert("CMYK")),
        ("I;16", lambda im: Image.fromarray(np.asarray(im.convert("L"), np.uint16) * 257)),
        ("1", lambda im: im.convert("1")),
    ],
)
@pytest.mark.parametrize("colour", ["L", "RGB"])
def test_every_image_mode_becomes_the_models_colour(mode, make, colour):
    image = make(Image.fromarray(photo(64, 48)))
    assert image.mode == mode
    fmt = "TIFF" if mode in ("CMYK", "I;16") else "PNG"
    buf = io.BytesIO()
    image.save(buf, fmt)
    spec = Preprocessing(
        colour=colour,
        resize=32,
        crop=32,
        mean=[0.5] * (1 if colour == "L" else 3),
        std=[0.25] * (1 if colour == "L" else 3),
    )
    out = Preprocessor(spec, 10**8)(buf.getvalue())
    assert out.shape == ((1 if colour == "L" else 3), 32, 32)
    assert np.isfinite(out).all()


def test_sixteen_bit_grey_keeps_its_range():
    spec = Preprocessing(colour="L", resize=8, crop=8, mean=[0.0], std=[1.0])
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8), 65535, np.uint16)).save(buf, "PNG")
    assert Preprocessor(spec, 10**8)(buf.getvalue()) == pytest.approx(np.ones((1, 8, 8)))


def test_exif_orientation_is_applied():
    pixels = np.zeros((20, 40, 3), np.uint8)
    pixels[:, :20] = 255  # left half white in the stored pixels
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": the displayed image is 20 wide, 40 high
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", exif=exif, quality=95)
    spec = Preprocessing(colour="L", resize=None, crop=40, mean=[0.0], std=[1.0])
    image = Preprocessor(spec, 10**8).open(buf.getvalue())
    assert image.size == (20, 40)
    array = np.asarray(image, np.float32)
    assert array[:20].mean() > 200  # the white half is now on top
    assert array[20:].mean() < 50


def test_an_animation_uses_its_first_frame():
    frames = [Image.fromarray(np.full((16, 16), v, np.uint8)) for v in (200, 10, 90)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    spec = Preprocessing(colour="L", resize=16, crop=16, mean=[0.0], std=[1.0])
    out = Preprocessor(spec, 10**8)(buf.getvalue())
    assert out.mean() == pytest.approx(200 / 255, abs=0.02)


def test_a_decompression_bomb_is_refused_from_its_header():
    # a 20,000 x 20,000 PNG compresses to a few hundred kB; the header alone says it is too big
    buf = io.BytesIO()
    Image.new("L", (20_000, 20_000)).save(buf, "PNG")
    spec = Preprocessing(colour="L", resize=28, crop=28, mean=[0.0], std=[1.0])
    with pytest.raises(ImageTooLargeError, match="400,000,000 pixels"):
        Preprocessor(spec, 50_000_000).open(buf.getvalue())


@pytest.mark.parametrize(
    "data", [b"", b"GIF89a", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, b"<html>not an image</html>"]
)
def test_undecodable_bytes_raise_image_error_naming_the_file(data):
    spec = Preprocessing(colour="RGB", resize=8, crop=8, mean=[0.0] * 3, std=[1.0] * 3)
    with pytest.raises(ImageError, match=r"^upload\.bin: "):
        Preprocessor(spec, 10**8)(data, "upload.bin")


def test_large_jpegs_decode_at_reduced_scale_and_stay_close():
    pixels = photo(4000, 3000)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=92)
    spec = Preprocessing(colour="RGB", resize=256, crop=224, mean=[0.5] * 3, std=[0.25] * 3)
    pre = Preprocessor(spec, 10**8)
    image = Image.open(io.BytesIO(buf.getvalue()))
    pre._draft(image)
    assert image.size[0] < 4000  # the decoder was told to scale down
    assert min(image.size) >= 2 * 256
    fast = pre(buf.getvalue())
    full = pre.tensor(pre.geometry(Image.open(io.BytesIO(buf.getvalue())).convert("RGB")))
    assert np.abs(fast - full).mean() < 0.05  # same picture, within JPEG rounding


def test_pillows_warnings_on_a_clients_file_are_not_the_servers_even_under_w_error():
    """The filter service.imaging.images installs at import (thread-safe, unlike catch_warnings
    around each decode, which swaps the process's filters from several decode threads at once): a
    warning Pillow's TIFF plugin gives about a file's EXIF is ignored even where warnings are
    errors, and any other module's warning is not."""
    code = (
        "import warnings, service.imaging.images\n"
        "warnings.warn_explicit('Possibly corrupt EXIF data.', UserWarning, 'TiffImagePlugin.py', "
        "1, module='PIL.TiffImagePlugin')\n"
        "try:\n"
        "    warnings.warn_explicit('other', UserWarning, 'x.py', 1, module='numpy')\n"
        "except UserWarning:\n"
        "    print('others still warn')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "others still warn\n"
