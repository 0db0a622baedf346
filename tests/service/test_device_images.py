"""JPEGs decoded and preprocessed through torchvision (``SMSO_DECODE_DEVICE``), on the CPU here:
the same code as on a GPU but for the device, against Pillow's path; what falls back to Pillow."""

from __future__ import annotations

import concurrent.futures
import io

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from service.card import Preprocessing
from service.device_images import DevicePreprocessor, device_decoding_unavailable
from service.images import ImageError, ImageTooLargeError, Preprocessor
from service.loader import _preprocessor
from service.settings import Settings

from .conftest import png

SPEC = Preprocessing(
    colour="RGB", resize=64, crop=56, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]
)


def jpeg(width: int, height: int, seed: int = 0, **save) -> bytes:
    """A smooth colour JPEG (blocky noise scaled up, as photos are smooth at this scale)."""
    rng = np.random.default_rng(seed)
    small = (rng.random((max(height // 4, 1), max(width // 4, 1), 3)) * 255).astype(np.uint8)
    image = Image.fromarray(small).resize((width, height), Image.Resampling.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, **save)
    return buffer.getvalue()


def grey_levels(a: np.ndarray, b: np.ndarray) -> float:
    """The largest difference of two normalised images, in 8-bit grey levels."""
    std = np.asarray(SPEC.std, np.float32).reshape(3, 1, 1)
    return float(np.abs(a - b).max() * std.max() * 255)


@pytest.fixture
def device() -> DevicePreprocessor:
    return DevicePreprocessor(SPEC, 10**8, "cpu")


@pytest.mark.parametrize("size", [(160, 120), (120, 160), (100, 100), (50, 40), (340, 255)])
def test_jpegs_come_out_within_a_grey_level_or_two_of_pillows(device, size):
    data = jpeg(*size, seed=size[0])
    got, want = device(data), Preprocessor(SPEC, 10**8)(data)
    assert got.shape == want.shape == (3, 56, 56)
    assert got.dtype == np.float32
    assert grey_levels(got, want) <= 2
    assert device.counts == {"device": 1, "pillow": 0}


def test_a_grey_jpeg_is_decoded_to_rgb_on_the_device(device):
    buffer = io.BytesIO()
    Image.fromarray(np.linspace(0, 255, 96 * 80, dtype=np.uint8).reshape(80, 96)).save(
        buffer, "JPEG"
    )
    got, want = device(buffer.getvalue()), Preprocessor(SPEC, 10**8)(buffer.getvalue())
    assert grey_levels(got, want) <= 2
    assert device.counts["device"] == 1


def test_other_formats_rotated_jpegs_and_grey_models_go_through_pillow_unchanged(device):
    pillow = Preprocessor(SPEC, 10**8)
    flat = png(np.full((30, 40, 3), 90, np.uint8))
    np.testing.assert_array_equal(device(flat), pillow(flat))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees
    rotated = jpeg(80, 60, exif=exif.tobytes())
    np.testing.assert_array_equal(device(rotated), pillow(rotated))
    assert device.counts == {"device": 0, "pillow": 2}
    grey = Preprocessing(colour="L", resize=32, crop=28, mean=[0.5], std=[0.5])
    grey_device = DevicePreprocessor(grey, 10**8, "cpu")
    data = jpeg(64, 48)
    np.testing.assert_array_equal(grey_device(data), Preprocessor(grey, 10**8)(data))
    assert grey_device.counts == {"device": 0, "pillow": 1}


def test_large_jpegs_and_jpegs_without_their_end_go_through_pillow(device):
    pillow = Preprocessor(SPEC, 10**8)
    large = jpeg(340, 256)  # shorter side 4 x the resize: Pillow decodes it at half scale
    np.testing.assert_array_equal(device(large), pillow(large))
    assert device.counts == {"device": 0, "pillow": 1}
    padded = jpeg(160, 120) + b"\x00" * 16  # zeros after the end-of-image marker: whole
    assert grey_levels(device(padded), pillow(padded)) <= 2
    assert device.counts == {"device": 1, "pillow": 1}
    with pytest.raises(ImageError):  # cut before its end: Pillow refuses it, says why
        device(jpeg(160, 120)[:-2])
    assert device.counts == {"device": 1, "pillow": 2}


def test_bad_files_get_pillows_errors(device):
    with pytest.raises(ImageError, match="truncated"):
        device(jpeg(160, 120)[:-300])
    with pytest.raises(ImageError, match="not a recognised image format"):
        device(b"\xff\xd8\xff not really a jpeg")
    with pytest.raises(ImageError, match="empty"):
        device(b"")
    small = DevicePreprocessor(SPEC, 100, "cpu")  # 100 pixels at most: refused by the header
    with pytest.raises(ImageTooLargeError, match="more than the 100 accepted"):
        small(jpeg(160, 120))
    assert device.counts["device"] == 0


def test_the_setting_refuses_a_device_it_cannot_use_and_says_why(tmp_path, monkeypatch):
    with pytest.raises(ValidationError, match="decode_device"):
        Settings(decode_device="gpu")
    if device_decoding_unavailable("cuda") is None:
        pytest.skip("this machine decodes on CUDA")
    with pytest.raises(ValidationError, match="needs a CUDA GPU"):
        Settings(decode_device="cuda")


def test_a_torchvision_that_cannot_decode_on_the_device_is_refused_at_load(monkeypatch):
    import torchvision.io

    def broken(*args, **kwargs):
        raise RuntimeError("nvJPEG is not available in this build")

    monkeypatch.setattr(torchvision.io, "decode_jpeg", broken)
    with pytest.raises(ValueError, match=r"could not decode a JPEG there.*nvJPEG is not available"):
        DevicePreprocessor(SPEC, 10**8, "cpu")


def test_the_loader_decodes_with_pillow_unless_asked():
    assert type(_preprocessor(SPEC, Settings())) is Preprocessor


@pytest.mark.cuda
@pytest.mark.skipif(
    device_decoding_unavailable("cuda") is not None, reason="needs torchvision and a CUDA GPU"
)
def test_on_cuda_jpegs_come_out_close_to_pillows_from_any_thread():
    imagenet = Preprocessing(
        colour="RGB", resize=256, crop=224, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]
    )
    device, pillow = DevicePreprocessor(imagenet, 10**8, "cuda"), Preprocessor(imagenet, 10**8)
    files = [jpeg(*size, seed=k) for k, size in enumerate([(640, 480), (480, 640), (100, 80)])]
    alone = [device(data) for data in files]
    for got, data in zip(alone, files, strict=True):
        want = pillow(data)
        print(f"nvJPEG against Pillow: {grey_levels(got, want):.1f} grey levels at most")
        assert grey_levels(got, want) <= 8  # nvJPEG's IDCT and upsampling, a float resize
        assert float(np.abs(got - want).mean()) * 0.229 * 255 <= 1.0
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # a CUDA stream per thread
        together = list(pool.map(device, files * 4))
    for got, want in zip(together, alone * 4, strict=True):
        np.testing.assert_array_equal(got, want)
    assert device.counts == {"device": 15, "pillow": 0}
    for cut in (files[0][:-2], files[0][: len(files[0]) // 2], files[1][:-100] + b"\xff\xd9"):
        with pytest.raises(ImageError):  # refused as Pillow refuses it, whichever decodes
            device(cut)
