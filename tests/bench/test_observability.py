"""bench/observability.py's smoke run: six real servers (off, off again as a control, JSON logs,
tracing at sampling ratios 1, 0.1 and 0.01) under a short load; the JSON has every setting's
ratio, and the collector received every span of the server that traces every request; and the
spans' CPU per request, timed alone."""

from __future__ import annotations

import json
import math

import pytest

from bench.observability import COSTED, SETTINGS, TRACED, main


@pytest.mark.slow
def test_the_smoke_run_measures_every_setting_and_exports_spans(tmp_path, capsys):
    out = tmp_path / "observability.json"
    assert main(["--smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["settings"]) == list(SETTINGS)
    assert set(TRACED.values()) == {1.0, 0.1, 0.01}
    for setting, row in result["settings"].items():
        assert row["failures"] == 0, setting
        assert math.isfinite(row["ratio_to_off"])
        assert row["ratio_to_off"] > 0
        assert row["server_cpu_ms_per_request"] > 0
        assert row["sampling_ratio"] == TRACED.get(setting, 0.0)
    settings = result["settings"]
    assert settings["off"]["ratio_to_off"] == 1.0
    assert len(settings["off-control"]["set_ratios"]) == 1  # --smoke: one set
    assert result["otlp"]["exports"] > 0  # the traced servers sent their spans
    every = settings["tracing-1.0"]  # four spans a request: its own, decode, queue, inference
    assert every["spans_received"] + every["spans_dropped"] == 4 * every["requests_sent"]
    for setting in ("off", "off-control", "json"):
        assert settings[setting]["spans_received"] == 0
    assert settings["tracing-0.1"]["spans_received"] < every["spans_received"]
    assert settings["json"]["log_lines"] > settings["off"]["log_lines"]
    costs = result["span_costs"]  # the spans' CPU, timed alone: every ratio and the default
    assert {f"{setting}_us" for setting in COSTED} | {"off_us"} <= set(costs)
    assert all(math.isfinite(value) and value >= 0 for value in costs.values())
    out = capsys.readouterr().out
    assert "| tracing-1.0 |" in out
    assert "| tracing-0.001 |" in out


def test_the_costs_alone_need_no_server(tmp_path, capsys):
    out = tmp_path / "costs.json"
    assert main(["--costs-only", "--span-requests", "50", "--out", str(out)]) == 0
    assert set(json.loads(out.read_text())) == {"span_costs"}
    assert "OTLP encoding" in capsys.readouterr().out
