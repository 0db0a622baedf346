"""``python -m bench.train_step`` (a GPU benchmark) end to end on a tiny CPU setting."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench import run_script


def test_train_step_benchmark_runs_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "train_step.json"
    args = ["--device", "cpu", "--backbone", "resnet18", "--size", "64", "--batch", "2"]
    args += ["--steps", "1", "--rounds", "2", "--warmup", "0", "--json", str(out)]
    proc = run_script("bench.train_step", *args)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert [r["head"] for r in report["results"]] == ["smso p=2048", "first-order"]
    assert all(r["images_per_second"] > 0 for r in report["results"])
    assert "the SMSO head costs" in proc.stdout
