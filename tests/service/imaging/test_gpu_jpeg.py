"""JPEGs decoded by nvImageCodec and preprocessed by the ONNX graph (``decode_device=cuda``):
Pillow's results within a grey level (two, rarely), the same refusals, and Pillow's path for
every image the device does not take. Here nvImageCodec's CPU decoder (libjpeg-turbo, as
Pillow's) and onnxruntime's CPU provider run the code; the ``cuda`` tests need a GPU."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

from service.core.card import Preprocessing
from service.imaging import gpu_jpeg
from service.imaging.gpu_jpeg import DeviceDecodeError, GpuJpegPreprocessor, check_available
from service.imaging.images import ImageError, ImageTooLargeError, Preprocessor
from service.imaging.preprocess_graph import GRAPH, build
from service.runtime.providers import CUDA, has_nvidia_gpu
from tests.service.conftest import png, wait_ready

pytest.importorskip("nvidia.nvimgcodec", reason="nvImageCodec: the gpu-decode extra")

IMAGENET = Preprocessing(
    colour="RGB", resize=256, crop=224, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]
)
GREY = Preprocessing(colour="L", resize=64, crop=56, mean=[0.5], std=[0.25])


def _photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """``(H, W, 3)`` uint8: gradients with noise and an edge, like a photograph's content."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // width, y * 255 // height, (x + 2 * y) % 256], axis=-1)
    rgb = rgb + rng.integers(-25, 25, rgb.shape)
    rgb[: height // 3, : width // 2] = 240  # a sharp edge
    return np.clip(rgb, 0, 255).astype(np.uint8)


def _jpeg(pixels: np.ndarray, mode: str = "RGB", **save: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, "JPEG", **save)
    return out.getvalue()


class _Recorder:
    def __init__(self) -> None:
        self.decoders: list[str] = []

    def __call__(self, decoder: str) -> None:
        self.decoders.append(decoder)


def _pair(spec: Preprocessing) -> tuple[Preprocessor, GpuJpegPreprocessor, _Recorder]:
    pillow = Preprocessor(spec, 50_000_000)
    recorder = _Recorder()
    return pillow, GpuJpegPreprocessor(pillow, "cpu", on_decoded=recorder), recorder


def _grey_levels(a: np.ndarray, b: np.ndarray, spec: Preprocessing) -> np.ndarray:
    """``|a - b|`` of two normalised ``(C, S, S)`` inputs, in 8-bit grey levels."""
    return np.abs(a - b) * np.asarray(spec.std, np.float32)[:, None, None] * 255


def test_the_committed_graph_is_what_the_module_builds():
    assert GRAPH.read_bytes() == build(), "run: python -m service.imaging.preprocess_graph"


@pytest.mark.parametrize(
    ("spec", "size", "save"),
    [
        (IMAGENET, (640, 480), {"quality": 90}),  # the benchmark's image: 4:2:0
        (IMAGENET, (480, 640), {"quality": 75, "subsampling": 0}),  # portrait, 4:4:4
        (IMAGENET, (300, 200), {"quality": 95}),  # enlarged
        (IMAGENET, (256, 256), {"quality": 90}),  # no resize, a crop only
        (IMAGENET, (1000, 700), {"quality": 85, "progressive": True}),
        (GREY, (160, 120), {"quality": 90}),  # colour JPEG, grey model: Pillow's convert("L")
    ],
)
def test_the_device_path_matches_pillow_within_a_grey_level_or_two(spec, size, save):
    pillow, device, recorder = _pair(spec)
    data = _jpeg(_photo(*size), **save)
    want, got = pillow(data, "a.jpg"), device(data, "a.jpg")
    assert recorder.decoders == ["device"]
    assert got.shape == want.shape == (len(spec.mean), spec.crop, spec.crop)
    assert got.dtype == np.float32
    _assert_close(_grey_levels(got, want, spec))


def _assert_close(levels: np.ndarray) -> None:
    """Pillow resamples in fixed point and rounds between its two passes: a few percent of the
    values differ by one grey level, a handful by two (2e-5 of them over 171 image sizes)."""
    assert levels.max() <= 2.0 + 1e-3
    assert (levels > 1.5).mean() < 1e-4
    assert (levels > 0.5).mean() < 0.03


def test_a_grey_jpeg_is_decoded_on_the_device_for_both_colour_modes():
    grey = _jpeg(_photo(200, 150), mode="L", quality=90)
    for spec in (IMAGENET, GREY):
        pillow, device, recorder = _pair(spec)
        _assert_close(_grey_levels(device(grey, "g.jpg"), pillow(grey, "g.jpg"), spec))
        assert recorder.decoders == ["device"]


def _rotated(data: bytes, orientation: int) -> bytes:
    image = Image.open(io.BytesIO(data))
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90, exif=exif.tobytes())
    return out.getvalue()


