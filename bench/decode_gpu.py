"""JPEG decoding on the GPU (nvJPEG through torchvision and nvImageCodec) against the CPU path.

``/classify`` at thousands of images/s needs about 4 ms of one core per 640x480 JPEG on the CPU
(``docs/results/gpu.md``): more cores than a 16-core machine has once HTTP is paid for. This
measures the alternative before the service is built around it: the same preprocessing (RGB,
resize the shorter side to 256 bilinear antialiased with torchvision's size rounding, centre
crop 224, ImageNet mean and std) with the decode on the device.

* **cpu (Pillow)**: ``service.imaging.images.Preprocessor``, one image at a time in this thread:
  what one decode thread of the service does.
* **torchvision on DEVICE, batch B**: ``torchvision.io.decode_jpeg`` on a list of B files
  (on CUDA one batched nvJPEG call), then per image ``resize`` (antialiased), ``center_crop``
  and the normalisation on the device, stacked into ``(B, 3, 224, 224)`` float32 and
  synchronised.
* **nvImageCodec on DEVICE, batch B**: one ``Decoder.decode`` call on B files (nvJPEG; the
  hardware decoder where the GPU has one), each image copied to host memory: the decode alone.
* **service (gpu_jpeg) on DEVICE**: the service's ``SMSO_DECODE_DEVICE=cuda`` path
  (``service.imaging.gpu_jpeg``: nvImageCodec, then the preprocessing graph on onnxruntime's CUDA
  provider), one image per call; ``service-device``: the same with the decoded image read by
  the graph on the GPU instead of copied to host memory and back (``transfer="device"``).
* **one image per call from THREADS threads**, for each path (torchvision's threads each on a
  CUDA stream of its own, nvImageCodec's each with a decoder of its own): how the service's
  decode threads call a decoder, without gathering images across requests first.

``--paths`` picks among ``pillow``, ``torchvision``, ``nvimgcodec`` and ``service``; a path
that cannot run here (no torchvision, nvImageCodec or CUDA provider) is reported, not fatal.

For each: images/s on the wall clock, this process's CPU milliseconds per image (every thread,
nvJPEG's host work included: what a server would pay in cores), and the largest and mean
difference from Pillow's output in grey levels (nvJPEG's IDCT and chroma upsampling and a
float resize are not bit-exact with libjpeg-turbo and Pillow's fixed-point resize).
torchvision's image decoders are deprecated since 0.29 (for TorchCodec); the service decodes
with nvImageCodec, NVIDIA's own package, and needs no torch.

    python -m bench.decode_gpu --device cuda        # on a GPU machine
    python -m bench.decode_gpu --quick              # the same code on the CPU (a smoke test)

Prints a markdown table and writes ``bench/results/decode_gpu.json`` (``--json PATH``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import importlib.metadata
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bench.lib import RESULTS, report
from bench.lib.gpu import gpu_info
from bench.lib.payloads import jpegs
from bench.lib.timing import Timing, median_time
from service.core.card import Preprocessing
from service.imaging.images import Preprocessor

PATHS = ("pillow", "torchvision", "nvimgcodec", "service", "service-device")
IMAGENET = Preprocessing(
    colour="RGB", resize=256, crop=224, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]
)


def torch_preprocess(device: str, spec: Preprocessing) -> Callable[[Sequence[bytes]], Any]:
    """Encoded JPEGs -> ``(B, 3, crop, crop)`` float32 on ``device``, synchronised."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms.v2 import functional as F

    # deprecated since 0.29 in favour of TorchCodec: said once (not per call, from threads)
    warnings.filterwarnings("ignore", message=".*decoding and encoding capabilities")
    mean = torch.tensor(spec.mean, device=device).view(3, 1, 1) * 255
    scale = 1 / (torch.tensor(spec.std, device=device).view(3, 1, 1) * 255)

    def run(files: Sequence[bytes]) -> Any:
        datas = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in files]
        images = decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)
        out = torch.empty((len(files), 3, spec.crop, spec.crop), device=device)
        for k, image in enumerate(images):
            resized = F.resize(image, [spec.resize], antialias=True)
            cropped = F.center_crop(resized, [spec.crop])
            out[k] = (cropped.float() - mean) * scale
        if device.startswith("cuda"):
            torch.cuda.current_stream(device).synchronize()
        return out

    if not device.startswith("cuda"):
        return run
    streams = threading.local()

    def on_own_stream(files: Sequence[bytes]) -> Any:
        """``run`` on a CUDA stream of the calling thread's own (threads do not wait for each
        other's work, as they would on the default stream)."""
        if not hasattr(streams, "stream"):
            streams.stream = torch.cuda.Stream(device)
        with torch.cuda.stream(streams.stream):
            return run(files)

    return on_own_stream


