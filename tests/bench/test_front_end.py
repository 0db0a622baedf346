"""``python -m bench.front_end``: the service under uvicorn and under Granian, the same app
answering the same, driven by wrk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench import run_script


@pytest.mark.slow
def test_both_front_ends_serve_the_shipped_model_and_are_metered(tmp_path: Path) -> None:
    out = tmp_path / "front_end.json"
    proc = run_script(
        "bench.front_end", "--rows", "shipped", "--rounds", "1", "--seconds", "2",
        "--clients", "2", "--json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    row = json.loads(out.read_text())["rows"]["shipped"]
    loads = row["loads"]["2"]
    for server in ("uvicorn", "granian"):
        assert loads[server]["failures"] == 0
        assert loads[server]["requests"] > 0
        assert loads[server]["server_cpu_ms_per_request"] > 0  # every process of it
    assert row["ratios"]["2"]["uvicorn"]["granian"]["ratio"] > 0
    assert "| uvicorn |" in proc.stdout
    assert "| granian |" in proc.stdout


@pytest.mark.slow
def test_the_limits_probe_finds_every_limit_of_the_service_under_uvicorn(tmp_path: Path) -> None:
    out = tmp_path / "limits.json"
    proc = run_script("bench.front_end", "--limits", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    found = json.loads(out.read_text())["limits"]
    ours = found["uvicorn"]
    # SMSO_REQUEST_TIMEOUT_S: a body still arriving at the deadline has its connection closed
    assert ours["body stops arriving"]["ended"] == "closed"
    assert ours["70 kB header"]["status"] == 431
    assert ours["70 kB header"]["body"].startswith("{")  # the service's JSON error
    assert ours["150 header fields"]["status"] == 431
    assert ours["head never ends"]["ended"] == "closed"  # SMSO_HEADER_TIMEOUT_S
    assert ours["request on an idle connection after SIGTERM"]["status"] == 200  # the drain
    assert set(found["granian"]) == set(ours)  # probed alike; what it does is reported
    assert "| probe" in proc.stdout
