"""JPEGs decoded on the GPU: the ``cuda`` decode device (``SMSO_DECODE_DEVICE=cuda``).

Decoding a 640 x 480 JPEG and resizing it take about 3.5 ms each of one core with Pillow, so
a CPU-bound server tops out far below its GPU. Here the common case runs on the GPU:

1. the header, read by Pillow (no pixels decoded), decides the route and refuses what
   :class:`~service.imaging.images.Preprocessor` refuses (over the pixel limit, too long a strip),
   with the same errors;
2. nvImageCodec decodes the JPEG (nvJPEG; ``nvidia-nvimgcodec-cu13`` and ``nvidia-nvjpeg``) to
   ``(H, W, 3)`` uint8 RGB;
3. the colour step, resize, centre crop and normalisation run as one onnxruntime graph
   (:mod:`service.imaging.preprocess_graph`) on the CUDA provider, returning the ``(C, S, S)``
   float32 input of the model card.

Everything else takes Pillow's path, unchanged: another format, CMYK and YCCK, RGB stored as
RGB (Adobe's transform 0, or components named R, G, B: nvImageCodec would read them as YCbCr),
an EXIF orientation other than upright, a file that does not end with the end-of-image marker
(a truncated JPEG is refused there, as it always was), anything but exactly one 8-bit baseline,
extended or progressive frame header before the scan (arithmetic-coded, lossless, 12-bit, or two
frame headers that parsers could read differently), more than :data:`DEVICE_MAX_PIXELS`
pixels, one large enough for Pillow's reduced-scale (draft) decoding, a model card without a
resize or an image smaller than the crop after it, and any image the GPU decoder gives up on.

From the same decoded pixels the graph's result is Pillow's within one grey level (before
normalisation) on all but about 2e-5 of the values, which are two off: Pillow resamples in fixed
point and rounds between its two passes. The decoders add differences of their own (nvJPEG's
inverse DCT is not libjpeg-turbo's; chroma is upsampled as libjpeg-turbo does).

With ``device="cpu"`` the same code runs nvImageCodec's CPU decoder (libjpeg-turbo) and the
graph on the CPU provider: what the tests run on a machine without a GPU.
"""

from __future__ import annotations

import ctypes
import io
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any, Literal

import numpy as np
import onnxruntime as ort
from PIL import Image

from service.imaging.images import Preprocessor, crop_offsets, resized_size
from service.imaging.jpeg_header import one_device_frame, stored_as_rgb
from service.imaging.preprocess_graph import GRAPH
from service.runtime.providers import CPU, CUDA, has_nvidia_gpu, quiet_native_output

__all__ = [
    "DEVICE_MAX_PIXELS",
    "DeviceDecodeError",
    "GpuJpegPreprocessor",
    "check_available",
    "load_nvimgcodec",
    "new_decoder",
]

log = logging.getLogger("service.gpu_jpeg")  # stable for logging configs, wherever the module lives

#: Pillow's ``convert("L")`` (ITU-R 601-2 luma in 16-bit fixed point) and RGB kept as it is.
_LUMA = np.array([[19595], [38470], [7471]], np.float32)
_RGB = np.eye(3, dtype=np.float32) * 2.0**16
_EXIF_ORIENTATION = 0x0112
_END_OF_IMAGE = b"\xff\xd9"
#: Images with more pixels take Pillow's path: the graph holds several float32 copies of an
#: image on the GPU (about 40 bytes a pixel at its peak, in onnxruntime's arena, which does not
#: shrink). A JPEG the device would take is under 4 x resize on its shorter side anyway (larger
#: ones are decoded at reduced scale by Pillow): this bounds the long, thin ones.
DEVICE_MAX_PIXELS = 1 << 22

_lock = threading.Lock()
_module: Any = None


class DeviceDecodeError(ValueError):
    """The ``cuda`` decode device cannot run here (a setting's error, reported at start-up)."""


def load_nvimgcodec() -> Any:
    """``nvidia.nvimgcodec``, imported once with its native start-up messages silenced (it
    prints, from C++, a line for each optional library it lacks: nvJPEG2000, nvTIFF)."""
    global _module
    if _module is not None:  # every decode calls this: no lock once imported
        return _module
    with _lock:
        if _module is None:
            # read once, at import: no log line per undecodable client file (route() bounds
            # the pixels nvImageCodec allocates, from the header, before it decodes)
            os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
            try:
                with quiet_native_output():
                    from nvidia import nvimgcodec
            except ImportError as error:
                raise DeviceDecodeError(
                    "decode_device=cuda needs NVIDIA's nvImageCodec (pip install "
                    f"'smso[gpu-decode]'); it could not be imported: {error}"
                ) from None
            _module = nvimgcodec
        return _module


