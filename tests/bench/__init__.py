"""The benchmarks' tests (``bench/``): each runs a script as documented, small."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` from the repository's root, warnings as errors."""
    return subprocess.run(
        [sys.executable, "-W", "error", "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,  # generous: a loaded CI machine must not turn slowness into failure
        check=False,
    )


def cells(line: str) -> list[str]:
    """The cells of a markdown table's line, stripped."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]
