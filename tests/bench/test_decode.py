"""The decoding benchmark (``python -m bench.decode``) end to end in its quick setting."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench.decode import POOLS, Steps
from tests.bench import run_script


def run(tmp_path: Path, *args: str) -> tuple[str, dict[str, Any]]:
    """``python -m bench.decode --quick`` as documented, warnings as errors; its stdout and
    JSON report."""
    out = tmp_path / "decode.json"
    proc = run_script("bench.decode", "--quick", "--json", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads(out.read_text())


@pytest.mark.slow
def test_quick_run_reports_every_row(tmp_path):
    stdout, report = run(tmp_path, "--no-py-spy")
    assert report["py_spy"] is None
    assert [row["true_fraction"] > 0 for row in report["calibration"]["rows"]] == [True, True]
    assert len(report["cases"]) == 2
    for case in report["cases"]:
        assert list(case["steps"]["step_ms"]) == list(Steps.NAMES)
        assert all(ms > 0 for ms in case["steps"]["step_ms"].values())
        assert list(case["pools"]) == list(POOLS)
        for row in case["pools"].values():
            assert row["images_per_second"] > 0
        assert case["pools"]["threads x1"]["ratio_to_one_thread"] == 1.0
        assert set(case["gil_held_fraction"]) == {"probe", "2-thread scaling"}
        assert all(0 <= s <= 1 for s in case["gil_held_fraction"].values())
        assert len(case["model"]) == 3  # two thread estimates and the process pool
        for model in case["model"].values():
            assert 1 <= model["speedup"] <= 16
            assert math.isclose(
                model["speedup"], 1 / (model["serial"] + (1 - model["serial"]) / 16)
            )
        assert case["name"] in stdout
    assert "A model, not a measurement" in stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed")
def test_py_spy_attributes_the_gil_to_each_step(tmp_path):
    _, report = run(tmp_path)
    if report["py_spy"] is None:
        pytest.skip("py-spy may not read processes here (ptrace)")
    for case in report["cases"]:
        by_step = case["py_spy"]["held_fraction_by_step"]
        assert list(by_step) == list(Steps.NAMES)
        assert 0 < case["gil_held_fraction"]["py-spy"] < 1
