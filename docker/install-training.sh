#!/usr/bin/env bash
# Install the training and export dependencies (pyproject.toml's `training` and `export` extras:
# torch, torchvision, onnx, onnxruntime-gpu, ...) into a virtual environment, for smso-train and
# smso-export. docker/train.Dockerfile runs it, and so does CI (`make docker-check`), in a fresh
# venv. PyPI's torch wheels for Linux carry their own CUDA libraries: the image needs the driver only.
#
#   docker/install-training.sh VENV
#
# The project itself is not installed: copy the source afterwards and `pip install --no-deps .`.
# PYTHON picks the interpreter that creates VENV (default python3).
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 VENV" >&2; exit 2; }
venv=$1
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"

requirements=$("$venv/bin/python" "$here/requirements.py" training export)
echo "install-training.sh: installing into $venv:" $requirements
mapfile -t reqs <<<"$requirements"
"$venv/bin/python" -m pip install --quiet "${reqs[@]}"
