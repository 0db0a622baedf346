"""The ``soak`` tests run only when asked for: ``make soak``, or ``pytest -m soak``.

Each prints its tables (whatever pytest captures) and writes its JSON record under
``SOAK_OUT`` (default ``bench/results/``, not in git); the long soak lasts ``SOAK_MINUTES``
(default 10).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.lib import RESULTS
from bench.lib.report import save

SOAK = "soak"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the ``soak`` tests unless the ``-m`` expression names the marker."""
    if SOAK in (config.getoption("markexpr") or ""):
        return
    soaks = [item for item in items if item.get_closest_marker(SOAK)]
    if soaks:
        config.hook.pytest_deselected(items=soaks)
        items[:] = [item for item in items if not item.get_closest_marker(SOAK)]


@pytest.fixture
def soak_minutes() -> float:
    """How long the long soak lasts: ``SOAK_MINUTES``, 10 unless set."""
    return float(os.environ.get("SOAK_MINUTES", "10"))


class Publish:
    """A soak's tables on the terminal (past pytest's capture) and its record as JSON."""

    def __init__(self, capsys: pytest.CaptureFixture[str], folder: Path) -> None:
        self.capsys, self.folder = capsys, folder

    def __call__(self, name: str, tables: str, record: object) -> None:
        with self.capsys.disabled():
            print(f"\n{tables}\n")
            save(self.folder / f"{name}.json", record)


@pytest.fixture
def publish(capsys: pytest.CaptureFixture[str]) -> Publish:
    """:class:`Publish` into ``SOAK_OUT`` (default ``bench/results/``)."""
    return Publish(capsys, Path(os.environ.get("SOAK_OUT", RESULTS)))
