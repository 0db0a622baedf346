"""How the Ray engine reaches Ray: a Ray of its own unless told where one runs (Ray's ray.init()
would otherwise join one that `ray start` left running on the machine, and then refuse the
job's num_cpus)."""

from __future__ import annotations

from typing import Any

import pytest

from batch import ray_engine


@pytest.fixture
def init_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """ray.init's keyword arguments, with Ray itself left alone."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(ray_engine.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_engine.ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(ray_engine.ray, "shutdown", lambda: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls


def test_without_an_address_the_job_starts_a_ray_of_its_own(
    init_calls: list[dict[str, Any]],
) -> None:
    with ray_engine.connect(None, cpus=2):
        pass
    assert init_calls[0]["address"] == "local"
    assert init_calls[0]["num_cpus"] == 2


@pytest.mark.parametrize("where", ["flag", "environment"])
def test_an_address_joins_that_ray_without_asking_for_cpus(
    where: str, init_calls: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    if where == "environment":
        monkeypatch.setenv("RAY_ADDRESS", "auto")
    with ray_engine.connect("auto" if where == "flag" else None, cpus=2):
        pass
    assert init_calls[0]["address"] == "auto"
    assert "num_cpus" not in init_calls[0]
