#!/usr/bin/env bash
# The Fashion-MNIST head comparison on one GPU: every row of `smso-experiment run fmnist` x every
# seed, each a whole run with the shipped model's recipe, in parallel; then the report. What
# `make fmnist-table` does on the CPU two runs at a time.
#
# A small_cnn step at 28 px is bound by its Python process, not by the GPU, so the runs are
# separate processes with one CPU thread each (OMP_NUM_THREADS=1), JOBS at a time, in float32
# (--amp off), the costliest rows first. images/s in the report is measured under this sharing.
#
# How long: not yet measured. Estimate for 16 cores and an H100 or H200: 12 to 15 minutes per
# run for most rows with 11 to 14 at once (docs/results/gpu.md's sweep ran 12 SMSO runs of the
# 18-epoch recipe at batch 128 in about 3 minutes; batch 64 has twice the steps, 45 epochs 2.5
# times as many), so about 15 to 20 minutes per seed (its 11 runs at once) and 40 to 60 minutes
# for 3 seeds, more if DeepO2P's float64 eigendecompositions are slow there. Each call prints its time and the total over the calls.
#
# Machines lent for short spells (10 minutes a command, 15 a lease): DEADLINE=540 stops every
# run 540 s after the start. The runs resume: the same command again, on the same machine, skips
# the runs that finished and continues the others from their last epoch. Over several leases, run
# one seed per lease (SEEDS=0, then 1, then 2), unpack each lease's runs.tgz into one folder and
# report there: `smso-experiment report fmnist --out FOLDER` reads every run's result.json.
#
# Usage (repository root, Python with torch on the path):
#   FMNIST=/path/to/fashion-mnist OUT=/tmp/fmnist-table bash bench/fmnist_table_gpu.sh
# Settings: SEEDS ("0 1 2"), ROWS (every row), JOBS (cores - 2), DEADLINE (seconds; none),
# RUNS (the run folders: runs/fmnist-table-gpu), PY (python3), DEVICE (cuda), EXTRA (more flags
# for every run, e.g. "--epochs 1" for a quick check: use another RUNS for it).
# Writes $OUT/table.md (the report) and $OUT/runs.tgz (every run's config, metrics, results and
# log, without checkpoints).
set -u
OUT=${OUT:-/tmp/fmnist-table}
FMNIST=${FMNIST:-/usr/share/datasets/fashion-mnist}
RUNS=${RUNS:-runs/fmnist-table-gpu}
SEEDS=${SEEDS:-"0 1 2"}
CORES=$(nproc)
JOBS=${JOBS:-$((CORES > 3 ? CORES - 2 : 1))}
DEADLINE=${DEADLINE:-}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
EXTRA=${EXTRA:-}
# TQDM_MININTERVAL: a progress line every 30 s, not ten a second, in the logs
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=30 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT" "$RUNS/logs"
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }

nvidia-smi -L
# Every row of the table, those whose step costs most first (single-thread CPU time of a batch-64
# step: CBP-RM 2.6x SMSO p = 64's, SMSO p = 1,024 2x, MPN and DeepO2P 1.7x; on a GPU DeepO2P's
# float64 eigendecompositions are the likely slowest), so that the last runs to start are short
# ones.
ALL=$($PY -c "from training.experiments import TABLES
first = ['deepo2p', 'cbp-rm', 'smso-1024', 'mpn']
rows = [r.name for r in TABLES['fmnist']]
print(' '.join(sorted(rows, key=lambda r: first.index(r) if r in first else len(first))))") ||
  exit 1
ROWS=${ROWS:-$ALL}
echo "rows: $ROWS; seeds: $SEEDS; $JOBS runs at a time on $CORES cores; runs in $RUNS"

run_one() {  # ROW SEED
  local limit=()
  [[ -n $DEADLINE ]] && limit=(timeout $((DEADLINE - $(elapsed))))
  # shellcheck disable=SC2086  # EXTRA: several flags
  OMP_NUM_THREADS=1 ${limit[@]+"${limit[@]}"} $PY -m training.experiments run fmnist "$1" \
    --seed "$2" --resume --out "$RUNS" --data-root "$FMNIST" --device "$DEVICE" --amp off \
    --no-channels-last --workers 0 $EXTRA >>"$RUNS/logs/$1-seed$2.log" 2>&1
  echo "$1 seed $2: exit status $? at $(elapsed) s"
}

for row in $ROWS; do
  for seed in $SEEDS; do
    if [[ -n $DEADLINE ]] && ((DEADLINE - $(elapsed) < 60)); then
      echo "$row seed $seed: not started, under 60 s left before DEADLINE"
      continue
    fi
    while (($(jobs -rp | wc -l) >= JOBS)); do wait -n; done
    run_one "$row" "$seed" &
  done
done
wait

total=0 finished=0
for row in $ROWS; do
  for seed in $SEEDS; do
    total=$((total + 1))
    run=$RUNS/fashion_mnist-$row/seed$seed
    if [[ -f $run/result.json ]]; then
      finished=$((finished + 1))
    else
      epochs=$(cat "$run/metrics.jsonl" 2>/dev/null | wc -l)
      echo "$row seed $seed: unfinished, $epochs epochs done (log: $RUNS/logs/$row-seed$seed.log)"
    fi
  done
done
if compgen -G "$RUNS/*/seed*/result.json" >/dev/null; then  # any finished run
  $PY -m training.experiments report fmnist --out "$RUNS" | tee "$OUT/table.md"
fi
tar -czf "$OUT/runs.tgz" --exclude='*.pt' -C "$RUNS" .
secs=$(elapsed)
echo "$secs" >>"$RUNS/calls.txt"
all=$(awk '{ s += $1 } END { print s }' "$RUNS/calls.txt")
echo "$finished of $total runs finished; this call took $((secs / 60)) min $((secs % 60)) s," \
  "the $(wc -l <"$RUNS/calls.txt") calls on $RUNS so far $((all / 60)) min $((all % 60)) s"
((finished == total)) || echo "run the same command again to continue the unfinished runs"
