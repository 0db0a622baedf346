#!/usr/bin/env bash
# The training image's command: train a recipe on the GPU, then export its best checkpoint to a
# verified ONNX file that smso-serve can serve.
#
#   docker/train.sh [CONFIG [OUT]]
#     CONFIG  a TOML recipe (default configs/fashion-mnist-smso.toml)
#     OUT     the run folder (default runs/docker-<config name>); OUT/model.onnx is the model
#   SMSO_TRAIN_ARGS  more smso-train flags, e.g. "--epochs 2" or "--resume"
set -euo pipefail

config=${1:-configs/fashion-mnist-smso.toml}
out=${2:-runs/docker-$(basename "$config" .toml)}
[ -f "$config" ] || { echo "train.sh: no recipe at $config (mount configs/ or give a path)" >&2; exit 2; }
read -ra extra <<<"${SMSO_TRAIN_ARGS:-}"

echo "train.sh: smso-train --config $config --out $out ${extra[*]}"
smso-train --config "$config" --out "$out" "${extra[@]}"
echo "train.sh: smso-export $out/best.pt -o $out/model.onnx"
smso-export "$out/best.pt" -o "$out/model.onnx"
echo "train.sh: to serve it, copy $out/model.onnx under ./models and set SMSO_MODEL_PATH (docs/deployment.md)"
