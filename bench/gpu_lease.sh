#!/usr/bin/env bash
# bench/serve_gpu.py on a CUDA machine that is lent a few minutes at a time and reached by calls
# that each carry at most 64 MiB: four calls back to back, each carrying one part staged by
# `bash bench/gpu_stage.sh .gpu-stage` (the machine is given back when idle, and /tmp with it).
#   step 1 (carry .gpu-stage/part1 .gpu-stage/wheels): install the wheels, export the five
#          ResNet-50 models in the background (python3 -m bench.serve_gpu --export-only);
#   step 2 (carry .gpu-stage/part2 .gpu-stage/nvimg), step 3 (carry .gpu-stage/part3): collect
#          the parts; step 3 also unpacks nvImageCodec and measures JPEG decoding on the GPU
#          (bench/decode_gpu.py: nvJPEG through torchvision and through nvImageCodec);
#   step 4 (carry .gpu-stage/part4 .gpu-stage/wheels-late): check that everything arrived,
#          unpack onnxruntime-gpu, the CUDA tests, the service's GPU JPEG decoding
#          (python3 -m bench.decode_gpu --paths service), then bench/serve_gpu.py on the exports;
#          the whole step keeps within STEP4_S seconds (default 540), results in $OUT.
# Usage, on the lent machine in the repository root: bash bench/gpu_lease.sh STEP
# EXPORTS (step 1) and SERVE_GPU_ARGS (step 4) pass flags on, e.g. EXPORTS="--exports fp32-conv
# fp16-conv" and SERVE_GPU_ARGS="--exports fp32-conv fp16-conv --servers cuda workers-graphs".
set -u
step=${1:?usage: $0 STEP (1-4)}
start=$SECONDS
tmp=${LEASE_TMP:-/tmp}  # what the calls leave for each other (a test points it elsewhere)
parts=$tmp/ort-parts site=$tmp/site models=$tmp/serve-gpu-models
OUT=${OUT:-$tmp/gpu-out}
mkdir -p "$parts" "$site" "$models" "$OUT"
[ -d .gpu-stage/part"$step" ] && cp .gpu-stage/part"$step"/* "$parts"/
[ -d .gpu-stage/wheels-late ] && cp .gpu-stage/wheels-late/* "$parts"/
[ -d .gpu-stage/nvimg ] && cp .gpu-stage/nvimg/* "$parts"/
export PYTHONUNBUFFERED=1
fail() { echo "gpu_lease step $step: $*" >&2; exit 1; }
# the background exports of step 1: their pid, flags and, once finished, exit status
exporting() { [ -s "$models/pid" ] && kill -0 "$(cat "$models/pid")" 2>/dev/null; }
case $step in
1)
  nvidia-smi -L
  python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .gpu-stage/wheels/*.whl \
    || fail "installing the wheels failed"
  # the exports run on while the other parts arrive; their exit status goes to $models/status
  if exporting; then
    echo "exports already running (pid $(cat "$models/pid")): not started again"
  else
    rm -f "$models/status"
    echo "${EXPORTS:-}" >"$models/exports"
    # shellcheck disable=SC2086  # EXPORTS: e.g. "--exports fp32-conv"
    PYTHONPATH=$site:$PWD setsid bash -c "python3 -m bench.serve_gpu --export-only ${EXPORTS:-} \
      --models-dir $models --out $tmp/export-out >$tmp/export.log 2>&1; echo \$? >$models/status" \
      </dev/null >/dev/null 2>&1 &
    echo $! >"$models/pid"
  fi
  sleep 5; cat $tmp/export.log
  ;;
2) ls -la "$parts" "$models"; tail -3 $tmp/export.log ;;
3)
  ls -la "$parts" "$models"; tail -3 $tmp/export.log
  # nvImageCodec for the service's GPU decoding (SMSO_DECODE_DEVICE=cuda), from step 2
  if [ -s "$parts/nvimg.tar.gz" ]; then
    tar -xzf "$parts/nvimg.tar.gz" -C "$site" || echo "unpacking nvImageCodec failed"
  else
    echo "no nvimg.tar.gz from step 2 (carry .gpu-stage/nvimg with part2)"
  fi
  # JPEG decoding on the GPU (nvJPEG through the machine's torchvision, and nvImageCodec's
  # decoder) against Pillow; the service's whole path needs onnxruntime-gpu: step 4
  PYTHONPATH=$site:$PWD timeout 150 python3 -m bench.decode_gpu --device cuda \
    --paths pillow torchvision nvimgcodec --json "$OUT"/decode_gpu.json \
    || echo "bench/decode_gpu.py failed (status $?)"
  ;;
4)
  budget=${STEP4_S:-540}
  # what earlier calls left: gone if the machine was given back in between
  missing=""
  for i in 0 1 2 3; do [ -s "$parts/ort.part.0$i" ] || missing="$missing ort.part.0$i"; done
  [ -z "$missing" ] || fail "missing$missing in $parts (the machine was given back between calls?): run steps 1-4 again, back to back"
  PYTHONPATH=$site python3 -c "import fastapi, fastapi_offline, httptools, uvicorn" 2>/dev/null \
    || fail "the wheels of step 1 are not in $site: run steps 1-4 again, back to back"
  # the exports: wait while they run (at most 150 s), never start a second copy beside them
  for _ in $(seq 150); do
    [ -e "$models/status" ] && break
    exporting || break
    sleep 1
  done
  [ -e "$tmp/export.log" ] && cp "$tmp/export.log" "$OUT"/export.log && tail -3 "$tmp/export.log"
  if [ -e "$models/status" ]; then
    [ "$(cat "$models/status")" = 0 ] \
      || fail "the exports failed (status $(cat "$models/status")): see $OUT/export.log"
  elif exporting; then
    fail "the exports are still running after 150 s: see $tmp/export.log"
  else
    echo "no exports from step 1: serve_gpu.py makes them (about 2 minutes of the budget)"
  fi
  # the exports step 1 made, unless SERVE_GPU_ARGS names its own
  case " ${SERVE_GPU_ARGS:-} " in
    *" --exports "*) exports="" ;;
    *) exports=$(cat "$models/exports" 2>/dev/null) ;;
  esac
  ls -la "$models"
  python3 -m pip install -q --no-index --no-deps --no-compile --target $tmp/pyspy "$parts"/py_spy-*.whl
  python3 -m pip install -q --no-index --no-deps --target $tmp/zstd-py "$parts"/zstandard-*.whl \
    || fail "zstandard's wheel is missing: carry .gpu-stage/wheels-late with part4"
  set -o pipefail
  cat "$parts"/ort.part.0* | PYTHONPATH=$tmp/zstd-py python3 -c "import sys, zstandard
zstandard.ZstdDecompressor(max_window_size=2**31).copy_stream(sys.stdin.buffer, sys.stdout.buffer)" \
    | tar -x -C "$site" || fail "unpacking onnxruntime-gpu failed (a part damaged in transfer?)"
  set +o pipefail
  # nvImageCodec, if step 3 did not unpack it (carried late)
  if [ ! -d "$site/nvidia/nvimgcodec" ] && [ -s "$parts/nvimg.tar.gz" ]; then
    tar -xzf "$parts/nvimg.tar.gz" -C "$site" || echo "unpacking nvImageCodec failed"
  fi
  export PYTHONPATH=$site:$PWD PATH=$tmp/pyspy/bin:$site/bin:$PATH
  python3 -c "import onnxruntime as o; p = o.get_available_providers(); print('onnxruntime', o.__version__, p)
assert 'CUDAExecutionProvider' in p, 'no CUDA provider'" || fail "onnxruntime-gpu has no CUDA provider here"
  timeout 120 python3 -m pytest -m cuda tests/service/runtime/test_runner.py tests/service/imaging/test_gpu_jpeg.py \
    -q -s -p no:cacheprovider >"$OUT/pytest.log" 2>&1
  echo "pytest -m cuda (runner, gpu_jpeg): $(tail -1 "$OUT/pytest.log")"
  grep "nvJPEG + graph" "$OUT/pytest.log"
  # the service's GPU JPEG decoding (nvImageCodec, and the graph on the CUDA provider)
  timeout 75 python3 -m bench.decode_gpu --device cuda --paths pillow service service-device \
    --batches 1 64 --rounds 5 --json "$OUT"/decode_gpu_service.json \
    || echo "decode_gpu.py --paths service failed"
  left=$((budget - (SECONDS - start) - 20))
  [ "$left" -ge 60 ] || fail "only $left s of STEP4_S left for serve_gpu.py"
  echo "serve_gpu.py: --budget-s $left"
  # shellcheck disable=SC2086  # SERVE_GPU_ARGS: e.g. --raw ... --stages --servers ...
  python3 -m bench.serve_gpu --models-dir "$models" --out "$OUT" --budget-s "$left" \
    $exports ${SERVE_GPU_ARGS:-}
  ;;
*) fail "STEP must be 1, 2, 3 or 4" ;;
esac
