"""The batch's images into the session's input: one copy against stacking, then padding.

The batcher holds a batch as N images ``(C, H, W)``; the session reads one array of the
bucket's rows (``service.runtime.runner.buckets``). Two ways to get there, then the copy into the
session's input ``OrtValue`` (``update_inplace``, as ``service.runtime.runner.BoundRunner`` does; on
the CPU a copy in memory, on CUDA the upload):

* **stack, pad**: ``np.stack`` the images, then a zeroed array of the bucket's rows and a copy
  of the stacked rows into it (the service before ``service.runtime.runner.fill``);
* **fill**: the images copied straight into a host array of the bucket's rows, kept from call
  to call (``service.runtime.runner.fill``: what the runners do now).

Both run in interleaved rounds (this machine is shared and noisy); the table gives the median
milliseconds per batch and the ratio of the two within each round's median.

    python bench/batch_copy.py                    # ImageNet-sized images, on the CPU
    python bench/batch_copy.py --device cuda      # the upload to a GPU (onnxruntime-gpu)
    python bench/batch_copy.py --quick            # fewer rounds (a smoke test)

Prints a markdown table and writes ``bench/results/batch_copy.json`` (``--json PATH``).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.benchlib import write_json  # noqa: E402
from service.runtime.runner import bucket_for, buckets, fill  # noqa: E402

DEFAULT_JSON = ROOT / "bench" / "results" / "batch_copy.json"
WAYS = ("stack, pad", "fill")


def stack_pad(images: Sequence[np.ndarray], size: int) -> np.ndarray:
    """The former path: stacked, then padded with zero rows to ``size``."""
    batch = np.stack(images)
    if len(batch) == size:
        return batch
    padded = np.zeros((size, *batch.shape[1:]), np.float32)
    padded[: len(batch)] = batch
    return padded


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls (after one untimed call)."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(
    n: int, shape: tuple[int, ...], sizes: Sequence[int], device: str, rounds: int, repeats: int
) -> dict[str, Any]:
    """Both ways for a batch of ``n`` images of ``shape``, in ``rounds`` interleaved rounds."""
    size = bucket_for(n, sizes)
    rng = np.random.default_rng(n)
    images = [rng.standard_normal(shape, dtype=np.float32) for _ in range(n)]
    value = ort.OrtValue.ortvalue_from_shape_and_type((size, *shape), np.float32, device, 0)
    host = np.zeros((size, *shape), np.float32)

    def old() -> None:
        value.update_inplace(np.ascontiguousarray(stack_pad(images, size)))

    def new() -> None:
        fill(host, images)
        value.update_inplace(host)

    new()
    got = value.numpy()[:n]
    if not np.array_equal(got, np.stack(images)):
        raise RuntimeError("fill did not give the stacked images")
    ms: dict[str, list[float]] = {way: [] for way in WAYS}
    ratios = []
    for _ in range(rounds):
        one = {way: timed(fn, repeats) for way, fn in zip(WAYS, (old, new), strict=True)}
        for way, seconds in one.items():
            ms[way].append(1e3 * seconds)
        ratios.append(one["stack, pad"] / one["fill"])
    return {
        "images": n,
        "bucket": size,
        "megabytes": round(4 * size * int(np.prod(shape)) / 1e6, 1),
        "ms": {way: statistics.median(values) for way, values in ms.items()},
        "ratio": statistics.median(ratios),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--size", type=int, default=224, help="image side (3 channels)")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 31, 64])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 calls")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    if args.device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        parser.error("--device cuda needs onnxruntime-gpu with its CUDA provider")
    rounds, repeats = (2, 3) if args.quick else (7, 15)
    sizes = buckets(args.max_batch)
    shape = (3, args.size, args.size)
    rows = [measure(n, shape, sizes, args.device, rounds, repeats) for n in args.batches]
    print(f"Batch into the session's input ({args.device}, images 3x{args.size}x{args.size}):\n")
    print("| images | bucket | MB | stack, pad ms | fill ms | stack, pad / fill |")
    print("|--:|--:|--:|--:|--:|--:|")
    for row in rows:
        print(
            f"| {row['images']} | {row['bucket']} | {row['megabytes']} | "
            f"{row['ms']['stack, pad']:.2f} | {row['ms']['fill']:.2f} | {row['ratio']:.2f}x |"
        )
    report = {
        "device": args.device,
        "image_shape": list(shape),
        "rounds": rounds,
        "repeats": repeats,
        "machine": {"cpu": platform.processor() or platform.machine(), "numpy": np.__version__},
        "onnxruntime": ort.__version__,
        "rows": rows,
    }
    write_json(args.json, report)
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
