"""bench/observability.py's smoke run: five real servers (off, off again as a control, JSON
logs, tracing, sampled tracing) under a short load; the JSON has every setting's ratio and the
collector received spans."""

from __future__ import annotations

import json
import math

import pytest

from bench.observability import SETTINGS, main


@pytest.mark.slow
def test_the_smoke_run_measures_every_setting_and_exports_spans(tmp_path, capsys):
    out = tmp_path / "observability.json"
    assert main(["--smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["settings"]) == list(SETTINGS)
    for setting, row in result["settings"].items():
        assert row["failures"] == 0, setting
        assert math.isfinite(row["ratio_to_off"])
        assert row["ratio_to_off"] > 0
        assert row["server_cpu_ms_per_request"] > 0
    assert result["settings"]["off"]["exporter_cpu_ms_per_request"] == 0  # no exporter process
    assert result["settings"]["tracing"]["exporter_cpu_ms_per_request"] >= 0  # clock ticks
    assert result["settings"]["off"]["ratio_to_off"] == 1.0
    assert len(result["settings"]["off-control"]["set_ratios"]) == 1  # --smoke: one set
    assert result["otlp"]["exports"] > 0  # the traced servers sent their spans
    assert result["settings"]["json"]["log_lines"] > result["settings"]["off"]["log_lines"]
    assert "| tracing |" in capsys.readouterr().out
