"""``python -m experiments.typicality --quick``: real servers on the shipped model, small in- and
out-of-distribution sets, one short drift stream of each kind and one round of the cost; the
JSON has every set's AUROC per method, the drift fields and a cost ratio, each sane."""

from __future__ import annotations

import json
import math

import pytest

from experiments.typicality import METHODS, OOD_SETS, main


@pytest.mark.slow
def test_the_quick_run_measures_separation_drift_and_cost(tmp_path, capsys):
    out = tmp_path / "typicality.json"
    assert main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())

    separation = result["separation"]
    assert separation["source"] in ("served", "client")
    assert list(separation["sets"]) == list(OOD_SETS)
    for name, methods in separation["sets"].items():
        assert list(methods) == list(METHODS), name
        for method, row in methods.items():
            assert 0.0 <= row["auroc"] <= 1.0, (name, method)
            assert 0.0 <= row["fpr_at_95_tpr"] <= 1.0, (name, method)
    # noise and photos are far from garments: any sane score separates them
    assert separation["sets"]["noise"]["typicality"]["auroc"] > 0.9
    assert separation["sets"]["photos"]["typicality"]["auroc"] > 0.9
    assert set(separation["mean_auroc"]) == set(METHODS)
    assert separation["test_accuracy"] > 0.85  # the served logits are the model's
    assert separation["test_share_p_below_0.01"] < 0.05  # a calibrated p-value

    drift = result["drift"]
    assert drift["source"] in ("served", "client")
    assert drift["window"] == 200
    assert drift["ood_share"] == 0.1
    assert len(drift["delays"]) == len(drift["mixed_streams"]) == 1
    assert drift["undetected"] == 0
    assert drift["delays"][0] > 0  # the alarm came after the change, not before
    assert drift["id_streams"] == 1
    assert drift["id_alarms"] == 0
    assert drift["id_runs"][0]["requests"] == drift["id_requests"]

    assert "control" not in result["cost"]  # --quick: one pair, no off-against-off control
    for load, row in result["cost"]["typicality"].items():
        assert math.isfinite(row["ratio"]), load
        assert row["ratio"] > 0, load
        assert row["cpu_ratio"] > 0, load
        assert len(row["pair_ratios"]) == 1, load
        assert min(row["a_requests_per_second"], row["b_requests_per_second"]) > 0, load
    assert "/classify 1 PNG" in result["cost"]["typicality"]
    assert set(result["targets"]) >= {"mean_auroc_at_least_0.985", "cost_at_most_5%"}
    assert "| rot90 |" in capsys.readouterr().out
