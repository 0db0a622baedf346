"""Hostile images: aspect-ratio bombs in every accepted format, the
memory a decode takes, formats outside the allow-list, truncated and corrupted files. Each one is a
4xx that names the file, quickly and in bounded memory, never another exception (a 500)."""

from __future__ import annotations

import io
import random
import struct
import subprocess
import sys
import textwrap
import warnings
import zlib
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from PIL import Image, ImageFile

from service.core.card import Preprocessing
from service.imaging.images import (
    FORMATS,
    MAX_ASPECT_RATIO,
    AspectRatioError,
    ImageError,
    ImageTooLargeError,
    Preprocessor,
    UnsupportedFormatError,
)

from .conftest import grey

ROOT = Path(__file__).resolve().parents[2]
RGB = Preprocessing(colour="RGB", resize=256, crop=224, mean=[0.5] * 3, std=[0.25] * 3)
GREY = Preprocessing(colour="L", resize=28, crop=28, mean=[0.5], std=[0.25])  # the fake card's
Image.init()  # every plugin registered, as the decoder has them
ACCEPTED = "accepted: " + ", ".join(name for name in FORMATS if name in Image.OPEN)


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_stream(width: int, height: int, row: bytes, depth: int = 8, colour: int = 0) -> bytes:
    """A PNG built by hand, ``height`` rows of ``row`` (filter byte included), compressed as a
    stream, so that a large image never exists in memory."""
    packer = zlib.compressobj(9)
    per_block = max(1, 2**20 // len(row))  # rows compressed at a time
    block = row * per_block
    body = b"".join(packer.compress(block) for _ in range(height // per_block))
    body += packer.compress(row * (height % per_block)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")
    )


def issue_png(n: int = 1_000_000) -> bytes:
    """The issue's example: 1 x n, 8-bit grey, every row 0x80 (2 kB for a million rows)."""
    return png_stream(1, n, b"\0\x80")


def saved(image: Image.Image, fmt: str, **options) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    return buf.getvalue()


def bmp_header(width: int, height: int) -> bytes:
    """A 24-bit BMP's headers alone, declaring ``width`` x ``height`` (no pixel data)."""
    stride = (3 * width + 3) // 4 * 4
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, stride * height, 0, 0, 0, 0)
    return (
        b"BM" + struct.pack("<IHHI", 14 + len(info) + stride * height, 0, 0, 14 + len(info)) + info
    )


def available(fmt: str) -> bool:
    return fmt in Image.OPEN


# --- defect 1: aspect-ratio bombs -----------------------------------------------------------------

STRIPS = {
    "PNG 1 x 1,000,000 (the issue's)": lambda: issue_png(),
    "PNG 1,000,000 x 1": lambda: png_stream(1_000_000, 1, b"\0" + b"\x80" * 1_000_000),
    "PNG 1 x 50,000,000 (within max_pixels)": lambda: issue_png(50_000_000),
    "GIF 1 x 65,535": lambda: saved(Image.new("L", (1, 65_535), 128), "GIF"),
    "BMP 1 x 1,000,000 (header only)": lambda: bmp_header(1, 1_000_000),
    "BMP 1,000,000 x 2 (header only)": lambda: bmp_header(1_000_000, 2),
    "TIFF 1 x 1,000,000": lambda: saved(
        Image.new("L", (1, 1_000_000), 128), "TIFF", compression="tiff_deflate"
    ),
    "JPEG 1 x 65,000": lambda: saved(Image.new("L", (1, 65_000), 128), "JPEG"),
    "WEBP 1 x 16,383": lambda: saved(Image.new("L", (1, 16_383), 128), "WEBP"),
}


@pytest.mark.parametrize("case", list(STRIPS))
def test_a_strip_is_refused_from_its_header_quickly(case):
    if case.startswith("WEBP") and not available("WEBP"):
        pytest.skip("this Pillow has no WebP")
    data = STRIPS[case]()

    def decode(self: ImageFile.ImageFile) -> None:
        raise AssertionError("decoded: the header alone should have refused it")

    with (
        mock.patch.object(ImageFile.ImageFile, "load", decode),
        pytest.raises(AspectRatioError) as caught,
    ):
        Preprocessor(RGB, 50_000_000)(data, "strip.img")
    message = str(caught.value)
    width, height = Image.open(io.BytesIO(data)).size
    assert message.startswith("strip.img: ")
    assert f"{width}x{height}" in message
    assert f"at most {MAX_ASPECT_RATIO}:1" in message
    assert isinstance(caught.value, ImageError)  # the pipeline's 400


@pytest.mark.parametrize(
    ("size", "refused"),
    [
        ((4, 4 * MAX_ASPECT_RATIO), False),
        ((4 * MAX_ASPECT_RATIO, 4), False),
        ((4, 4 * MAX_ASPECT_RATIO + 1), True),
        ((4 * MAX_ASPECT_RATIO + 1, 4), True),
    ],
)
def test_the_aspect_ratio_bound_is_inclusive(size, refused):
    data = saved(Image.new("RGB", size, (10, 200, 30)), "PNG")
    if refused:
        with pytest.raises(AspectRatioError):
            Preprocessor(RGB, 10**8)(data)
    else:
        out = Preprocessor(RGB, 10**8)(data)
        assert out.shape == (3, 224, 224)
        assert np.isfinite(out).all()


PEAK = """
import resource, sys
from service.core.card import Preprocessing
from service.imaging.images import ImageError, Preprocessor
data = open(sys.argv[1], "rb").read()
spec = Preprocessing(colour=sys.argv[2], resize=256, crop=224, mean=[0.5] * 3, std=[0.25] * 3)
if spec.colour == "L":
    spec = Preprocessing(colour="L", resize=256, crop=224, mean=[0.5], std=[0.25])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    outcome = "x".join(map(str, Preprocessor(spec, 50_000_000)(data, "bomb.png").shape))
except ImageError as error:
    outcome = type(error).__name__
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(outcome, (after - before) * 1024)  # ru_maxrss is in KiB on Linux
"""


def decode_peak(tmp_path: Path, data: bytes, colour: str) -> tuple[str, int]:
    """Outcome and growth of the peak RSS in bytes of decoding ``data`` in a fresh interpreter
    (imports done before the measure)."""
    path = tmp_path / "bomb.png"
    path.write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PEAK), str(path), colour],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    )
    outcome, grown = done.stdout.split()
    return outcome, int(grown)


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss units differ off Linux")
@pytest.mark.parametrize("colour", ["L", "RGB"])
def test_the_issues_png_costs_no_memory(tmp_path, colour):
    # before: 1 x 30,000 took 21.7 s and 7.9 GB; 1 x 1,000,000 was a MemoryError (a 500)
    outcome, grown = decode_peak(tmp_path, issue_png(), colour)
    assert outcome == "AspectRatioError"
    assert grown < 16 * 2**20


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss units differ off Linux")
def test_a_large_sixteen_bit_png_is_scaled_without_float64_copies(tmp_path):
    # 7000 x 7000 16-bit grey zeros, 95 kB: Pillow holds 2 bytes a pixel (98 MB) and the L result
    # 1 (49 MB); before, float64 copies of the whole image peaked at 1.1 GB (4.6 s)
    pixels = 7000 * 7000
    data = png_stream(7000, 7000, bytes(1 + 2 * 7000), depth=16)
    outcome, grown = decode_peak(tmp_path, data, "L")
    assert outcome == "1x224x224"
    assert grown < 3 * pixels + 32 * 2**20, f"peak grew by {grown / 2**20:.0f} MiB"


