"""JPEGs decoded and preprocessed on the GPU (nvJPEG through torchvision), Pillow for the rest.

``SMSO_DECODE_DEVICE=cuda``: a 640x480 JPEG costs about 4 ms of one core through Pillow, so
thousands of ``/classify`` images a second need more cores than a GPU host has. On the device:

1. the header is read by Pillow as on the CPU path (:class:`service.images.Preprocessor`:
   formats, the pixel limit and the aspect ratio are refused the same way, before decoding);
2. a baseline or progressive JPEG in RGB or grey, upright (no EXIF orientation other than 1),
   whole (it ends with the end-of-image marker: nvJPEG's hardware decoder may not refuse a
   truncated file that Pillow refuses), smaller than four times the resize on its shorter side
   (larger ones Pillow decodes cheaply at a reduced scale, and on the device they would take
   hundreds of MB each), for a model whose colour is RGB, is decoded by
   ``torchvision.io.decode_jpeg`` on the device (nvJPEG) to ``(3, H, W)`` uint8; everything
   else (other formats, CMYK, rotated, grey models, a file nvJPEG refuses) goes through Pillow
   unchanged, with its errors;
3. resize the shorter side to ``resize`` (bilinear, antialiased, torchvision's size rounding),
   centre crop ``crop`` (zero padding when smaller), ``(v - 255 mean) / (255 std)`` in float32,
   all on the device; the ``(3, S, S)`` result is copied back for the batcher.

The result is not bit-exact with Pillow's: nvJPEG's IDCT and chroma upsampling differ from
libjpeg-turbo's, the resize runs in floating point where Pillow rounds to 8 bits between its two
passes (on the CPU, torchvision's decode and resize stay within 2 grey levels of Pillow's;
``bench/decode_gpu.py`` measures the GPU's difference). PyTorch and torchvision are needed
(``pip install torch torchvision``); the service's images do not carry them.
"""

from __future__ import annotations

import io
import threading
import warnings
from typing import Any

import numpy as np
from PIL import Image

from service.card import Preprocessing
from service.images import Preprocessor, _formats

__all__ = ["DevicePreprocessor", "device_decoding_unavailable"]

_ORIENTATION = 0x0112  # the EXIF tag
_END_OF_IMAGE = b"\xff\xd9"

# torchvision 0.29 deprecates its decoders in favour of TorchCodec: said once, here, for the
# process (warnings.catch_warnings around each call from several threads is not thread-safe)
warnings.filterwarnings("ignore", message=".*decoding and encoding capabilities")


def device_decoding_unavailable(device: str) -> str | None:
    """Why images cannot be decoded on ``device`` here (None: they may be), without touching
    the GPU (the settings check runs in the server's parent process too, which should not hold
    a CUDA context): PyTorch and torchvision importable, the device there. Whether torchvision
    can decode on it is tried by :class:`DevicePreprocessor` (:func:`_probe`)."""
    try:
        import torch
        import torchvision  # noqa: F401
    except ImportError as error:
        return (
            f"decoding on {device} needs PyTorch and torchvision (pip install torch "
            f"torchvision): {error}"
        )
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return f"decoding on {device} needs a CUDA GPU, and PyTorch sees none"
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            return f"there is no {device}: PyTorch sees {torch.cuda.device_count()} GPU(s)"
    return None


def _probe(device: str) -> None:
    """Decode a 16 x 16 grey JPEG on ``device``; ``ValueError`` with the reason where this
    torchvision cannot (built without nvJPEG, a device that fails)."""
    import torch
    from torchvision.io import decode_jpeg

    probe = io.BytesIO()
    Image.new("L", (16, 16), 128).save(probe, "JPEG")
    try:
        decode_jpeg(torch.frombuffer(bytearray(probe.getvalue()), dtype=torch.uint8), device=device)
    except Exception as error:
        raise ValueError(
            f"SMSO_DECODE_DEVICE={device}: torchvision could not decode a JPEG there "
            f"({type(error).__name__}: {error}); decode on the cpu instead"
        ) from None


class DevicePreprocessor:
    """:class:`~service.images.Preprocessor`'s interface (``__call__(data, name) -> (C, S, S)
    float32``) with JPEGs decoded and preprocessed on ``device`` ("cuda", "cuda:1"; "cpu" runs
    the same code through torchvision's CPU decoder, which is how it is tested without a GPU).
    Thread-safe: each calling thread works on a CUDA stream of its own."""

    def __init__(self, spec: Preprocessing, max_pixels: int, device: str) -> None:
        import torch

        _probe(device)
        self.spec, self.device = spec, device
        self.cpu = Preprocessor(spec, max_pixels)
        self.on_device = spec.colour == "RGB"  # grey models: Pillow's luma, on the CPU
        self._mean = torch.tensor(spec.mean, device=device).view(-1, 1, 1) * 255
        self._scale = 1 / (torch.tensor(spec.std, device=device).view(-1, 1, 1) * 255)
        self._local = threading.local()
        self._lock = threading.Lock()
        #: images decoded on the device, and those passed to Pillow
        self.counts = {"device": 0, "pillow": 0}

    @property
    def mode(self) -> str:
        return self.cpu.mode

    def _eligible(self, data: bytes, name: str) -> bool:
        """Whether the device decodes ``data``; raises as Pillow's path would for a file
        refused by its header."""
        try:
            image = Image.open(io.BytesIO(data), formats=_formats())
        except Exception:  # not an image Pillow opens: its own path says why
            return False
        with image:
            self.cpu._check_size(image, name)
            return (
                image.format == "JPEG"
                and image.mode in ("RGB", "L")
                and not self.cpu.drafts(image)
                and data.rstrip(b"\x00")[-2:] == _END_OF_IMAGE
                and image.getexif().get(_ORIENTATION, 1) == 1
            )

    def __call__(self, data: bytes, name: str = "image") -> np.ndarray:
        """Encoded bytes -> ``(C, S, S)`` float32 model input."""
        if self.on_device and data and self._eligible(data, name):
            try:
                out = self._on_device(data)
            except RuntimeError:  # nvJPEG refused the file: Pillow decodes it or says why
                pass
            else:
                self._count("device")
                return out
        self._count("pillow")
        return self.cpu(data, name)

    def _count(self, path: str) -> None:
        with self._lock:
            self.counts[path] += 1

    def _stream(self) -> Any:
        import torch

        if not self.device.startswith("cuda"):
            return None
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream(self.device)
        return stream

    def _on_device(self, data: bytes) -> np.ndarray:
        import contextlib

        import torch
        from torchvision.io import ImageReadMode, decode_jpeg
        from torchvision.transforms.v2 import functional as F

        stream = self._stream()
        context = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with context:
            encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            image = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device)
            if self.spec.resize is not None:
                image = F.resize(image, [self.spec.resize], antialias=True)
            image = F.center_crop(image, [self.spec.crop])
            out = ((image.float() - self._mean) * self._scale).cpu()  # waits for the stream
        return out.numpy()
