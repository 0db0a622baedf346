"""Shared test settings: deterministic seeds, few threads (CI runs on 2 cores).

torch is seeded and held to 2 threads where it is installed; the serving environment has none
(``pip install -e '.[serving-cpu,serving-test]'`` runs tests/service without it).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(autouse=True)
def _seed() -> None:
    if HAS_TORCH:
        import torch

        torch.manual_seed(0)


def pytest_configure(config: pytest.Config) -> None:
    if HAS_TORCH:
        import torch

        torch.set_num_threads(2)
    # the servers tests start (apps in process, smso-serve) speak no gRPC unless a test gives
    # them a port (--grpc-port): the default 8001 would collide between servers running at once
    os.environ["SMSO_GRPC_PORT"] = "0"
