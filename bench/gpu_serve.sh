#!/usr/bin/env bash
# The service on a GPU, measured in one call of a lent CUDA machine (about 6 minutes):
#   1. onnxruntime-gpu unpacked from the parts ../shared/gpu/stage-onnxruntime-gpu.sh wrote
#      (with the serving wheels, and py-spy's and httptools' wheels if you added them);
#   2. the CUDA tests of the service's runners (`pytest -m cuda tests/service`);
#   3. bench/serve_gpu.py: exports, raw session, onnxruntime profile, the real server under load
#      (1, 16, 64 clients; CUDA graphs; 4 workers), py-spy, decoding on every core.
# Usage (repository root, the machine's Python 3.12 with torch):
#   bash bench/gpu_serve.sh PARTS_DIR WHEELS_DIR [OUT]
# Results: OUT/serve_gpu.{json,md}, OUT/pytest.log, profiles and server logs.
set -u
parts=${1:?usage: $0 PARTS_DIR WHEELS_DIR [OUT]} wheels=${2:?usage: $0 PARTS_DIR WHEELS_DIR [OUT]}
OUT=${3:-${OUT:-/tmp/gpu-serve}}
site=/tmp/site
mkdir -p "$OUT"
if ! python3 -c "import onnxruntime as o; assert 'CUDAExecutionProvider' in o.get_available_providers()" 2>/dev/null; then
  bash "$wheels/unpack-onnxruntime-gpu.sh" "$parts" "$wheels" "$site" || exit 1
fi
export PYTHONPATH=$site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PATH=$site/bin:$PATH
nvidia-smi -L  # once, before any load
python3 -m pytest -m cuda tests/service/test_runner.py -q -p no:cacheprovider >"$OUT/pytest.log" 2>&1
echo "pytest -m cuda tests/service: $(tail -1 "$OUT/pytest.log")"
# shellcheck disable=SC2086  # SERVE_GPU_ARGS: extra flags, e.g. --smoke to try this on a CPU
python3 bench/serve_gpu.py --out "$OUT" ${SERVE_GPU_ARGS:-}
