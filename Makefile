# One-command set-up: every target creates the virtual environment it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: serve install data test lint format bench bench-export bench-peers bench-gpu soak model \
  wrk onnx fmnist-table fmnist-table-records fmnist-fair fmnist-fair-records typicality-confirm clean

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
FMNIST := /usr/share/datasets/fashion-mnist
MODEL_RUN := runs/fashion-mnist-smso
MODEL_DIR := models/fashion-mnist-smso

SERVE_VENV ?= .venv-serve
# The serving extra: `serving` (onnxruntime-gpu: CUDA, TensorRT and CPU) where the machine has an
# NVIDIA driver, else `serving-cpu` (onnxruntime: the CPU only, a tenth of the download).
SERVE_EXTRA ?= $(shell if command -v nvidia-smi >/dev/null 2>&1 || [ -e /proc/driver/nvidia ]; \
  then echo serving; else echo serving-cpu; fi)

# The main job: the inference service on the model this repository ships, at
# http://127.0.0.1:8000 (settings: SMSO_* environment variables or `smso-serve --help`).
# Its environment holds the serving dependencies only: no torch. Ctrl-C or SIGTERM: smso-serve
# answers the requests in flight and exits with status 0, so make says nothing.
serve: $(SERVE_VENV)/.installed-$(SERVE_EXTRA)
	$(SERVE_VENV)/bin/smso-serve

# The marker names the extra installed: switching (a driver installed, SERVE_EXTRA=...) reinstalls,
# removing both onnxruntime builds first (they provide the same module; one would hide the other).
$(SERVE_VENV)/.installed-$(SERVE_EXTRA): pyproject.toml
	$(PYTHON) -m venv $(SERVE_VENV)
	rm -f $(SERVE_VENV)/.installed $(SERVE_VENV)/.installed-*
	$(SERVE_VENV)/bin/python -m pip install --upgrade --quiet pip
	$(SERVE_VENV)/bin/python -m pip uninstall --quiet --yes onnxruntime onnxruntime-gpu 2>/dev/null
	$(SERVE_VENV)/bin/python -m pip install --quiet -e '.[$(SERVE_EXTRA)]'
	touch $@

# The full development environment (training, export, serving and test tools).
$(VENV)/.installed-dev: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed-dev

# Fashion-MNIST's idx files from Debian's package (the only real dataset reachable offline).
$(FMNIST)/t10k-labels-idx1-ubyte.gz:
	$(SUDO) apt-get install -y -q dataset-fashion-mnist || \
	  { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q dataset-fashion-mnist; }

data: $(FMNIST)/t10k-labels-idx1-ubyte.gz

# wrk, the C load generator the serving benchmarks drive servers with (Debian's package).
/usr/bin/wrk:
	$(SUDO) apt-get install -y -q wrk || \
	  { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q wrk; }

wrk: /usr/bin/wrk

test: $(VENV)/.installed-dev data wrk
	$(BIN)/python -m pytest

# tests/service in the serving environment alone, its own venv: the serving-cpu extra, pytest and
# httpx (pyproject.toml's serving-test), no torch, onnx or other development tool. The tests
# that need one skip and say which; every other service test passes without them. The venv
# holds a .gitignore of `*` (as Python 3.13's venv writes one): git and ruff pass over it.
SERVE_TEST_VENV ?= .venv-serve-test
.PHONY: test-serving
test-serving: $(SERVE_TEST_VENV)/.installed data
	$(SERVE_TEST_VENV)/bin/python -m pytest tests/service

