"""What the JPEG path of ``service.imaging.gpu_jpeg`` reads of a file's header before it decodes it
on the GPU, with nothing but the bytes (and Pillow's parsed header for the colour transform).

nvImageCodec parses a JPEG's header again itself, and not always as libjpeg (Pillow's decoder)
does: it reads every three-component image as YCbCr, and where a file has two frame headers the
two libraries could take different ones. The files where they could disagree go to Pillow.
"""

from __future__ import annotations

from PIL import Image

__all__ = ["DEVICE_FRAMES", "one_device_frame", "stored_as_rgb"]

#: Start-of-frame markers the device decodes: baseline, extended sequential, progressive
#: (Huffman-coded). The others (lossless, hierarchical, arithmetic-coded) go to Pillow.
DEVICE_FRAMES = {0xC0, 0xC1, 0xC2}
_FRAMES = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # every SOFn (not DHT, JPG, DAC)
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # markers without a length: TEM, RST0-7


def one_device_frame(data: bytes) -> bool:
    """Whether the markers before the first scan hold exactly one frame header, an 8-bit one
    of :data:`DEVICE_FRAMES` (the segments are walked by their lengths; anything malformed is
    ``False``, and Pillow's path decides)."""
    frames = []
    at, end = 2, len(data)
    while at + 4 <= end:
        if data[at] != 0xFF:
            return False
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _STANDALONE:
            at += 2
            continue
        if marker == 0xDA:  # start of scan
            break
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        if length < 2:
            return False
        if marker in _FRAMES:
            precision = data[at + 4] if at + 4 < end else 0
            frames.append((marker, precision))
        at += 2 + length
    else:
        return False  # no scan
    return len(frames) == 1 and frames[0][0] in DEVICE_FRAMES and frames[0][1] == 8


def stored_as_rgb(image: Image.Image) -> bool:
    """Whether a three-component JPEG holds RGB rather than YCbCr: Adobe's APP14 says transform
    0, or (without it) its components are named R, G and B, as libjpeg reads them."""
    transform = image.info.get("adobe_transform")
    if transform is not None:
        return transform == 0
    names = tuple(component[0] for component in getattr(image, "layer", ()))
    return names == (ord("R"), ord("G"), ord("B"))