def test_what_the_device_does_not_take_gets_pillows_result_exactly():
    photo = _photo(320, 240)
    jpeg = _jpeg(photo, quality=90)
    others = {
        "png": png(photo),
        "cmyk": _jpeg(photo, mode="CMYK", quality=90),
        "rotated": _rotated(jpeg, 6),
        "trailing bytes": jpeg + b"\x00" * 16,
        "large (draft)": _jpeg(_photo(1100, 1050), quality=80),
    }
    pillow, device, recorder = _pair(IMAGENET)
    for name, data in others.items():
        np.testing.assert_array_equal(device(data, name), pillow(data, name), err_msg=name)
    assert recorder.decoders == ["pillow"] * len(others)
    upright = _rotated(jpeg, 1)
    device(upright, "upright")
    assert recorder.decoders[-1] == "device"


def _two_frame_headers(data: bytes) -> bytes:
    """``data`` with its frame header (SOF0) repeated, claiming another size, before the scan."""
    at = data.index(b"\xff\xc0")
    length = int.from_bytes(data[at + 2 : at + 4], "big")
    frame = bytearray(data[at : at + 2 + length])
    frame[5:9] = (16).to_bytes(2, "big") + (16).to_bytes(2, "big")  # height, width
    return data[:at] + bytes(frame) + data[at:]


def test_jpegs_whose_parsers_could_disagree_take_pillows_path():
    """RGB stored as RGB (nvImageCodec would read it as YCbCr), two frame headers, or more
    pixels than the device takes: Pillow decodes them, or refuses them as it always has."""
    photo = _photo(320, 240)
    pillow, device, recorder = _pair(IMAGENET)
    for name, data in {
        "adobe rgb": _jpeg(photo, quality=90, keep_rgb=True),
        "long strip": _jpeg(_photo(16_500, 260), quality=50),  # 4.3 M pixels, 63:1
    }.items():
        np.testing.assert_array_equal(device(data, name), pillow(data, name), err_msg=name)
    twice = _two_frame_headers(_jpeg(photo, quality=90))
    try:
        want: object = pillow(twice, "twice.jpg")
    except ImageError as error:
        want = str(error)
    try:
        got: object = device(twice, "twice.jpg")
    except ImageError as error:
        got = str(error)
    assert type(got) is type(want)
    assert recorder.decoders == ["pillow"] * 3


def test_restart_markers_and_subsamplings_are_decoded_on_the_device():
    photo = _photo(641, 479)
    pillow, device, recorder = _pair(IMAGENET)
    saves: tuple[dict[str, Any], ...] = (  # Pillow's JPEG options
        {"restart_marker_blocks": 4},
        {"subsampling": 1},
        {"subsampling": 2},
    )
    for save in saves:
        data = _jpeg(photo, quality=85, **save)
        _assert_close(_grey_levels(device(data, "a.jpg"), pillow(data, "a.jpg"), IMAGENET))
    assert recorder.decoders == ["device"] * 3


def test_cards_the_graph_cannot_serve_take_pillows_path():
    data = _jpeg(_photo(100, 80), quality=90)
    no_resize = Preprocessing(colour="L", resize=None, crop=28, mean=[0.5], std=[0.25])
    padded = Preprocessing(colour="L", resize=32, crop=48, mean=[0.5], std=[0.25])
    for spec in (no_resize, padded):
        pillow, device, recorder = _pair(spec)
        np.testing.assert_array_equal(device(data, "a.jpg"), pillow(data, "a.jpg"))
        assert recorder.decoders == ["pillow"]


