#!/usr/bin/env bash
# Check, at image build time, that onnxruntime-gpu's CUDA and TensorRT providers find every
# shared library they link against (CUDA, cuDNN, cuBLAS from the base image; TensorRT from
# VENV/tensorrt_libs on LD_LIBRARY_PATH). Only libcuda.so.1 may be missing: the NVIDIA container
# toolkit mounts the host driver's copy when the container starts on a GPU.
#
#   docker/check-gpu-libs.sh VENV
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 VENV" >&2; exit 2; }
venv=$1
capi=$("$venv/bin/python" -c 'import importlib.util, pathlib
spec = importlib.util.find_spec("onnxruntime")
print(pathlib.Path(next(iter(spec.submodule_search_locations))) / "capi")')

status=0
for provider in cuda tensorrt; do
  lib=$capi/libonnxruntime_providers_$provider.so
  if [ ! -f "$lib" ]; then
    echo "check-gpu-libs.sh: $lib is missing: is onnxruntime-gpu installed in $venv?" >&2
    status=1
    continue
  fi
  missing=$(ldd "$lib" | awk '/not found/ {print $1}' | grep -vx 'libcuda.so.1' || true)
  if [ -n "$missing" ]; then
    echo "check-gpu-libs.sh: the $provider provider cannot load; missing:" $missing >&2
    echo "  (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})" >&2
    status=1
  else
    echo "check-gpu-libs.sh: the $provider provider finds all its libraries (libcuda.so.1: the driver's, at run time)"
  fi
done
exit $status
