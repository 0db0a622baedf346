"""``python -m bench.app_overhead`` in its quick setting: both arrangements answer every request."""

from __future__ import annotations

import json

from bench.app_overhead import ARRANGEMENTS, main


def test_quick_run_measures_both_routes_in_both_arrangements(tmp_path, capsys):
    out = tmp_path / "app_overhead.json"
    assert main(["--quick", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [row["route"] for row in report["rows"]] == ["/v2 binary FP32", "/classify JPEG"]
    for row in report["rows"]:
        assert set(row["loop_cpu_ms"]) == set(ARRANGEMENTS)
        assert all(ms > 0 for ms in row["loop_cpu_ms"].values())
        assert all(len(rounds) == 2 for rounds in row["rounds_ms"].values())
    assert "| /v2 binary FP32 " in capsys.readouterr().out