def check_available(device: Literal["cuda", "cpu"] = "cuda") -> None:
    """A :class:`DeviceDecodeError` saying what is missing where ``device`` cannot decode here
    (checked before a server starts; the first model's load then decodes a probe image)."""
    load_nvimgcodec()
    if device == "cuda":
        if CUDA not in ort.get_available_providers():
            raise DeviceDecodeError(
                "decode_device=cuda needs onnxruntime's CUDAExecutionProvider (onnxruntime-gpu, "
                f"smso[serving]); this onnxruntime has {ort.get_available_providers()}"
            )
        if not has_nvidia_gpu():
            raise DeviceDecodeError("decode_device=cuda needs an NVIDIA GPU; none is here")


def new_decoder(device: Literal["cuda", "cpu"], device_id: int = 0) -> tuple[Any, Any]:
    """An nvImageCodec decoder for one thread and its decode parameters, as the service
    decodes: nvJPEG's hardware, GPU and hybrid backends on ``cuda`` (libjpeg-turbo on
    ``cpu``), to ``(H, W, 3)`` uint8 sRGB, no EXIF rotation."""
    nvimgcodec = load_nvimgcodec()
    if device == "cuda":
        kinds = [nvimgcodec.HW_GPU_ONLY, nvimgcodec.GPU_ONLY, nvimgcodec.HYBRID_CPU_GPU]
    else:
        kinds = [nvimgcodec.CPU_ONLY]
        device_id = nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY
    decoder = nvimgcodec.Decoder(
        device_id=device_id,
        max_num_cpu_threads=1,
        backends=[nvimgcodec.Backend(kind) for kind in kinds],
        # chroma upsampled as libjpeg-turbo (and so Pillow) does by default: the library's
        # own default has changed between versions
        options=":fancy_upsampling=1",
    )
    params = nvimgcodec.DecodeParams(
        apply_exif_orientation=False,  # rotated images take Pillow's path
        color_spec=nvimgcodec.ColorSpec.SRGB,
        allow_any_depth=False,
    )
    return decoder, params


def _probe_jpeg(resize: int) -> bytes:
    """A colour JPEG (gradients and an edge), decoded once at load to check the device's path:
    about ``1.7 x 1.3`` times ``resize``, so that both resize passes shrink it by a factor that
    is not a whole number."""
    width, height = round(1.7 * resize) + 3, round(1.3 * resize) + 1
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // width, y * 255 // height, (x + y) % 256], axis=-1)
    rgb[: height // 3, : width // 2] = 240
    rgb = rgb.astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, "JPEG", quality=95)
    return out.getvalue()


#: Largest difference, in grey levels, between the device's result for the probe image and
#: Pillow's before the path is trusted (the decoders' inverse DCTs differ by a level or two).
PROBE_TOLERANCE = 8


