"""``python -m bench.serve --quick``: the real server under load against a bare endpoint, the
protocol's routes over REST and gRPC, and the GPU-like stand-in backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench import run_script


@pytest.mark.slow
def test_serve_benchmark_drives_the_real_server(tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    proc = run_script(
        "bench.serve",
        "--quick",
        "--requests",
        "24",
        "--clients",
        "3",
        "--seconds",
        "1",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    service = report["cases"][0]["service"]
    assert service["failures"] == 0
    if report["settings"]["driver"] == "httpx":  # a fixed count of requests per load
        assert service["requests"] == 24
    else:  # wrk: as many as 3 connections answer in 1 second a round, for 4 rounds
        assert service["requests"] >= 3 * 4
    assert set(service["split"]) >= {"decode_ms", "queue_ms", "inference_ms", "response_ms"}
    # the CPU: nothing to pad, no device copies; the shipped model's typicality score
    assert set(service["split"]["stage_ms"]) == {"stack", "run", "score"}
    assert report["ratios"]["shipped_rps_over_bare"] > 0
    assert "server memory with the shipped model" in proc.stdout
    memory = service["memory_mib"]  # every process of the server (the workers, and more)
    assert memory["processes"] >= 1
    assert 0 < memory["pss_mib"] <= memory["rss_mib"]
    protocols = service["protocols"]
    assert len(protocols) == 4
    assert "/v2 infer, preprocessed binary FP32" in protocols
    assert "gRPC ModelInfer, preprocessed FP32" in protocols  # the same tensors over gRPC
    assert all(r["failures"] == 0 and r["requests_per_second"] > 0 for r in protocols.values())
    assert report["ratios"]["grpc_over_rest_fp32"] > 0
    assert "gRPC / REST, preprocessed FP32 tensors" in proc.stdout