def test_classify_refuses_the_issues_png_with_a_400_naming_the_file(make_client):
    client = make_client()
    response = client.post("/classify", files=[("file", ("strip.png", issue_png(), "image/png"))])
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "strip.png" in message
    assert "1x1000000" in message
    assert f"{MAX_ASPECT_RATIO}:1" in message
    assert client.get("/healthz").status_code == 200
    assert client.post(
        "/classify", content=grey(7), headers={"content-type": "image/png"}
    ).is_success


# --- defect 3: formats outside the allow-list -----------------------------------------------------


def dds_with_unknown_pixel_format() -> bytes:
    """A DDS whose FourCC Pillow has no decoder for (its DDS plugin raises NotImplementedError)."""
    header = struct.pack("<7I44s", 124, 0x1 | 0x2 | 0x4 | 0x1000, 8, 8, 0, 0, 0, b"\0" * 44)
    pixel_format = struct.pack("<II4s5I", 32, 0x4, b"XYZW", 0, 0, 0, 0, 0)
    return b"DDS " + header + pixel_format + struct.pack("<5I", 0x1000, 0, 0, 0, 0) + b"\0" * 64


CRAFTED = {
    "DDS (unknown pixel format)": (dds_with_unknown_pixel_format(), "DDS"),
    "BLP1": (b"BLP1" + struct.pack("<5I", 0, 8, 8, 8, 0) + b"\xff" * 200, "BLP"),
    "BLP2": (b"BLP2" + struct.pack("<I4B2I", 1, 9, 0, 0, 0, 8, 8) + b"\xff" * 200, "BLP"),
    "IM": (
        b"Image type: RGB image\r\nName: x\r\nImage size (x*y): 8*8\r\n\x1a" + b"\0" * 600,
        None,
    ),  # Pillow's IM has no magic number: not recognised at all
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_crafted_files_in_other_formats_are_refused_by_name(case):
    data, fmt = CRAFTED[case]
    with pytest.raises(ImageError, match=r"^crafted\.bin: ") as caught:
        Preprocessor(RGB, 10**8)(data, "crafted.bin")
    message = str(caught.value)
    assert ACCEPTED in message
    if fmt is not None:
        assert isinstance(caught.value, UnsupportedFormatError)
        assert f"unsupported image format {fmt}" in message


def other_formats() -> list[str]:
    """Every format this Pillow writes, outside the allow-list: a new plugin is covered at once.
    (MPO, the multi-picture JPEG of cameras, is opened by the JPEG plugin: it is a JPEG.)"""
    Image.init()
    return sorted(set(Image.SAVE) - set(FORMATS) - {"MPO"})


@pytest.mark.parametrize("fmt", other_formats())
def test_every_other_format_pillow_writes_is_refused(fmt):
    for mode in ("RGB", "L", "P", "1", "RGBA"):
        try:
            data = saved(Image.new(mode, (16, 16), 1), fmt)
            break
        except Exception:  # plugins refuse modes (or need a program) their own way
            continue
    else:
        pytest.skip(f"Pillow cannot write {fmt} here")
    with pytest.raises(ImageError, match=rf"^other\.bin: .*{ACCEPTED}"):
        Preprocessor(RGB, 10**8)(data, "other.bin")


# --- defect 3: truncated and corrupted files of the accepted formats ------------------------------


def photo(width: int = 48, height: int = 40) -> Image.Image:
    rng = np.random.default_rng(3)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def bmp_rle8(image: Image.Image) -> bytes:
    """``image`` (mode ``P``) as an RLE8-compressed BMP, which Pillow reads but does not write:
    rows bottom-up, each as ``(count, index)`` runs, then end of line ``(0, 0)``; end of bitmap
    ``(0, 1)``."""
    width, height = image.size
    pixels = np.asarray(image)
    data = bytearray()
    for row in pixels[::-1]:
        start = 0
        while start < width:
            end = start
            while end < width and end - start < 255 and row[end] == row[start]:
                end += 1
            data += bytes([end - start, int(row[start])])
            start = end
        data += b"\x00\x00"
    data += b"\x00\x01"
    palette = bytes(image.getpalette() or [])
    palette = palette.ljust(768, b"\x00")
    colours = b"".join(bytes([b, g, r, 0]) for r, g, b in zip(*[iter(palette)] * 3, strict=True))
    offset = 14 + 40 + len(colours)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 8, 1, len(data), 2835, 2835, 256, 0)
    header = b"BM" + struct.pack("<IHHI", offset + len(data), 0, 0, offset)
    return header + info + colours + bytes(data)


