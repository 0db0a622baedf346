#!/usr/bin/env bash
# The GPU measurement of issue 11 spread over the four back-to-back calls a lent machine allows
# (each call carries at most 64 MiB: one part of onnxruntime-gpu staged by
# ../shared/gpu/stage-onnxruntime-gpu.sh .gpu-stage, with the serving wheels split in two).
#   step 1 (carry .gpu-stage/part1 .gpu-stage/wheels): install the wheels, export the five
#          ResNet-50 models in the background (bench/serve_gpu.py --export-only);
#   step 2 (carry .gpu-stage/part2 .gpu-stage/wheels-late), step 3 (carry .gpu-stage/part3):
#          collect the parts;
#   step 4 (carry .gpu-stage/part4): unpack onnxruntime-gpu, the CUDA tests, then
#          bench/serve_gpu.py on the exports (BUDGET_S seconds), results in $OUT.
# Usage, on the lent machine in the repository root: bash bench/gpu_lease.sh STEP
set -u
step=${1:?usage: $0 STEP (1-4)}
parts=/tmp/ort-parts site=/tmp/site models=/tmp/serve-gpu-models
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$parts" "$site" "$models" "$OUT"
cp .gpu-stage/part"$step"/* "$parts"/
[ -d .gpu-stage/wheels-late ] && cp .gpu-stage/wheels-late/* "$parts"/
export PYTHONUNBUFFERED=1
case $step in
1)
  nvidia-smi -L
  python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .gpu-stage/wheels/*.whl
  # the exports run on while the other parts arrive (a new session outlives this call)
  # shellcheck disable=SC2086  # EXPORTS: e.g. "--exports fp32-conv"
  PYTHONPATH=$site:$PWD setsid bash -c "python3 bench/serve_gpu.py --export-only ${EXPORTS:-} \
    --models-dir $models --out /tmp/export-out >/tmp/export.log 2>&1; touch $models/done" \
    </dev/null >/dev/null 2>&1 &
  sleep 5; cat /tmp/export.log
  ;;
2 | 3) ls -la "$parts" "$models"; tail -3 /tmp/export.log ;;
4)
  for _ in $(seq 150); do [ -e "$models/done" ] && break; sleep 1; done
  cp /tmp/export.log "$OUT"/export.log; tail -3 /tmp/export.log; ls -la "$models"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/pyspy "$parts"/py_spy-*.whl
  python3 -m pip install -q --no-index --no-deps --target /tmp/zstd-py "$parts"/zstandard-*.whl
  cat "$parts"/ort.part.0* | PYTHONPATH=/tmp/zstd-py python3 -c "import sys, zstandard
zstandard.ZstdDecompressor(max_window_size=2**31).copy_stream(sys.stdin.buffer, sys.stdout.buffer)" \
    | tar -x -C "$site"
  export PYTHONPATH=$site:$PWD PATH=/tmp/pyspy/bin:$site/bin:$PATH
  python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
  timeout 120 python3 -m pytest -m cuda tests/service/test_runner.py -q -p no:cacheprovider \
    >"$OUT/pytest.log" 2>&1
  echo "pytest -m cuda tests/service/test_runner.py: $(tail -1 "$OUT/pytest.log")"
  # shellcheck disable=SC2086  # SERVE_GPU_ARGS: e.g. --raw ... --stages --servers ...
  python3 bench/serve_gpu.py --models-dir "$models" --out "$OUT" --budget-s "${BUDGET_S:-400}" \
    ${SERVE_GPU_ARGS:-}
  ;;
esac
