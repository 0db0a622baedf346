"""Shared test settings: deterministic seeds, few threads (CI runs on 2 cores)."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def pytest_configure(config: pytest.Config) -> None:
    torch.set_num_threads(2)
    # the servers tests start (apps in process, smso-serve) speak no gRPC unless a test gives
    # them a port (--grpc-port): the default 8001 would collide between servers running at once
    os.environ["SMSO_GRPC_PORT"] = "0"