def _each(
    fn: Callable[[bytes], object],
    files: list[bytes],
    pool: concurrent.futures.Executor | None = None,
) -> list[object]:
    """``fn`` on every file: in this thread, or spread over ``pool``'s threads."""
    return [fn(data) for data in files] if pool is None else list(pool.map(fn, files))


def _one(batch_fn: Callable[[list[bytes]], object], data: bytes) -> object:
    """A batched decoder called with one image."""
    return batch_fn([data])


def grey_levels(got: np.ndarray, want: np.ndarray, spec: Preprocessing) -> tuple[float, float]:
    """Largest and mean absolute difference of two normalised batches, in grey levels."""
    std = np.asarray(spec.std, np.float32).reshape(1, 3, 1, 1)
    levels = np.abs(got - want) * std * 255
    return float(levels.max()), float(levels.mean())


def nvimgcodec_decode(device: str) -> Callable[[Sequence[bytes]], list[np.ndarray]]:
    """Encoded JPEGs -> ``(H, W, 3)`` uint8 RGB in host memory, one ``decode`` call for the
    list, with a decoder per calling thread configured as the service's
    (``service.imaging.gpu_jpeg.new_decoder``: nvJPEG on ``device``; its CPU decoder on cpu)."""
    from service.imaging.gpu_jpeg import load_nvimgcodec, new_decoder

    nvimgcodec = load_nvimgcodec()
    local = threading.local()
    on_gpu = device.startswith("cuda")
    device_id = int(device.partition(":")[2] or 0) if on_gpu else 0

    def run(files: Sequence[bytes]) -> list[np.ndarray]:
        if not hasattr(local, "decoder"):
            local.decoder, local.params = new_decoder("cuda" if on_gpu else "cpu", device_id)
        streams = [nvimgcodec.CodeStream(data) for data in files]
        images = local.decoder.decode(streams, params=local.params)
        if any(image is None for image in images):
            raise RuntimeError("nvImageCodec did not decode every image")
        return [np.asarray(image.cpu()) for image in images]

    return run


def service_preprocess(
    device: str, transfer: Literal["host", "device"] = "host"
) -> Callable[[bytes], np.ndarray]:
    """The service's ``decode_device`` path: ``service.imaging.gpu_jpeg.GpuJpegPreprocessor``, the
    decoded image copied to host memory and uploaded again (``host``) or read on the GPU
    (``device``)."""
    from service.imaging.gpu_jpeg import GpuJpegPreprocessor

    on_gpu = device.startswith("cuda")
    device_id = int(device.partition(":")[2] or 0) if on_gpu else 0
    taken: list[str] = []
    pre = GpuJpegPreprocessor(
        Preprocessor(IMAGENET, 10**9),
        "cuda" if on_gpu else "cpu",
        device_id,
        taken.append,
        transfer,
    )

    def run(data: bytes) -> np.ndarray:
        out = pre(data, "bench.jpg")
        if taken.pop() != "device":
            raise RuntimeError("the service's path sent a benchmark JPEG to Pillow")
        return out

    return run


