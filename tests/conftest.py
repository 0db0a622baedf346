"""Shared test settings: deterministic seeds, few threads (CI runs on 2 cores)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def pytest_configure(config: pytest.Config) -> None:
    torch.set_num_threads(2)