def test_the_rle8_sample_is_an_rle8_bmp_pillow_reads_as_written() -> None:
    image = photo().convert("P")
    with Image.open(io.BytesIO(bmp_rle8(image))) as decoded:
        assert decoded.info.get("compression") == 1  # BI_RLE8: Pillow's RLE decoder ran
        assert np.array_equal(np.asarray(decoded), np.asarray(image))


def samples() -> dict[str, bytes]:
    """One small valid file of each accepted format (a few variants each)."""
    image = photo()
    out = {
        "JPEG": saved(image, "JPEG", quality=90),
        "JPEG progressive": saved(image, "JPEG", progressive=True),
        "JPEG multi-picture (MPO)": saved(
            image, "MPO", save_all=True, append_images=[image.rotate(90)]
        ),
        "PNG": saved(image, "PNG"),
        "PNG palette interlaced": saved(image.convert("P"), "PNG", interlace=1),
        "GIF": saved(image.convert("P"), "GIF"),
        "GIF animated": saved(
            image.convert("P"), "GIF", save_all=True, append_images=[image.convert("P").rotate(90)]
        ),
        "BMP": saved(image, "BMP"),
        "BMP RLE8": bmp_rle8(image.convert("P")),
        "TIFF": saved(image, "TIFF"),
        "TIFF deflate": saved(image, "TIFF", compression="tiff_deflate"),
        "TIFF 16-bit": saved(
            Image.fromarray(np.asarray(image.convert("L"), np.uint16) * 257), "TIFF"
        ),
    }
    if available("WEBP"):
        out["WEBP lossy"] = saved(image, "WEBP", quality=80)
        out["WEBP lossless"] = saved(image, "WEBP", lossless=True)
    return out


