"""Rows compared paired by seed: the interval against scipy's paired t-test, and the report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from scipy import stats

from training.experiments import TABLES, find_row, report, row_config
from training.model import build_model
from training.paired_comparison import MARGIN, paired_difference


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([0.941, 0.936, 0.944], [0.938, 0.931, 0.940]),
        ([0.90, 0.95, 0.92, 0.93], [0.91, 0.93, 0.93, 0.90]),
        ([0.5, 0.6], [0.7, 0.75]),
    ],
)
def test_the_interval_is_scipys_paired_t_interval(a: list[float], b: list[float]) -> None:
    d = paired_difference(a, b)
    reference = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert d.n == len(a)
    assert d.mean == pytest.approx(sum(a) / len(a) - sum(b) / len(b))
    assert (d.low, d.high) == pytest.approx((reference.low, reference.high))
    assert d.ahead == sum(x > y for x, y in zip(a, b, strict=True))
    # the verdict agrees with the test's p-value at 5 %
    p = stats.ttest_rel(a, b).pvalue
    assert (d.verdict in ("higher", "lower")) == (p < 0.05)


def test_verdicts() -> None:
    assert paired_difference([0.95, 0.951, 0.952], [0.90, 0.9, 0.9]).verdict == "higher"
    assert paired_difference([0.80, 0.81, 0.80], [0.90, 0.9, 0.91]).verdict == "lower"
    # the interval holds 0, its lower end within the margin: not lower by more than 0.5 points
    close = paired_difference([0.9010, 0.9000, 0.9005], [0.9, 0.9, 0.9])
    assert close.low > -MARGIN
    assert close.verdict == "not lower by more than 0.5"
    # the seeds disagree too much to tell
    wide = paired_difference([0.91, 0.89, 0.90], [0.90, 0.9, 0.9])
    assert wide.low < -MARGIN < 0 < wide.high
    assert wide.verdict == "inconclusive"
    one = paired_difference([0.9], [0.8])
    assert one.verdict == "-"
    assert math.isnan(one.low)
    assert one.mean == pytest.approx(0.1)


def test_unpaired_values_are_refused() -> None:
    with pytest.raises(ValueError, match="as many values"):
        paired_difference([0.9, 0.8], [0.9])
    with pytest.raises(ValueError, match="at least one"):
        paired_difference([], [])


def _result(row: str, label: str, dim: int, seed: int, val: float, test: float | None) -> dict:
    return {
        "table": "fmnist", "row": row, "label": label, "dataset": "fashion_mnist", "seed": seed,
        "feature_dim": dim, "head_parameters": 1000, "best_val_accuracy": val,
        "test_accuracy": test, "train_seconds": 60.0, "epochs": 45, "paper": None,
    }  # fmt: skip


def test_the_report_compares_smso_rows_with_first_order_and_bp_by_seed(tmp_path: Path) -> None:
    gap = [0.930, 0.935, 0.932]
    bp = [0.920, 0.925, 0.921]
    smso = [0.940, 0.941, 0.939]
    records = [_result("first-order", "first-order (GAP)", 128, s, v, v) for s, v in enumerate(gap)]
    records += [_result("bp", "BP", 4096, s, v, v) for s, v in enumerate(bp)]
    records += [_result("smso-64", "SMSO p=64", 64, s, v, v) for s, v in enumerate(smso)]
    # seed 3 of SMSO has no first-order or BP run to pair with: left out of the comparison
    records.append(_result("smso-64", "SMSO p=64", 64, 3, 0.5, 0.5))
    # seed 4 of SMSO has no test result: left out too
    records.append(_result("first-order", "first-order (GAP)", 128, 4, 0.9, 0.9))
    records.append(_result("smso-64", "SMSO p=64", 64, 4, 0.5, None))
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    table = report("fmnist", tmp_path)
    lines = {line.split(" | ")[1]: line for line in table.splitlines() if "SMSO p=64 | " in line
             and " vs " in line}  # fmt: skip
    expected_gap = paired_difference(smso, gap)
    assert lines["first-order (GAP)"] == (
        f"| SMSO p=64 | first-order (GAP) | fashion_mnist | 3 | 64 vs 128 | "
        f"{100 * expected_gap.mean:+.2f} [{100 * expected_gap.low:+.2f}, "
        f"{100 * expected_gap.high:+.2f}] | {100 * expected_gap.mean:+.2f} "
        f"[{100 * expected_gap.low:+.2f}, {100 * expected_gap.high:+.2f}] | 3 of 3 | higher |"
    )
    assert lines["BP"].endswith("| 3 of 3 | higher |")
    assert "64 vs 4,096" in lines["BP"]
    assert "Paired by seed" in table


def test_a_table_without_reference_rows_has_no_comparison(tmp_path: Path) -> None:
    records = [_result("mpn", "MPN", 2080, s, 0.9, 0.9) for s in range(2)]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert "Paired by seed" not in report("fmnist", tmp_path)


def test_every_fmnist_row_starts_from_the_same_backbone_for_a_seed(tmp_path: Path) -> None:
    """What the pairing rests on: a seed gives every row the same initial backbone weights
    (training seeds torch, then builds the backbone before the head)."""
    backbones = {}
    for row in TABLES["fmnist"]:
        cfg = row_config("fmnist", find_row("fmnist", row.name), None, tmp_path)
        torch.manual_seed(1)
        model = build_model(cfg.model_config(10, 1))
        backbones[row.name] = model.backbone.state_dict()
    reference = backbones["first-order"]
    for name, weights in backbones.items():
        assert weights.keys() == reference.keys(), name
        assert all(torch.equal(weights[k], reference[k]) for k in reference), name
