"""smso-embed's tests: small folders of Fashion-MNIST test images as PNG files (seeded random
ones without the dataset), run on the embedded engine (the default: no Ray) unless a test is
about Ray; those share one local Ray for the whole session (starting one costs seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pyarrow.dataset as pads
import pytest

from batch.cli import main
from bench.lib.payloads import pngs
from service.core.settings import DEFAULT_MODEL

MODEL = str(DEFAULT_MODEL)
ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A local Ray of 2 CPUs (what CI has), started once; smso-embed uses it as it finds it."""
    from batch.ray_engine import connect  # Ray: only for the tests that run on it

    with connect(None, cpus=2):
        yield


def write_pngs(folder: Path, count: int, start: int = 0) -> list[Path]:
    """``count`` Fashion-MNIST test images from ``start`` as ``folder/NNNNN.png``."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i, data in enumerate(pngs(start + count)[start:], start):
        path = folder / f"{i:05d}.png"
        path.write_bytes(data)
        files.append(path)
    return files


@pytest.fixture(scope="session")
def png_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """50 PNGs, 40 at the top and 10 in a sub-folder."""
    root = tmp_path_factory.mktemp("images")
    write_pngs(root, 40)
    write_pngs(root / "more", 10, start=40)
    return root


def embed(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    """smso-embed in this process (on the session's Ray with ``--engine ray``): its status, its
    JSON summary (``{}`` where it printed none) and what it wrote to stderr."""
    capsys.readouterr()
    status = main([*args, "--json", "--no-progress"])
    out, err = capsys.readouterr()
    return status, (json.loads(out) if out.strip() else {}), err


def read(out: Path, table: str = "embeddings") -> list[dict[str, Any]]:
    """A table of OUT as rows, sorted by path (as pyarrow's datasets read it back)."""
    rows = pads.dataset(out / table, format="parquet").to_table().to_pylist()
    return sorted(rows, key=lambda row: row["path"])


def part_names(out: Path, table: str = "embeddings") -> list[str]:
    """The names of a table's parts, sorted (what a reader sees: no hidden file)."""
    return sorted(path.name for path in (out / table).iterdir() if not path.name.startswith("."))


def command(*args: str) -> list[str]:
    """smso-embed as a command of its own (``python -m batch.cli``), quiet, its summary JSON."""
    return [sys.executable, "-m", "batch.cli", *args, "--json", "--no-progress"]


def run_command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """:func:`command` run to its end from the repository's root."""
    return subprocess.run(
        command(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def in_time(work: Callable[[], T], fifo: Path, seconds: float = 20) -> T:
    """``work()``'s result, failing the test if it has not returned within ``seconds`` (then a
    writer is opened on ``fifo`` and closed, so that a reader blocked on it goes on and ends)."""
    done: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(work())
        except BaseException as error:
            failed.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=seconds)
    if worker.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # release the reader
        worker.join(timeout=120)
        pytest.fail(f"waited on the FIFO {fifo} for {seconds:g} s")
    if failed:
        raise failed[0]
    return done[0]
