#!/usr/bin/env bash
# Install the serving dependencies (pyproject.toml's `serving` or `serving-cpu` extra: no torch)
# into a virtual environment. The serving Dockerfiles run it, and so does CI (`make docker-check`),
# in a fresh venv, so a broken install step fails CI without a Docker engine.
#
#   docker/install-serving.sh VENV              the extra as pyproject.toml says (onnxruntime-gpu),
#                                               and `gpu-decode` (nvImageCodec, nvJPEG)
#   docker/install-serving.sh VENV --cpu        the `serving-cpu` extra: the same, with onnxruntime
#                                               for onnxruntime-gpu (same version range, a tenth
#                                               of the download: slim CPU image)
#   docker/install-serving.sh VENV --tensorrt   also the TensorRT libraries that onnxruntime-gpu's
#                                               TensorRT provider links against (GPU image), and
#                                               VENV/tensorrt_libs -> them (for LD_LIBRARY_PATH)
#
# The project itself is not installed: copy the source afterwards and `pip install --no-deps .`.
# PYTHON picks the interpreter that creates VENV (default python3).
set -euo pipefail

usage() { echo "usage: $0 VENV [--cpu] [--tensorrt]" >&2; exit 2; }
[ $# -ge 1 ] || usage
venv=$1
shift
cpu=0
tensorrt=0
for arg in "$@"; do
  case $arg in
    --cpu) cpu=1 ;;
    --tensorrt) tensorrt=1 ;;
    *) echo "install-serving.sh: unknown option $arg" >&2; usage ;;
  esac
done
if [ "$cpu" = 1 ] && [ "$tensorrt" = 1 ]; then
  echo "install-serving.sh: --cpu and --tensorrt exclude each other" >&2
  exit 2
fi

here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"

extras="serving gpu-decode"  # gpu-decode: JPEGs decoded on the GPU (SMSO_DECODE_DEVICE=cuda)
[ "$cpu" = 0 ] || extras=serving-cpu
# shellcheck disable=SC2086  # two extras, one word each
requirements=$("$venv/bin/python" "$here/requirements.py" $extras)
echo "install-serving.sh: installing into $venv:" $requirements
mapfile -t reqs <<<"$requirements"
"$venv/bin/python" -m pip install --quiet "${reqs[@]}"

if [ "$tensorrt" = 1 ]; then
  spec=$("$venv/bin/python" "$here/tensorrt_spec.py")
  echo "install-serving.sh: installing $spec (NVIDIA's index holds the wheels; PyPI a stub)"
  "$venv/bin/python" -m pip install --quiet --extra-index-url https://pypi.nvidia.com "$spec"
  libs=$("$venv/bin/python" "$here/tensorrt_spec.py" --libs-dir)
  ln -sfn "$libs" "$venv/tensorrt_libs"
  echo "install-serving.sh: TensorRT libraries in $venv/tensorrt_libs (put it on LD_LIBRARY_PATH)"
fi
