"""``python -m bench.export --quick``: onnxruntime against PyTorch eager on the shipped model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench import run_script


@pytest.mark.slow
def test_export_benchmark_runs_on_the_shipped_model(tmp_path: Path) -> None:
    out = tmp_path / "export.json"
    proc = run_script(
        "bench.export", "--quick", "--budget", "0.05", "--repeats", "1", "--json", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert {r["batch"] for r in report["results"]} == {1, 32, 128, 512}
    assert all(r["torch_ms"] > 0 and r["onnxruntime_ms"] > 0 for r in report["results"])
    assert report["summary"][0]["best_speedup"] > 0
    assert "ORT speedup" in proc.stdout
