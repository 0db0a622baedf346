"""What the benchmarks send: images and request bodies with the headers that go with them.

Images are Fashion-MNIST test images (real picture content, read from Debian's
``dataset-fashion-mnist`` idx files, as ``make data`` installs them) or, without the dataset,
seeded random ones. A :class:`Body` is one request's bytes and headers: a multipart upload
(``/classify``) or an Open Inference Protocol ``infer`` request with binary data (``/v2``).

Client processes import this module (through :mod:`bench.lib.load`): the service's own modules
are imported by the functions that preprocess, not here.
"""

from __future__ import annotations

import gzip
import io
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

if TYPE_CHECKING:
    from service.core.card import ModelCard

FMNIST = Path("/usr/share/datasets/fashion-mnist")
BOUNDARY = "smso-bench-boundary"
#: The outputs ``/classify`` answers by default: the top 5 classes.
TOP5 = {"logits": {"classification": 5}}


def fashion_mnist(split: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST's ``train`` or ``test`` images, uint8 ``(N, 28, 28)``, and labels ``(N,)``
    (``OSError`` without the dataset)."""
    prefix = {"train": "train", "test": "t10k"}[split]

    def read(name: str, header: int) -> np.ndarray:  # idx: a header, then uint8 values
        return np.frombuffer(gzip.decompress((FMNIST / name).read_bytes())[header:], np.uint8)

    images = read(f"{prefix}-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
    return images, read(f"{prefix}-labels-idx1-ubyte.gz", 8).astype(np.int64)


def images(count: int) -> np.ndarray:
    """``count`` Fashion-MNIST images, uint8 28x28: the 10,000 test images first, then the
    training images (random ones without the dataset)."""
    try:
        found = fashion_mnist("test")[0][:count]
        if len(found) < count:
            found = np.concatenate([found, fashion_mnist("train")[0][: count - len(found)]])
        return found
    except OSError:
        return np.random.default_rng(0).integers(0, 256, (count, 28, 28), dtype=np.uint8)


def encode(image: np.ndarray, form: str, size: tuple[int, int] | None = None) -> bytes:
    """``image`` (uint8 grey) as a ``form`` file (``JPEG``: RGB, quality 90), resized to
    ``size`` (bilinear) if given."""
    picture = Image.fromarray(image)
    if form == "JPEG":
        picture = picture.convert("RGB")
    if size is not None:
        picture = picture.resize(size, Image.Resampling.BILINEAR)
    buffer = io.BytesIO()
    picture.save(buffer, form, **({"quality": 90} if form == "JPEG" else {}))
    return buffer.getvalue()


def jpegs(count: int, size: tuple[int, int] = (640, 480)) -> list[bytes]:
    """:func:`images` scaled up to ``size`` as JPEGs (a phone photo's size, by default)."""
    return [encode(image, "JPEG", size) for image in images(count)]


def pngs(count: int) -> list[bytes]:
    """:func:`images` as 28x28 grey PNGs (the shipped model's size)."""
    return [encode(image, "PNG") for image in images(count)]


@dataclass(frozen=True)
class Body:
    """One request's body and its headers."""

    data: bytes
    headers: dict[str, str]


def multipart_body(data: bytes, filename: str = "i.jpg", content_type: str = "image/jpeg") -> Body:
    """``data`` as the one file of a ``multipart/form-data`` form, the part named ``file``."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"'
        f"\r\nContent-Type: {content_type}\r\n\r\n"
    )
    body = head.encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()
    return Body(body, {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})


def infer_body(image: bytes | np.ndarray, outputs: Mapping[str, Mapping[str, Any]]) -> Body:
    """An ``infer`` request with binary data: encoded image bytes as ``image_bytes`` (``BYTES``)
    or a tensor as ``image`` (``FP32``, its shape as it is), asking for ``outputs`` (name ->
    parameters, e.g. :data:`TOP5`)."""
    if isinstance(image, bytes):
        # one BYTES element in the binary format: <uint32 length><bytes>
        name, datatype, shape = "image_bytes", "BYTES", [1]
        raw = struct.pack("<I", len(image)) + image
    else:
        tensor = np.ascontiguousarray(image, "<f4")
        name, datatype, shape, raw = "image", "FP32", list(tensor.shape), tensor.tobytes()
    header = {
        "inputs": [
            {
                "name": name,
                "datatype": datatype,
                "shape": shape,
                "parameters": {"binary_data_size": len(raw)},
            }
        ],
        "outputs": [{"name": k, "parameters": dict(v)} for k, v in outputs.items()],
    }
    encoded = json.dumps(header).encode()
    headers = {
        "Inference-Header-Content-Length": str(len(encoded)),
        "Content-Type": "application/octet-stream",
    }
    return Body(encoded + raw, headers)


def preprocessed(card: ModelCard, files: Sequence[bytes]) -> np.ndarray:
    """``files`` decoded and preprocessed as the service does for ``card``: ``(N, C, H, W)``."""
    from service.imaging.images import Preprocessor

    pre = Preprocessor(card.preprocessing, 10**9)
    return np.stack([pre(data) for data in files])


def tensor_bodies(card: ModelCard, files: Sequence[bytes]) -> list[Body]:
    """Each of ``files`` preprocessed, as one ``infer`` request's ``FP32`` tensor (top 5)."""
    return [infer_body(tensor[None], TOP5) for tensor in preprocessed(card, files)]