@cache
def _cuda_runtime() -> ctypes.CDLL:
    """The CUDA runtime the process has loaded (onnxruntime's CUDA provider and nvImageCodec
    load it), for ``cudaStreamSynchronize``."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            runtime = ctypes.CDLL(name)
        except OSError:
            continue
        runtime.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        runtime.cudaStreamSynchronize.restype = ctypes.c_int
        return runtime
    raise DeviceDecodeError("transfer='device' needs the CUDA runtime (libcudart); none loads")


def _synchronise(stream: int | None) -> None:
    """Wait for ``stream`` as ``__cuda_array_interface__`` names it (``None``: nothing to wait
    for; 1 and 2 are the legacy and per-thread default streams, which the runtime's handles
    ``cudaStreamLegacy`` and ``cudaStreamPerThread`` are too)."""
    if stream is None:
        return
    status = _cuda_runtime().cudaStreamSynchronize(ctypes.c_void_p(stream))
    if status != 0:
        raise RuntimeError(f"cudaStreamSynchronize failed with CUDA error {status}")


@dataclass(frozen=True, eq=False)
class GpuJpegPreprocessor:
    """Encoded bytes -> ``(C, S, S)`` float32, as ``preprocessor`` makes it, decoding the common
    JPEGs on ``device`` (see the module's docstring); a drop-in for :class:`Preprocessor`.

    Thread-safe: each decode thread has its own nvImageCodec decoder; the graph's session is
    shared (onnxruntime's ``run`` may be called from several threads).
    """

    preprocessor: Preprocessor
    device: Literal["cuda", "cpu"] = "cuda"
    device_id: int = 0
    #: called with ``"device"`` or ``"pillow"`` for each image, by where it was decoded
    on_decoded: Callable[[str], None] = lambda decoder: None
    #: ``host``: the decoded image is copied to host memory (``Image.cpu()``, a pinned buffer
    #: each time) and onnxruntime uploads it again; ``device``: the graph reads it where it was
    #: decoded (IO binding on its device pointer, after its stream is synchronised)
    transfer: Literal["host", "device"] = "host"
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def __post_init__(self) -> None:
        spec = self.preprocessor.spec
        channels = 1 if spec.colour == "L" else 3
        if len(spec.mean) != channels or len(spec.std) != channels:
            raise DeviceDecodeError(
                f"mean {spec.mean} and std {spec.std} do not have one value per channel of "
                f"{spec.colour}"
            )
        check_available(self.device)
        if self.transfer == "device" and self.device == "cuda":
            _cuda_runtime()
        self._probe()

    def _probe(self) -> None:
        """Decode :func:`_probe_jpeg` on the device and compare with Pillow: a decoder or a
        provider that does not work here fails the model's load, not its first request."""
        spec = self.preprocessor.spec
        if spec.resize is None or spec.resize < spec.crop:
            log.warning(
                "decode_device=%s does not apply to a model card without a resize to at least "
                "its crop (%s): Pillow decodes its images",
                self.device,
                spec,
            )
            return
        data = _probe_jpeg(spec.resize)
        pixels = self._decode(data, Image.open(io.BytesIO(data)).size)  # whatever max_pixels
        if pixels is None:
            raise DeviceDecodeError(f"nvImageCodec did not decode a JPEG on {self.device}")
        got = self.transform(pixels)
        want = self.preprocessor.tensor(
            self.preprocessor.geometry(Image.open(io.BytesIO(data)).convert(spec.colour))
        )
        if got.shape != want.shape:
            raise DeviceDecodeError(f"the graph made {got.shape} for Pillow's {want.shape}")
        levels = float(np.max(np.abs(got - want) * np.asarray(spec.std)[:, None, None]) * 255)
        if levels > PROBE_TOLERANCE:
            raise DeviceDecodeError(
                f"the {self.device} decoder's result for a probe JPEG is {levels:.1f} grey "
                f"levels off Pillow's (at most {PROBE_TOLERANCE} expected)"
            )

    @cached_property
    def _session(self) -> ort.InferenceSession:
        def options(strict: bool = False) -> ort.SessionOptions:
            made = ort.SessionOptions()
            made.log_severity_level = 3
            made.intra_op_num_threads = 1  # called from every decode thread at once
            made.add_session_config_entry("session.intra_op.allow_spinning", "0")
            if strict:  # every node on the GPU, or no session
                made.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
            return made

        if self.device != "cuda":
            return ort.InferenceSession(GRAPH.read_bytes(), options(), providers=[CPU])
        cuda = {"device_id": str(self.device_id), "arena_extend_strategy": "kSameAsRequested"}
        # every node on the GPU; where onnxruntime refuses that, the CPU takes what CUDA
        # cannot, and the log says so
        try:
            with quiet_native_output():
                session = ort.InferenceSession(
                    GRAPH.read_bytes(), options(strict=True), providers=[(CUDA, cuda), CPU]
                )
        except Exception as error:  # onnxruntime's own RuntimeError types
            log.warning(
                "some of the GPU decoding's preprocessing runs on the CPU (%s)",
                " ".join(str(error).split())[:300],
            )
            with quiet_native_output():
                session = ort.InferenceSession(
                    GRAPH.read_bytes(), options(), providers=[(CUDA, cuda), CPU]
                )
        if session.get_providers()[0] != CUDA:
            raise DeviceDecodeError("onnxruntime's CUDA provider did not load for the graph")
        return session

    @cached_property
    def _constants(self) -> dict[str, np.ndarray]:
        spec = self.preprocessor.spec
        channels = 1 if spec.colour == "L" else 3
        return {
            "weights": _LUMA if channels == 1 else _RGB,
            "mean": np.asarray(spec.mean, np.float32).reshape(channels, 1, 1),
            "std": np.asarray(spec.std, np.float32).reshape(channels, 1, 1),
        }

    def _decoder(self) -> tuple[Any, Any]:
        """This thread's nvImageCodec decoder and its decode parameters (a decoder may not be
        called from two threads at once)."""
        local = self._local
        if not hasattr(local, "decoder"):
            local.decoder, local.params = new_decoder(self.device, self.device_id)
        return local.decoder, local.params

    def route(self, data: bytes, name: str = "image") -> tuple[int, int] | None:
        """The JPEG's ``(width, height)`` where the device decodes it, else ``None`` (Pillow's
        path). Raises the :class:`Preprocessor`'s size errors from the header."""
        spec = self.preprocessor.spec
        if spec.resize is None or not data.startswith(b"\xff\xd8\xff"):
            return None
        if not data.endswith(_END_OF_IMAGE):
            return None  # truncated (or trailing bytes): Pillow decides
        if not one_device_frame(data):
            return None
        try:
            image = Image.open(io.BytesIO(data), formats=("JPEG",))
        except Exception:  # Pillow's path reports what is wrong with it
            return None
        if image.format != "JPEG" or image.mode not in ("RGB", "L"):
            return None  # CMYK, or an MPO's several pictures
        self.preprocessor.check_size(image, name)
        if image.mode == "RGB" and stored_as_rgb(image):
            return None
        width, height = image.size
        if width * height > DEVICE_MAX_PIXELS:
            return None
        if self.preprocessor.draft_size(width, height) is not None:
            return None  # Pillow decodes it at reduced scale
        if min(resized_size(width, height, spec.resize)) < spec.crop:
            return None  # zero padding
        try:
            orientation = image.getexif().get(_EXIF_ORIENTATION, 1)
        except Exception:
            return None
        return (width, height) if orientation in (1, None) else None

    def _decode(self, data: bytes, size: tuple[int, int]) -> Any:
        """The decoded ``(H, W, 3)`` uint8 RGB image: a numpy array in host memory, or with
        ``transfer="device"`` nvImageCodec's image on the GPU; ``None`` if the decoder gave
        up or made another shape."""
        nvimgcodec = load_nvimgcodec()
        decoder, params = self._decoder()
        width, height = size
        try:
            decoded = decoder.decode(nvimgcodec.CodeStream(data), params=params)
            if decoded is None or tuple(decoded.shape) != (height, width, 3):
                return None
            if self.transfer == "device" and decoded.buffer_kind != nvimgcodec.STRIDED_HOST:
                return decoded
            host = decoded.cpu()  # waits for the device
        except Exception:  # the decoder's failure on this file: Pillow's path decides
            return None
        if host is None:
            return None
        pixels = np.asarray(host)
        return pixels if pixels.dtype == np.uint8 else None

    def __call__(self, data: bytes, name: str = "image") -> np.ndarray:
        """Encoded bytes -> ``(C, S, S)`` float32 model input."""
        size = self.route(data, name)
        pixels = None if size is None else self._decode(data, size)
        if pixels is None:
            self.on_decoded("pillow")
            return self.preprocessor(data, name)
        self.on_decoded("device")
        return self.transform(pixels)

    def transform(self, pixels: Any) -> np.ndarray:
        """``(H, W, 3)`` uint8 RGB (a numpy array, or nvImageCodec's image on the GPU) ->
        ``(C, S, S)`` float32 through the graph."""
        height, width, _ = pixels.shape
        feeds = self._geometry(height, width)
        if isinstance(pixels, np.ndarray):
            feeds["image"] = np.ascontiguousarray(pixels).reshape(height, width * 3)
            return self._session.run(None, feeds)[0]
        interface = pixels.__cuda_array_interface__
        strides = interface.get("strides")
        pitch = strides[0] if strides else width * 3
        _synchronise(interface.get("stream"))
        binding = self._session.io_binding()
        binding.bind_input(
            "image", "cuda", self.device_id, np.uint8, [height, pitch], interface["data"][0]
        )
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        binding.bind_output("pixels", "cpu")
        self._session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0]  # pixels is alive until here: it holds the input

    def _geometry(self, height: int, width: int) -> dict[str, np.ndarray]:
        """The graph's inputs other than the image, for an ``height`` x ``width`` image."""
        spec = self.preprocessor.spec
        assert spec.resize is not None  # a preset without a resize is refused in __init__
        wide, tall = resized_size(width, height, spec.resize)
        crop = spec.crop
        top, left = crop_offsets(wide, tall, crop)
        channels = len(spec.mean)
        return {
            "row": np.array([width * 3], np.int64),
            "hwc": np.array([height, width, 3], np.int64),
            "width": np.array([1, channels, height, wide], np.int64),
            "height": np.array([1, channels, tall, wide], np.int64),
            "start": np.array([top, left], np.int64),
            "end": np.array([top + crop, left + crop], np.int64),
            **self._constants,
        }
