"""``python -m bench.models --smoke`` end to end: real servers on model repositories, client
processes, a version swapped under load; the JSON has every part and its values are positive."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.bench import run_script


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.mark.slow  # five server start-ups and a few hundred requests: about 20 s on 2 cores
def test_smoke_run_reports_throughput_memory_and_version_swaps(tmp_path: Path) -> None:
    out = tmp_path / "models.json"
    proc = run_script("bench.models", "--smoke", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"machine", "settings", "throughput", "memory", "swap", "server_log"} <= set(report)
    assert report["machine"]["cpu_count"] >= 1
    assert report["machine"]["onnxruntime"]

    t = report["throughput"]
    rounds = report["settings"]["rounds"]
    assert len(t["ratio_by_round"]) == rounds
    assert sorted(t["order"]) == ["1"] * rounds + ["3"] * rounds
    for case in (t["one_model"], t["three_models"]):
        assert len(case["rounds"]) == rounds
        assert case["failures"] == 0
        assert case["requests"] == rounds * report["settings"]["requests"]
        for key in ("requests_per_second", "p50_ms", "p99_ms"):
            assert positive(case[key]), key
    assert all(positive(x) for x in t["ratio_by_round"])
    assert positive(t["ratio"])
    assert t["providers"]

    m = report["memory"]
    assert len(m["rss_mib_by_models"]) == 4  # 0, 1, 2 and 3 models
    assert all(positive(x) for x in m["rss_mib_by_models"])
    assert len(m["increase_mib_by_step"]) == 3
    assert all(math.isfinite(x) for x in m["increase_mib_by_step"])
    assert positive(t["server_rss_mib"]["one_model"])
    assert positive(t["server_rss_mib"]["three_models"])

    s = report["swap"]
    assert len(s["seconds"]) == s["swaps"] == report["settings"]["swaps"]
    assert all(positive(x) for x in s["seconds"])
    assert s["min_s"] <= s["median_s"] <= s["max_s"]
    assert positive(s["poll_s"])
    assert s["client"]["requests"] > 0
    assert s["client"]["failed"] == 0, s["client"]["outcomes"]
    assert s["metadata_not_200"] == 0
    # the client saw the first and the last version answer
    assert {"1", str(s["swaps"] + 1)} <= set(s["client"]["versions"])
    assert report["server_log"]["tracebacks"] == 0, report["server_log"]["lines"]

    assert "3 models / 1 model, req/s:" in proc.stdout
