"""Which TensorRT libraries the installed onnxruntime-gpu's TensorRT provider needs.

onnxruntime-gpu links its TensorRT provider against one TensorRT major version (1.31: CUDA 13,
``libnvinfer.so.10``) while PyPI's newest TensorRT may be another (11): reading the provider's
own library keeps the pin right when onnxruntime moves. Run it with the venv's python:

    python docker/tensorrt_spec.py              # -> tensorrt-cu13-libs>=10,<11 (pip requirement)
    python docker/tensorrt_spec.py --libs-dir   # the installed tensorrt_libs folder, checked
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path


def fail(message: str) -> None:
    raise SystemExit(f"tensorrt_spec.py: {message}")


def onnxruntime_capi() -> Path:
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        fail(f"onnxruntime is not installed for {sys.executable}")
    return Path(next(iter(spec.submodule_search_locations))) / "capi"


def needed() -> tuple[int, int]:
    """(CUDA major of this onnxruntime build, TensorRT major its provider links against)."""
    capi = onnxruntime_capi()
    info = (capi / "build_and_package_info.py").read_text()
    cuda = re.search(r"cuda_version\s*=\s*['\"](\d+)\.", info)
    if cuda is None:
        fail(f"{capi / 'build_and_package_info.py'} names no cuda_version: not onnxruntime-gpu?")
    provider = capi / "libonnxruntime_providers_tensorrt.so"
    if not provider.is_file():
        fail(f"{provider} is missing: this onnxruntime has no TensorRT provider")
    trt = re.search(rb"libnvinfer\.so\.(\d+)\x00", provider.read_bytes())
    if trt is None:
        fail(f"{provider} names no libnvinfer.so.N")
    return int(cuda.group(1)), int(trt.group(1))


def libs_dir(trt_major: int) -> Path:
    spec = importlib.util.find_spec("tensorrt_libs")
    if spec is None or not spec.submodule_search_locations:
        fail(f"tensorrt_libs is not installed for {sys.executable}")
    folder = Path(next(iter(spec.submodule_search_locations)))
    for name in (f"libnvinfer.so.{trt_major}", f"libnvonnxparser.so.{trt_major}"):
        if not (folder / name).exists():
            found = sorted(p.name for p in folder.glob("lib*.so*"))
            fail(f"{folder} has no {name} (onnxruntime's TensorRT provider needs it); has {found}")
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--libs-dir", action="store_true", help="print the tensorrt_libs folder")
    args = parser.parse_args()
    cuda_major, trt_major = needed()
    if args.libs_dir:
        print(libs_dir(trt_major))
    else:
        print(f"tensorrt-cu{cuda_major}-libs>={trt_major},<{trt_major + 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