SAMPLES = samples()


def test_every_accepted_format_has_samples():
    covered = {name.split()[0] for name in SAMPLES}
    assert covered == {name for name in FORMATS if available(name)}


@pytest.mark.parametrize("name", list(SAMPLES))
def test_the_samples_decode(name):
    out = Preprocessor(RGB, 10**8)(SAMPLES[name], name)
    assert out.shape == (3, 224, 224)


def decode_or_refuse(data: bytes, name: str) -> None:
    """A decoder may succeed or raise ImageError/ImageTooLargeError, nothing else; a success is
    a finite model input."""
    try:
        out = Preprocessor(GREY, 10**6)(data, name)
    except (ImageError, ImageTooLargeError) as error:
        message = str(error)
    else:
        assert out.shape == (1, 28, 28)
        assert np.isfinite(out).all()
        return
    assert message.startswith(f"{name}: ")


@pytest.mark.parametrize("name", list(SAMPLES))
def test_truncated_files_are_image_errors(name):
    data = SAMPLES[name]
    # without its second half no file can be decoded
    with pytest.raises(ImageError, match=rf"^cut\.{name.split()[0].lower()}: "):
        Preprocessor(RGB, 10**8)(data[: len(data) // 2], f"cut.{name.split()[0].lower()}")
    rng = random.Random(f"truncate {name}")
    for end in sorted({*range(0, 40), *(rng.randrange(len(data)) for _ in range(60))}):
        decode_or_refuse(data[:end], "cut.img")


@pytest.mark.parametrize("name", list(SAMPLES))
def test_corrupted_files_are_image_errors(name):
    data = SAMPLES[name]
    rng = random.Random(f"corrupt {name}")  # seeded: a failure is reproducible
    for _ in range(150):
        mutated = bytearray(data)
        for _ in range(rng.choice((1, 2, 4, 16))):
            at = rng.randrange(min(len(data), rng.choice((64, 512, len(data)))))
            mutated[at] = rng.randrange(256)
        decode_or_refuse(bytes(mutated), "corrupt.img")


MAGIC = {
    "JPEG": [b"\xff\xd8\xff\xe0", b"\xff\xd8\xff\xdb", b"\xff\xd8\xff\xc0"],
    "PNG": [b"\x89PNG\r\n\x1a\n", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"],
    "GIF": [b"GIF87a", b"GIF89a"],
    "BMP": [b"BM", b"BM" + struct.pack("<IHHII", 1000, 0, 0, 54, 40)],
    "TIFF": [b"II*\0", b"MM\0*", b"II*\0\x08\0\0\0"],
    "WEBP": [b"RIFF\0\0\0\0WEBPVP8 ", b"RIFF\0\0\0\0WEBPVP8L", b"RIFF\0\0\0\0WEBPVP8X"],
}


def test_every_accepted_format_has_magic_numbers():
    assert set(MAGIC) == set(FORMATS)


@pytest.mark.parametrize("fmt", list(MAGIC))
def test_random_bytes_behind_a_magic_number_are_image_errors(fmt):
    rng = random.Random(f"magic {fmt}")
    for _ in range(200):
        tail = rng.randbytes(rng.choice((0, 1, 8, 30, 100, 1000, 5000)))
        data = rng.choice(MAGIC[fmt]) + tail
        decode_or_refuse(data, "random.img")


@pytest.mark.parametrize(
    "error",
    [
        NotImplementedError("unknown"),
        TypeError("bad"),
        struct.error("unpack"),
        KeyError(3),
        IndexError("list"),
        SyntaxError("parse"),
        ZeroDivisionError("x"),
        RecursionError("deep"),
    ],
)
def test_any_exception_from_a_decoder_names_the_file(monkeypatch, error):
    from PIL import PngImagePlugin

    def fail(self):
        raise error

    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load", fail)
    with pytest.raises(ImageError, match=rf"^boom\.png: .*{type(error).__name__}"):
        Preprocessor(RGB, 10**8)(grey(1), "boom.png")


def test_a_memory_error_is_not_blamed_on_the_file(monkeypatch):
    # the bounds keep a decode small; running out of memory all the same is the server's fault
    from PIL import PngImagePlugin

    def fail(self):
        raise MemoryError

    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load", fail)
    with pytest.raises(MemoryError):
        Preprocessor(RGB, 10**8)(grey(1), "boom.png")


@pytest.mark.parametrize("mode", ["I", "F"])
def test_thirty_two_bit_images_scale_by_their_largest_finite_value(mode):
    values = np.array([[0, 50, 100, 200]] * 4, np.float32 if mode == "F" else np.int32)
    if mode == "F":
        values[0, 0], values[1, 0], values[2, 0] = np.nan, np.inf, -np.inf
    spec = Preprocessing(colour="L", resize=None, crop=4, mean=[0.0], std=[1.0])
    image = Preprocessor(spec, 10**8)(saved(Image.fromarray(values, mode), "TIFF"))[0] * 255
    assert image[3] == pytest.approx([0, 64, 128, 255], abs=0.01)
    if mode == "F":
        assert image[:3, 0] == pytest.approx([0, 255, 0], abs=0.01)


def test_a_float_image_with_a_huge_negative_value_is_scaled_without_overflow():
    """Values at most 1 scale by 255; -3e38 times 255 once overflowed float32, with numpy's
    warning (an error where warnings are errors) instead of a black pixel."""
    values = np.array([[-3e38, 0.0, 0.5, 1.0]] * 4, np.float32)
    spec = Preprocessing(colour="L", resize=None, crop=4, mean=[0.0], std=[1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        image = Preprocessor(spec, 10**8)(saved(Image.fromarray(values, "F"), "TIFF"))[0] * 255
    assert image[0] == pytest.approx([0, 0, 128, 255], abs=0.01)


def test_sixteen_bit_values_round_to_the_nearest_eight_bit_value():
    values = np.arange(0, 65536, 1, dtype=np.uint16).reshape(256, 256)
    spec = Preprocessing(colour="L", resize=None, crop=256, mean=[0.0], std=[1.0])
    out = Preprocessor(spec, 10**8)(saved(Image.fromarray(values), "PNG"))[0] * 255
    expected = np.round(values.astype(np.float64) * 255 / 65535)
    assert np.abs(out - expected).max() < 1e-3