$(SERVE_TEST_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(SERVE_TEST_VENV)
	echo '*' > $(SERVE_TEST_VENV)/.gitignore
	$(SERVE_TEST_VENV)/bin/python -m pip install --upgrade --quiet pip
	$(SERVE_TEST_VENV)/bin/python -m pip install --quiet -e '.[serving-cpu,serving-test]'
	touch $@

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

format: $(VENV)/.installed-dev
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The head benchmark: prints a markdown table, writes bench/results/heads.json.
bench: $(VENV)/.installed-dev
	$(BIN)/python -m bench.heads

# smso-serve side by side with LitServe, BentoML, PyTriton and Ray Serve (docs/results/peers.md):
# the peers in an environment of their own, .venv-peers, from bench/peers/requirements.txt
# (onnxruntime-gpu in place of onnxruntime where the machine has an NVIDIA driver); then
# python -m bench.peers, bench/results/peers.json. PEERS_FLAGS adds flags (--quick: a smoke test).
PEERS_VENV ?= .venv-peers
PEERS_FLAGS ?=
PEERS_ORT := $(shell if command -v nvidia-smi >/dev/null 2>&1 || [ -e /proc/driver/nvidia ]; \
  then echo onnxruntime-gpu; else echo onnxruntime; fi)
$(PEERS_VENV)/.installed-$(PEERS_ORT): bench/peers/requirements.txt
	$(PYTHON) -m venv $(PEERS_VENV)
	rm -f $(PEERS_VENV)/.installed-*
	$(PEERS_VENV)/bin/python -m pip install --upgrade --quiet pip
	$(PEERS_VENV)/bin/python -m pip install --quiet -r bench/peers/requirements.txt
	if [ $(PEERS_ORT) = onnxruntime-gpu ]; then \
	  $(PEERS_VENV)/bin/python -m pip uninstall --quiet --yes onnxruntime && \
	  $(PEERS_VENV)/bin/python -m pip install --quiet \
	    "onnxruntime-gpu==$$(sed -n 's/^onnxruntime==//p' bench/peers/requirements.txt)"; fi
	touch $@

bench-peers: $(VENV)/.installed-dev $(PEERS_VENV)/.installed-$(PEERS_ORT) wrk
	$(BIN)/python -m bench.peers $(PEERS_FLAGS)

# The export benchmark: onnxruntime against PyTorch eager, bench/results/export.json.
bench-export: $(VENV)/.installed-dev
	$(BIN)/python -m bench.export

# Every GPU measurement on a CUDA machine (docs/results/gpu.md): the training step's cost, the
# CUDA tests, JPEG decoding on the GPU and the service under load (python -m bench.gpu; results
# in $(GPU_OUT)). GPU_STEPS picks steps: GPU_STEPS=fmnist-table is the head table on the GPU.
GPU_OUT ?= bench/results/gpu
GPU_STEPS ?=
bench-gpu: $(VENV)/.installed-dev
	$(BIN)/python -m bench.gpu --out $(GPU_OUT) $(GPU_STEPS)

# The soak and hostile-client runs at full size (tests/soak, marked `soak`; their quick versions
# run in `make test`): 10,000 mixed requests with SIGTERM midway, SOAK_MINUTES of every attack at
# once (nothing lost, /healthz p99 <= 100 ms, peak RSS <= 512 MiB, no growth), and the gRPC
# floods. Each prints its tables and writes its JSON in $(SOAK_OUT). The growth check compares
# thirds of the run after its first minute: SOAK_MINUTES of 3 or more.
SOAK_MINUTES ?= 10
SOAK_OUT ?= bench/results
soak: $(VENV)/.installed-dev
	SOAK_MINUTES=$(SOAK_MINUTES) SOAK_OUT=$(SOAK_OUT) $(BIN)/python -m pytest tests/soak -m soak

# The shipped model: train from scratch on the CPU, then keep the checkpoint, curves and Fig. 2.
model: $(VENV)/.installed-dev data
	rm -rf $(MODEL_RUN)
	$(BIN)/smso-train --config configs/fashion-mnist-smso.toml --out $(MODEL_RUN)
	$(BIN)/smso-figure fig3 $(MODEL_RUN) --labels "SMSO p=64" --out $(MODEL_RUN)/fig3-loss.png
	$(BIN)/smso-figure fig2 $(MODEL_RUN)/best.pt --out $(MODEL_RUN)/fig2-histograms.png
	$(BIN)/python -m training.ship $(MODEL_RUN) $(MODEL_DIR)
	$(MAKE) onnx

# The shipped ONNX file (what `make serve` serves), exported from the shipped checkpoint.
# The card's exported_at is the checkpoint's commit time (SOURCE_DATE_EPOCH): exporting the
# same checkpoint again writes the same bytes, so the tracked file changes only with the model.
# A checkpoint not yet committed as it is (`make model` just wrote it) is dated by its mtime.
onnx: $(VENV)/.installed-dev data
	SOURCE_DATE_EPOCH=$$(if [ -z "$$(git status --porcelain -- $(MODEL_DIR)/model.pt 2>/dev/null)" ]; \
	  then git log -1 --format=%ct -- $(MODEL_DIR)/model.pt 2>/dev/null; \
	  else stat -c %Y $(MODEL_DIR)/model.pt; fi) \
	  $(BIN)/smso-export $(MODEL_DIR)/model.pt -o $(MODEL_DIR)/model.onnx

# The Fashion-MNIST head comparison (docs/results/fashion-mnist.md): every head (GAP, BP, MPN,
# CBP-TS, CBP-RM, LRBP, DeepO2P, SMSO p = 16 to 1,024) with the shipped model's recipe, seeds 0,
# 1 and 2, two runs at a time on the CPU (FMNIST_JOBS); the table goes to
# runs/fmnist-table/table.md.
# About 18 hours on 2 cores, two runs at a time: the 33 runs' training summed to 32.1 hours,
# 34 to 58 minutes a run for most rows, 77 for CBP-RM (medians over the seeds, measured two at
# a time; validation and test passes not included).
# Interrupted? Run it again: finished runs are kept and an unfinished one resumes from its last
# epoch (a folder started with another recipe is refused; remove runs/fmnist-table to start
# over). On a GPU, rows x seeds in parallel (40 to 60 minutes, estimated):
# `make bench-gpu GPU_STEPS=fmnist-table`.
# The records of the finished runs (config, metrics per epoch, result; no checkpoints) are kept
# in docs/results/records/fmnist-table, so that a fresh checkout skips them:
# `make fmnist-table-records` copies them there (this target does too, at its end).
FMNIST_TABLE := runs/fmnist-table
# runs at a time, the cores shared among them: two one-thread runs train 1.07-1.13x the steps
# per second of one two-thread run on 2 cores (`python -m bench.train_jobs`: the small CNN's
# steps split poorly over threads)
FMNIST_JOBS ?= 2
FMNIST_RECORDS := docs/results/records/fmnist-table
fmnist-table: $(VENV)/.installed-dev data
	mkdir -p $(FMNIST_TABLE) && cp -Rn $(FMNIST_RECORDS)/. $(FMNIST_TABLE)/
	$(BIN)/smso-experiment run fmnist --seeds 0 1 2 --resume --device cpu --jobs $(FMNIST_JOBS) \
	  --out $(FMNIST_TABLE)
	$(MAKE) --no-print-directory fmnist-table-records
	$(BIN)/smso-experiment report fmnist --out $(FMNIST_TABLE) | tee $(FMNIST_TABLE)/table.md

fmnist-table-records:
	$(call keep-records,$(FMNIST_TABLE),$(FMNIST_RECORDS))

# $(call keep-records,RUNS,RECORDS): each finished run under RUNS (a result.json) copied to the
# same folder under RECORDS, without its checkpoints
keep-records = for result in $(1)/*/seed*/result.json; do \
	  [ -f "$$result" ] || continue; run=$$(dirname "$$result"); \
	  keep=$(2)/$${run\#$(1)/}; mkdir -p "$$keep"; \
	  for name in config.json metrics.jsonl result.json splits.json test.json; do \
	    [ ! -f "$$run/$$name" ] || cp "$$run/$$name" "$$keep/"; done; \
	done

# A fair recipe for each head (training/recipe_sweep.py): the sweep (first-order, BP, MPN and SMSO
# p = 64, each lr {0.005, 0.01, 0.02} x weight decay {5e-4, 2e-3}, 18 epochs, seed 0; 24 runs of
# 32 to 41 minutes measured two at a time on 2 otherwise idle cores, about 7.5 hours), each
# head's recipe chosen on validation, the chosen recipes that are not the shipped one at 45
# epochs on seeds 0-2 (65 to 101 minutes a run, two at a time), then the grid and the fair table
# (paired verdicts) in $(FAIR)/report.md. Resumable: run it again after a stop. The
# finished runs' records are kept in docs/results/records/fmnist-sweep and
# docs/results/records/fmnist-fair, as the table's are, so that a fresh checkout skips them.
SWEEP := runs/fmnist-sweep
FAIR := runs/fmnist-fair
SWEEP_RECORDS := docs/results/records/fmnist-sweep
FAIR_RECORDS := docs/results/records/fmnist-fair
fmnist-fair: $(VENV)/.installed-dev data
	mkdir -p $(SWEEP) $(FAIR) $(SWEEP_RECORDS) $(FAIR_RECORDS)
	cp -Rn $(SWEEP_RECORDS)/. $(SWEEP)/ && cp -Rn $(FAIR_RECORDS)/. $(FAIR)/
	$(BIN)/smso-experiment run fmnist-sweep --seeds 0 --resume --device cpu --jobs $(FMNIST_JOBS) \
	  --out $(SWEEP); status=$$?; $(call keep-records,$(SWEEP),$(SWEEP_RECORDS)); exit $$status
	rows="$$($(BIN)/smso-experiment choose --sweep $(SWEEP) --to-run)"; [ -z "$$rows" ] || \
	  $(BIN)/smso-experiment run fmnist-fair $$rows --seeds 0 1 2 --resume --device cpu \
	  --jobs $(FMNIST_JOBS) --out $(FAIR); status=$$?; \
	  $(call keep-records,$(FAIR),$(FAIR_RECORDS)); exit $$status
	{ $(BIN)/smso-experiment choose --sweep $(SWEEP); echo; \
	  $(BIN)/smso-experiment choose --sweep $(SWEEP) --fair $(FAIR) --records $(FMNIST_RECORDS); \
	} | tee $(FAIR)/report.md

# the records of the sweep's and the fair runs' finished runs, copied now (fmnist-fair copies
# them as each of its two steps ends): to keep what a long run has done so far
fmnist-fair-records:
	$(call keep-records,$(SWEEP),$(SWEEP_RECORDS))
	$(call keep-records,$(FAIR),$(FAIR_RECORDS))

# The confirmatory typicality evaluation (docs/results/typicality-confirmation.md): the shipped
# recipe trained on 8 classes, Shirt and Sneaker held out (about 20 minutes on 2 free cores, from
# the shipped model's time; 7.6 hours sharing them with the recipe sweep), its export, then
# python -m experiments.typicality_confirm on it and on the shipped model (6 minutes on 2 cores):
# a markdown table on the terminal and in $(TYPICALITY_RUN)/confirmation.md, the JSON in
# bench/results/typicality-confirm.json. Interrupted? Run it again: the training resumes from its
# last epoch, and a finished run (test.json) is neither trained nor tested again.
# TYPICALITY_TRAIN_FLAGS and TYPICALITY_FLAGS add smso-train and evaluation flags (the tests:
# tiny data).
TYPICALITY_RUN := runs/typicality-heldout
TYPICALITY_CONFIG := configs/fashion-mnist-smso-heldout.toml
TYPICALITY_TRAIN_FLAGS ?=
TYPICALITY_FLAGS ?=
typicality-confirm: $(TYPICALITY_RUN)/model.onnx
	$(BIN)/python -m experiments.typicality_confirm --held-out $(TYPICALITY_RUN) \
	  --markdown $(TYPICALITY_RUN)/confirmation.md $(TYPICALITY_FLAGS)

$(TYPICALITY_RUN)/model.onnx: $(TYPICALITY_RUN)/test.json
	$(BIN)/smso-export $(TYPICALITY_RUN)/best.pt -o $@

$(TYPICALITY_RUN)/test.json: | $(VENV)/.installed-dev data
	$(BIN)/smso-train --config $(TYPICALITY_CONFIG) --out $(TYPICALITY_RUN) \
	  $$([ -f $(TYPICALITY_RUN)/last.pt ] && echo --resume) $(TYPICALITY_TRAIN_FLAGS)

clean:
	rm -rf $(VENV) $(SERVE_VENV) $(SERVE_TEST_VENV) $(PEERS_VENV) .pytest_cache .ruff_cache *.egg-info

# CI's check of docker/ without a Docker engine: each image's install script into a fresh venv,
# smoke-tested (the CPU flavour serves the shipped model), and docker-compose.yml validated by
# Debian's docker-compose with every profile (installed if missing). See docker/check.sh.
.PHONY: docker-check
docker-check:
	bash docker/check.sh