def _batched(
    name: str, device: str, files: list[bytes], want: np.ndarray
) -> tuple[Callable[[Sequence[bytes]], np.ndarray], tuple[float, float]] | str:
    """Path ``name`` as ``files -> (B, 3, crop, crop)`` float32 and its difference from Pillow,
    or why it cannot run here."""
    try:
        if name == "torchvision":
            run_torch = torch_preprocess(device, IMAGENET)

            def batch(chunk: Sequence[bytes]) -> np.ndarray:
                return run_torch(chunk).cpu().numpy()

        elif name == "nvimgcodec":
            decode = nvimgcodec_decode(device)

            def batch(chunk: Sequence[bytes]) -> np.ndarray:
                decode(chunk)  # the decode alone: compared by its preprocessed result below
                return want[: len(chunk)]

            # its pixels through Pillow's geometry: the decoders' difference alone
            pre = Preprocessor(IMAGENET, 10**9)
            from PIL import Image

            got = np.stack([pre.tensor(pre.geometry(Image.fromarray(a))) for a in decode(files)])
            return batch, grey_levels(got, want, IMAGENET)
        else:
            one = service_preprocess(device, "device" if name == "service-device" else "host")

            def batch(chunk: Sequence[bytes]) -> np.ndarray:
                return np.stack([one(data) for data in chunk])

        return batch, grey_levels(batch(files), want, IMAGENET)
    except Exception as error:  # the library or the provider is missing: say why, go on
        return f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    files = jpegs(max(args.batches))
    pre = Preprocessor(IMAGENET, 10**9)
    want = np.stack([pre(data) for data in files])
    rows: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    singles: list[tuple[str, Callable[[bytes], object], tuple[float, float]]] = []
    if "pillow" in args.paths:
        for batch in args.batches:
            chunk = files[:batch]
            timing = median_time(functools.partial(_each, pre, chunk), args.rounds)
            rows.append(_row("cpu (Pillow), one thread", batch, timing, (0.0, 0.0)))
        singles.append(("cpu (Pillow)", pre, (0.0, 0.0)))
    for name in PATHS[1:]:
        if name not in args.paths:
            continue
        found = _batched(name, args.device, files, want)
        if isinstance(found, str):
            errors[name] = found
            continue
        batch_fn, difference = found
        label = {
            "service": "service (gpu_jpeg), one image per call",
            "service-device": "service (gpu_jpeg, read on the device), one image per call",
        }.get(name, name)
        for batch in args.batches:
            chunk = files[:batch]
            timing = median_time(functools.partial(batch_fn, chunk), args.rounds)
            rows.append(_row(f"{label} on {args.device}", batch, timing, difference))
        singles.append((f"{name} on {args.device}", functools.partial(_one, batch_fn), difference))
    # as the service's decode threads call a decoder: one image per call, from several threads
    with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
        for path, one, difference in singles:
            timing = median_time(functools.partial(_each, one, files, pool), args.rounds)
            label = f"{path}, one image per call, {args.threads} threads"
            rows.append(_row(label, len(files), timing, difference))
    return {"rows": rows, "errors": errors}


def _row(path: str, batch: int, timing: Timing, difference: tuple[float, float]) -> dict[str, Any]:
    return {
        "path": path,
        "batch": batch,
        "images_per_second": 1e3 * batch / timing.median_ms,
        "cpu_ms_per_image": timing.cpu_ms / batch,
        "max_grey_levels": difference[0],
        "mean_grey_levels": difference[1],
    }


def versions() -> dict[str, Any]:
    """numpy's, torch's and torchvision's versions (torch not imported here), the GPU."""
    found: dict[str, Any] = {"python": report.machine()["python"], "numpy": np.__version__}
    for package in ("torch", "torchvision"):
        found[package] = "missing"
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[package] = importlib.metadata.version(package)
    return found | gpu_info()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=8, help="for the one-image-per-call rows")
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=PATHS,
        default=list(PATHS),
        help="which decoders to measure (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="batches 1 and 4, 2 rounds")
    parser.add_argument("--json", type=Path, default=RESULTS / "decode_gpu.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.rounds, args.threads = [1, 4], 2, 2
    result = {"device": args.device, "versions": versions(), **measure(args)}
    print(f"JPEG 640x480 -> 3x224x224 float32 ({args.device}):\n")
    rows = [
        [
            row["path"],
            str(row["batch"]),
            f"{row['images_per_second']:,.0f}",
            f"{row['cpu_ms_per_image']:.2f}",
            f"{row['max_grey_levels']:.1f} / {row['mean_grey_levels']:.2f}",
        ]
        for row in result["rows"]
    ]
    header = ["path", "batch", "images/s", "CPU ms / image", "max / mean grey levels off Pillow"]
    print(report.markdown_table(header, rows))
    for name, error in result["errors"].items():
        print(f"\n{name}'s path did not run: {error}")
    print()
    report.save(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