def test_a_truncated_jpeg_is_refused_as_pillow_refuses_it():
    data = _jpeg(_photo(320, 240), quality=90)
    pillow, device, _ = _pair(IMAGENET)
    with pytest.raises(ImageError) as from_pillow:
        pillow(data[: len(data) // 2], "cut.jpg")
    with pytest.raises(ImageError) as from_device:
        device(data[: len(data) // 2], "cut.jpg")
    assert str(from_device.value) == str(from_pillow.value)


def test_size_limits_are_read_from_the_header_with_the_same_errors():
    data = _jpeg(_photo(400, 300), quality=90)
    small = Preprocessor(IMAGENET, 100_000)
    device = GpuJpegPreprocessor(small, "cpu")
    with pytest.raises(ImageTooLargeError, match=r"a.jpg: 400x300 is 120,000 pixels"):
        device(data, "a.jpg")
    strip = _jpeg(_photo(1300, 20), quality=90)
    with pytest.raises(ImageError, match="aspect ratio of 65:1"):
        GpuJpegPreprocessor(Preprocessor(IMAGENET, 50_000_000), "cpu")(strip, "s.jpg")


def test_a_damaged_scan_is_an_image_or_a_400_never_a_crash():
    data = bytearray(_jpeg(_photo(320, 240), quality=90))
    rng = np.random.default_rng(1)
    middle = len(data) // 2
    data[middle : middle + 200] = rng.integers(0, 256, 200, dtype=np.uint8).tobytes()
    _, device, _ = _pair(IMAGENET)
    try:
        out = device(bytes(data), "damaged.jpg")
    except ImageError as error:
        message = str(error)
    else:
        assert out.shape == (3, 224, 224)
        assert np.isfinite(out).all()
        return
    assert message.startswith("damaged.jpg: ")


def test_device_transfer_on_a_host_decoder_reads_the_host_image():
    """transfer="device" with nvImageCodec's CPU decoder: the image is in host memory, and is
    fed as such (the device pointer path needs a GPU: the cuda test)."""
    pillow = Preprocessor(IMAGENET, 50_000_000)
    device = GpuJpegPreprocessor(pillow, "cpu", transfer="device")
    data = _jpeg(_photo(640, 480), quality=90)
    _assert_close(_grey_levels(device(data, "a.jpg"), pillow(data, "a.jpg"), IMAGENET))


def test_concurrent_decoding_from_threads_gives_each_its_own_image():
    import concurrent.futures

    images = [_jpeg(_photo(320 + 8 * i, 240, seed=i), quality=90) for i in range(12)]
    pillow, device, recorder = _pair(IMAGENET)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda d: device(d, "t.jpg"), images * 2))
    for data, out in zip(images * 2, got, strict=True):
        _assert_close(_grey_levels(out, pillow(data, "t.jpg"), IMAGENET))
    assert recorder.decoders == ["device"] * 24


@pytest.mark.skipif(has_nvidia_gpu(), reason="checks the refusal on a machine without a GPU")
def test_cuda_without_a_gpu_is_refused_with_what_is_missing():
    with pytest.raises(DeviceDecodeError, match=r"needs an NVIDIA GPU|CUDAExecutionProvider"):
        check_available("cuda")


def test_the_service_decodes_on_the_device_and_counts_where(make_client, monkeypatch):
    """decode_device=cuda end to end, with the device's path on the CPU here: the loader builds
    it (probe included), /classify answers as with Pillow, and /metrics says where each image
    was decoded."""
    real = gpu_jpeg.GpuJpegPreprocessor
    monkeypatch.setattr(gpu_jpeg, "check_available", lambda device="cuda": None)
    monkeypatch.setattr(
        gpu_jpeg, "GpuJpegPreprocessor", lambda pillow, device, **kw: real(pillow, "cpu", **kw)
    )
    device_client = make_client(decode_device="cuda")
    pillow_client = make_client()
    files = [
        ("file", ("a.jpg", _jpeg(_photo(40, 30), quality=90), "image/jpeg")),
        ("file", ("b.png", png(_photo(40, 30)), "image/png")),
    ]
    wait_ready(device_client)
    on_device = device_client.post("/embed", files=files)
    on_pillow = pillow_client.post("/embed", files=files)
    assert on_device.status_code == on_pillow.status_code == 200
    a, b = ([r["embedding"] for r in answer.json()["results"]] for answer in (on_device, on_pillow))
    np.testing.assert_allclose(a, b, atol=2 / 255 / 0.25)  # two grey levels, normalised
    metrics = device_client.get("/metrics").text
    assert 'smso_images_decoded_total{decoder="device"} 1.0' in metrics
    assert 'smso_images_decoded_total{decoder="pillow"} 1.0' in metrics


def _gpu_cases() -> list[tuple[str, Preprocessing, bytes]]:
    """JPEGs of the kinds nvJPEG's backends treat differently."""
    photo = _photo(640, 480)
    return [
        ("4:2:0", IMAGENET, _jpeg(photo, quality=90)),
        ("4:4:4", IMAGENET, _jpeg(photo, quality=90, subsampling=0)),
        ("4:2:2", IMAGENET, _jpeg(photo, quality=90, subsampling=1)),
        ("progressive", IMAGENET, _jpeg(photo, quality=90, progressive=True)),
        ("restart markers", IMAGENET, _jpeg(photo, quality=90, restart_marker_blocks=4)),
        ("grey", IMAGENET, _jpeg(photo, mode="L", quality=90)),
        ("odd size", IMAGENET, _jpeg(_photo(641, 479), quality=90)),
        ("enlarged", IMAGENET, _jpeg(_photo(200, 150), quality=90)),
        ("grey card", GREY, _jpeg(_photo(200, 150), quality=90)),
    ]


@pytest.mark.cuda
@pytest.mark.skipif(
    not has_nvidia_gpu() or CUDA not in ort.get_available_providers(),
    reason="needs onnxruntime's CUDA provider and an NVIDIA GPU",
)
def test_on_the_gpu_nvjpeg_stays_within_a_few_grey_levels_of_pillow():
    """Each kind of JPEG on the GPU against Pillow, and 64 images from 8 threads at once (a
    decoder per thread, one session): nvJPEG's inverse DCT is not libjpeg-turbo's, so a few
    grey levels at most, below one on average."""
    import concurrent.futures

    for transfer in ("host", "device"):
        for kind, spec, data in _gpu_cases():
            pillow = Preprocessor(spec, 50_000_000)
            recorder = _Recorder()
            device = GpuJpegPreprocessor(pillow, "cuda", on_decoded=recorder, transfer=transfer)
            levels = _grey_levels(device(data, "g.jpg"), pillow(data, "g.jpg"), spec)
            print(
                f"nvJPEG + graph against Pillow ({transfer}), {kind}: worst {levels.max():.1f}, "
                f"mean {levels.mean():.3f}, over 2: {(levels > 2.5).mean():.2e}"
            )
            assert recorder.decoders == ["device"], kind
            assert levels.max() <= gpu_jpeg.PROBE_TOLERANCE, kind
            assert levels.mean() < 0.5, kind

        pillow = Preprocessor(IMAGENET, 50_000_000)
        recorder = _Recorder()
        device = GpuJpegPreprocessor(pillow, "cuda", on_decoded=recorder, transfer=transfer)
        images = [_jpeg(_photo(640 - i, 480, seed=i), quality=90) for i in range(16)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda d, device=device: device(d, "g.jpg"), images * 4))
        assert recorder.decoders == ["device"] * 64
        worst = max(
            float(_grey_levels(out, pillow(d, "g.jpg"), IMAGENET).max())
            for d, out in zip(images * 4, got, strict=True)
        )
        print(f"nvJPEG + graph against Pillow ({transfer}), 64 from 8 threads: worst {worst:.1f}")
        assert worst <= gpu_jpeg.PROBE_TOLERANCE  # each thread got its own image back
