"""``python -m bench.train_jobs`` in its quick setting: one run on every core against one-thread
runs side by side, both measured and their ratio reported."""

from __future__ import annotations

import json

import pytest

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
    assert "| first-order " in capsys.readouterr().out


def test_alone_measures_each_row_on_its_own_in_images_per_second(tmp_path, capsys):
    out = tmp_path / "train_jobs.json"
    assert main(["--quick", "--alone", "--rows", "bp", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["one_run_images_per_second"] == 64 * row["one_run_steps_per_second"]
    assert "side_by_side_steps_per_second" not in row
    assert "| bp " in capsys.readouterr().out


def test_an_unknown_row_is_refused_with_the_rows_there_are(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--rows", "smso-3"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown rows ['smso-3']" in err
    assert "smso-64" in err
