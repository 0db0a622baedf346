"""The JPEG header checks that keep files two parsers could read differently off the GPU."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from service.imaging.jpeg_header import one_device_frame, stored_as_rgb


def _jpeg(mode: str = "RGB", **save: object) -> bytes:
    y, x = np.mgrid[0:24, 0:32]
    rgb = np.stack([x * 8, y * 10, (x + y) * 4], axis=-1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).convert(mode).save(out, "JPEG", **save)
    return out.getvalue()


def _segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body


def _with_frame(data: bytes, marker: int, precision: int = 8) -> bytes:
    """``data`` with its SOF0 marker byte and precision replaced."""
    at = data.index(b"\xff\xc0")
    return (
        data[: at + 1]
        + bytes([marker])
        + data[at + 2 : at + 4]
        + bytes([precision])
        + (data[at + 5 :])
    )


@pytest.mark.parametrize(
    "save", [{}, {"progressive": True}, {"restart_marker_blocks": 2}, {"subsampling": 0}]
)
def test_baseline_and_progressive_jpegs_have_one_device_frame(save):
    assert one_device_frame(_jpeg(**save))
    assert one_device_frame(_jpeg("L", **save))


@pytest.mark.parametrize(
    ("marker", "precision", "expected"),
    [
        (0xC0, 8, True),  # baseline
        (0xC1, 8, True),  # extended sequential
        (0xC2, 8, True),  # progressive
        (0xC1, 12, False),  # 12-bit
        (0xC3, 8, False),  # lossless
        (0xC9, 8, False),  # arithmetic-coded
        (0xCA, 8, False),
        (0xC5, 8, False),  # hierarchical
    ],
)
def test_only_8_bit_huffman_frames_go_to_the_device(marker, precision, expected):
    assert one_device_frame(_with_frame(_jpeg(), marker, precision)) is expected


def test_two_frame_headers_or_none_go_to_pillow():
    data = _jpeg()
    at = data.index(b"\xff\xc0")
    length = int.from_bytes(data[at + 2 : at + 4], "big")
    frame = data[at : at + 2 + length]
    assert not one_device_frame(data[:at] + frame + data[at:])
    assert not one_device_frame(data[:at] + data[at + 2 + length :])


def test_fill_bytes_and_standalone_markers_are_walked_over():
    data = _jpeg()
    at = data.index(b"\xff\xc0")
    padded = data[:at] + b"\xff\xff\xff" + data[at:]  # fill bytes before a marker
    assert one_device_frame(padded)
    comment = _segment(0xFE, b"a comment with \xff\xd9 inside")  # skipped by its length
    assert one_device_frame(data[:2] + comment + data[2:])


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[:2] + b"\x00" + d[3:],  # not a marker where one must be
        lambda d: d[:2] + b"\xff\xe0\x00\x01" + d[2:],  # a length below 2
        lambda d: d[:2] + b"\xff\xe0\xff\xff",  # a segment running past the end
        lambda d: d[: d.index(b"\xff\xda")],  # no scan
        lambda d: d[:3],
        lambda d: b"",
    ],
)
def test_malformed_headers_are_false_not_errors(damage):
    assert one_device_frame(damage(_jpeg())) is False


def _opened(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))


def test_rgb_stored_as_rgb_is_told_from_ycbcr():
    assert stored_as_rgb(_opened(_jpeg(keep_rgb=True)))  # Adobe transform 0, components R G B
    assert not stored_as_rgb(_opened(_jpeg()))
    assert not stored_as_rgb(_opened(_jpeg("L")))
