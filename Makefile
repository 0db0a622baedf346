# One-command set-up: every target creates the virtual environment it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install test lint format bench clean

# The full development environment (training, export, serving and test tools).
$(VENV)/.installed-dev: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed-dev

test: $(VENV)/.installed-dev
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

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
