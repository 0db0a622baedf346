#!/usr/bin/env bash
# Stage what bench/gpu_lease.sh carries to a CUDA machine without network access whose calls
# carry at most 64 MiB each (Python 3.12, x86-64; torch with CUDA, numpy, pillow, httpx and
# prometheus-client present):
#
#   bash bench/gpu_stage.sh .gpu-stage      # here, once: about a minute and 210 MB
#
# writes DIR/part1 .. DIR/part4 (onnxruntime-gpu's package without its TensorRT provider,
# zstd-compressed and split in four, about 49 MiB each; the wheel is 255 MB), DIR/wheels (the
# service's pure-Python and small wheels, about 5 MiB), DIR/wheels-late (zstandard to unpack
# the parts, py-spy to profile the server; about 8 MiB) and DIR/nvimg (nvImageCodec for Python
# 3.12 with its nvJPEG and libjpeg-turbo extensions, and nvJPEG: the service's GPU JPEG
# decoding, a tar.gz of about 9 MiB carried with part2). Keep DIR out of git
# (.git/info/exclude). The CUDA provider loads from PyTorch's nvidia-* packages as they are.
set -euo pipefail
DIR=${1:?usage: $0 DIR}
ORT=${ORT_VERSION:-1.31.1}
command -v zstd >/dev/null || { echo "zstd is needed (apt-get install zstd)" >&2; exit 1; }
mkdir -p "$DIR/wheels" "$DIR/wheels-late" "$DIR/nvimg"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$tmp" "onnxruntime-gpu==$ORT"
# the service's dependencies that the machine's Python lacks (see pyproject.toml)
python3 -m pip download -q "${plat[@]}" -d "$DIR/wheels" fastapi fastapi-offline uvicorn \
  httptools pydantic pydantic-settings python-multipart opentelemetry-api
python3 -m pip download -q --no-deps "${plat[@]}" -d "$DIR/wheels-late" zstandard py-spy
# what the machine's Python already has: one version of each package there
rm -f "$DIR"/wheels/{numpy,pillow,httpx,httpcore,anyio,h11,idna,certifi,click,typing_extensions}-*.whl
rm -f "$DIR"/wheels/{sniffio,protobuf,packaging,zipp,importlib_metadata}-*.whl
# nvImageCodec (pyproject.toml's gpu-decode extra), pruned to what the service uses on
# Python 3.12: its wheel holds a module for nine Pythons and seven extensions (25 MB)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$tmp/nvimg-wheels" \
  "nvidia-nvimgcodec-cu13>=0.9,<0.10" nvidia-nvjpeg
mkdir "$tmp/nvimg"
for wheel in "$tmp"/nvimg-wheels/*.whl; do (cd "$tmp/nvimg" && python3 -m zipfile -e "$wheel" .); done
find "$tmp/nvimg/nvidia/nvimgcodec" -name 'nvimgcodec_impl.cpython-*.so' ! -name '*-312-*' -delete
find "$tmp/nvimg/nvidia/nvimgcodec/extensions" -type f ! -name 'libnvjpeg_ext.*' \
  ! -name 'libjpeg_turbo_ext.*' -delete
tar -C "$tmp/nvimg" -czf "$DIR/nvimg/nvimg.tar.gz" .
mkdir "$tmp/pkg"
(cd "$tmp/pkg" && python3 -m zipfile -e "$tmp"/onnxruntime_gpu-*.whl . \
  && rm -f onnxruntime/capi/libonnxruntime_providers_tensorrt.so)
tar -C "$tmp/pkg" -cf - . | zstd -q -T0 -19 --long=30 -o "$tmp/ort.tar.zst"
split -n 4 -d "$tmp/ort.tar.zst" "$tmp/ort.part."
for i in 1 2 3 4; do
  mkdir -p "$DIR/part$i" && mv "$tmp/ort.part.0$((i - 1))" "$DIR/part$i/"
done
du -sh "$DIR"/*
