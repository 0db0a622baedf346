# One-command set-up: every target creates the virtual environment it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: serve install data test lint format bench bench-export model onnx fmnist-table clean

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
FMNIST := /usr/share/datasets/fashion-mnist
MODEL_RUN := runs/fashion-mnist-smso
MODEL_DIR := models/fashion-mnist-smso

SERVE_VENV ?= .venv-serve

# The main job: the inference service on the model this repository ships, at
# http://127.0.0.1:8000 (settings: SMSO_* environment variables or `smso-serve --help`).
# Its environment holds the serving dependencies only: no torch.
serve: $(SERVE_VENV)/.installed
	$(SERVE_VENV)/bin/smso-serve

$(SERVE_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_VENV)/bin/python -m pip install --upgrade --quiet pip
	$(SERVE_VENV)/bin/python -m pip install --quiet -e '.[serving]'
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

test: $(VENV)/.installed-dev data
	$(BIN)/python -m pytest

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.installed-dev
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The head benchmark of issue 2: prints a markdown table, writes bench/results/heads.json.
bench: $(VENV)/.installed-dev
	$(BIN)/python bench/heads.py

# The export benchmark of issue 4: onnxruntime against PyTorch eager, bench/results/export.json.
bench-export: $(VENV)/.installed-dev
	$(BIN)/python bench/export.py

# The shipped model: train from scratch on the CPU, then keep the checkpoint, curves and Fig. 2.
model: $(VENV)/.installed-dev data
	rm -rf $(MODEL_RUN)
	$(BIN)/smso-train --config configs/fashion-mnist-smso.toml --out $(MODEL_RUN)
	$(BIN)/smso-figure fig3 $(MODEL_RUN) --labels "SMSO p=64" --out $(MODEL_RUN)/fig3-loss.png
	$(BIN)/smso-figure fig2 $(MODEL_RUN)/best.pt --out $(MODEL_RUN)/fig2-histograms.png
	$(BIN)/python -m training.ship $(MODEL_RUN) $(MODEL_DIR)
	$(MAKE) onnx

# The shipped ONNX file (what `make serve` serves), exported from the shipped checkpoint.
onnx: $(VENV)/.installed-dev data
	$(BIN)/smso-export $(MODEL_DIR)/model.pt -o $(MODEL_DIR)/model.onnx

# docs/results/fashion-mnist.md: every head of the comparison with one fixed budget.
fmnist-table: $(VENV)/.installed-dev data
	rm -rf runs/fmnist-table
	$(BIN)/smso-experiment run fmnist --out runs/fmnist-table
	$(BIN)/smso-experiment report fmnist --out runs/fmnist-table

clean:
	rm -rf $(VENV) $(SERVE_VENV) .pytest_cache .ruff_cache *.egg-info

# CI's check of docker/ without a Docker engine: each image's install script into a fresh venv,
# smoke-tested (the CPU flavour serves the shipped model), and docker-compose.yml validated by
# Debian's docker-compose with every profile (installed if missing). See docker/check.sh.
.PHONY: docker-check
docker-check:
	bash docker/check.sh
