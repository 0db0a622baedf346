"""Fixtures for export tests: checkpoints of tiny models, one trained on a tiny Fashion-MNIST."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training.conftest import read_only, write_fashion_mnist
from tests.training.test_train import tiny_config
from training.train import fit

__all__ = ["read_only", "trained_run"]  # read_only: a fixture of the training tests, shared


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished smso-train run (SMSO p = 4, c = 8) on 200 synthetic Fashion-MNIST images, 50
    held out for validation (seed 0 draws 2 to 7 of each class; typicality's reference needs
    2): ``best.pt``, ``test.json`` and the dataset it was trained on."""
    root = tmp_path_factory.mktemp("export-run")
    data = write_fashion_mnist(root / "fmnist", 200, 60)
    fit(tiny_config(data, root / "run", epochs=1, val_size=50))
    return root / "run"
