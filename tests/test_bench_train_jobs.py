"""bench/train_jobs.py in its quick setting: one run on every core against one-thread runs side
by side, both measured and their ratio reported."""

from __future__ import annotations

import json

from bench.train_jobs import main


def test_quick_run_measures_one_run_and_runs_side_by_side(tmp_path, capsys):
    out = tmp_path / "train_jobs.json"
    assert main(["--quick", "--rows", "first-order", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert row["row"] == "first-order"
    assert row["one_run_steps_per_second"] > 0
    assert row["side_by_side_steps_per_second"] > 0
    assert row["side_by_side_over_one"] > 0
    assert "| first-order |" in capsys.readouterr().out
