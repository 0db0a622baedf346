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

    python -m bench.batch_copy                    # ImageNet-sized images, on the CPU
    python -m bench.batch_copy --device cuda      # the upload to a GPU (onnxruntime-gpu)
    python -m bench.batch_copy --quick            # fewer rounds (a smoke test)

Prints a markdown table and writes ``bench/results/batch_copy.json`` (``--json PATH``).
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bench.lib import RESULTS, report
from bench.lib.load import interleave
from bench.lib.timing import median_time
from service.runtime.runner import bucket_for, buckets, fill

WAYS = ("stack, pad", "fill")


def stack_pad(images: Sequence[np.ndarray], size: int) -> np.ndarray:
    """The former path: stacked, then padded with zero rows to ``size``."""
    batch = np.stack(images)
    if len(batch) == size:
        return batch
    padded = np.zeros((size, *batch.shape[1:]), np.float32)
    padded[: len(batch)] = batch
    return padded


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
    ways = {WAYS[0]: functools.partial(median_time, old, repeats)}
    ways[WAYS[1]] = functools.partial(median_time, new, repeats)
    ms = {way: [t.median_ms for t in found] for way, found in interleave(ways, rounds).items()}
    ratios = [a / b for a, b in zip(ms["stack, pad"], ms["fill"], strict=True)]
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
    parser.add_argument("--json", type=Path, default=RESULTS / "batch_copy.json")
    args = parser.parse_args(argv)
    if args.device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        parser.error("--device cuda needs onnxruntime-gpu with its CUDA provider")
    rounds, repeats = (2, 3) if args.quick else (7, 15)
    sizes = buckets(args.max_batch)
    shape = (3, args.size, args.size)
    rows = [measure(n, shape, sizes, args.device, rounds, repeats) for n in args.batches]
    print(f"Batch into the session's input ({args.device}, images 3x{args.size}x{args.size}):\n")
    table = [
        [
            str(row["images"]),
            str(row["bucket"]),
            str(row["megabytes"]),
            *(f"{row['ms'][way]:.2f}" for way in WAYS),
            report.format_ratio(row["ratio"]),
        ]
        for row in rows
    ]
    header = ["images", "bucket", "MB", "stack, pad ms", "fill ms", "stack, pad / fill"]
    print(report.markdown_table(header, table), end="\n\n")
    result = {
        "device": args.device,
        "image_shape": list(shape),
        "rounds": rounds,
        "repeats": repeats,
        "machine": {"cpu": report.cpu_model(), "numpy": np.__version__},
        "onnxruntime": ort.__version__,
        "rows": rows,
    }
    report.save(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
