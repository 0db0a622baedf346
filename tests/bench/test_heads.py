"""The head benchmark (``python -m bench.heads``) end to end on a tiny setting."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench import heads
from bench.lib import torch_device

ROOT = Path(__file__).resolve().parents[2]

SIDE = 4  # n = 16: every head in well under a second
# (head, form, p, n) -> output dim; mpn at c = 256 gives c(c+1)/2, gap the c = 256 channels.
EXPECTED = {
    ("smso", "conv", 64, SIDE**2): 64,
    ("smso", "covariance", 64, SIDE**2): 64,
    ("smso", "conv", 2048, SIDE**2): 2048,
    ("smso", "covariance", 2048, SIDE**2): 2048,
    ("gap", "-", None, SIDE**2): 256,
    ("mpn", "-", None, SIDE**2): 32896,
}
LOG_LINE = re.compile(r"\d\d:\d\d:\d\d \[\d+/\d+\] ")  # the script's progress lines


@dataclass(frozen=True)
class Run:
    stdout: str
    stderr: str
    report: dict[str, Any]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """``python -m bench.heads`` as documented (from the root), warnings as errors."""
    out = tmp_path_factory.mktemp("bench") / "heads.json"
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}  # torch_device's
    args = ["--heads", "smso", "gap", "mpn", "--sides", str(SIDE), "--repeats", "1"]
    args += ["--budget", "0", "--quick", "--threads", "2", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-m", "bench.heads", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # generous: a loaded CI machine must not turn slowness into failure
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return Run(proc.stdout, proc.stderr, json.loads(out.read_text()))


def key(row: dict[str, Any]) -> tuple[str, str, int | None, int]:
    return row["head"], row["form"], row["options"].get("dim"), row["positions"]


@pytest.mark.slow  # shares one ~4 s run of the script
def test_json_has_one_row_per_configuration(run: Run) -> None:
    rows = run.report["results"]
    assert sorted(map(key, rows), key=str) == sorted(EXPECTED, key=str)
    for row in rows:
        assert row["output_dim"] == EXPECTED[key(row)], key(row)
        assert row["channels"] == 256
        assert row["forward_ms"] > 0
        assert row["train_ms"] > 0
        assert row["forward_repeats"] == row["train_repeats"] == 1
        assert row["memory_mib"] >= 0
    assert run.report["settings"]["positions"] == [SIDE**2]
    assert run.report["machine"]["threads"] == 2
    assert run.report["checks"]["speedup"]["rows"]  # MPN vs SMSO p=64 (BP not measured)
    assert len(run.report["checks"]["forms"]["rows"]) == 2  # p = 64 and 2048


@pytest.mark.slow  # shares one ~4 s run of the script
def test_table_has_the_rows(run: Run) -> None:
    lines = run.stdout.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("| head")))
    table = lines[first : lines.index("", first)]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert re.fullmatch(r"\|(-+:?\|)+", table[1])
    rows = [
        dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        for line in table[2:]
    ]
    shown = {
        (r["head"], r["form"], r["p/d"], int(r["n"]), int(r["output dim"].replace(",", "")))
        for r in rows
    }
    expected = {
        (head, form, "-" if p is None else f"p={p}", n, dim)
        for (head, form, p, n), dim in EXPECTED.items()
    }
    assert len(rows) == len(expected)
    assert shown == expected
    assert "Check 1:" in run.stdout
    assert "Check 2:" in run.stdout


@pytest.mark.slow  # shares one ~4 s run of the script
def test_stderr_has_only_progress_lines(run: Run) -> None:
    """No warnings and no profiler chatter (torch_device sets KINETO_LOG_LEVEL before torch)."""
    noise = [line for line in run.stderr.splitlines() if line and not LOG_LINE.match(line)]
    assert noise == []


def test_importable_as_a_package() -> None:
    assert heads.torch_device is torch_device
    assert len(heads.configs(["smso", "gap", "mpn"], [SIDE])) == len(EXPECTED)
