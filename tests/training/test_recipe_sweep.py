"""Each head's recipe chosen on validation from the sweep's records, and the fair table built
from the chosen runs (synthetic records in the layout ``smso-experiment run`` writes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.config import ConfigError
from training.experiment_cli import main
from training.experiments import SWEEP_HEADS, SWEEP_LRS, SWEEP_WEIGHT_DECAYS, run_dir
from training.recipe_sweep import choices, fair_report, rows_to_run, sweep_report

GRID = [(lr, wd) for lr in SWEEP_LRS for wd in SWEEP_WEIGHT_DECAYS]


def record(out: Path, table: str, row: str, seed: int, val: float, test: float | None) -> None:
    """One finished run's result.json, as run_row writes it."""
    folder = run_dir(out, "fashion_mnist", row, seed)
    folder.mkdir(parents=True)
    line = {
        "table": table, "row": row, "label": row, "dataset": "fashion_mnist", "seed": seed,
        "feature_dim": 64, "head_parameters": 1000, "best_val_accuracy": val,
        "test_accuracy": test, "train_seconds": 60.0, "median_epoch_seconds": 1.0,
        "epochs": 18 if table == "fmnist-sweep" else 45, "paper": None,
    }  # fmt: skip
    (folder / "result.json").write_text(json.dumps(line))


def sweep(out: Path, best: dict[str, tuple[float, float]], heads=SWEEP_HEADS) -> None:
    """Every grid point of ``heads`` at 0.90 validation accuracy, ``best[head]`` at 0.93."""
    for head in heads:
        for lr, wd in GRID:
            val = 0.93 if best.get(head) == (lr, wd) else 0.90
            record(out, "fmnist-sweep", f"{head}-lr{lr:g}-wd{wd:g}", 0, val, None)


def test_each_head_gets_its_validation_argmax(tmp_path: Path) -> None:
    best = {"first-order": (0.02, 5e-4), "bp": (0.005, 2e-3), "mpn": (0.01, 2e-3)}
    best["smso-64"] = (0.01, 2e-3)  # the shipped recipe
    sweep(tmp_path, best)
    chosen, waiting = choices(tmp_path)
    assert waiting == []
    assert {h: (c.lr, c.weight_decay) for h, c in chosen.items()} == best
    assert {h for h, c in chosen.items() if c.shipped} == {"mpn", "smso-64"}
    # the shipped recipe's 45-epoch runs exist already: only the others are to run
    assert rows_to_run(tmp_path) == ["first-order-lr0.02-wd0.0005", "bp-lr0.005-wd0.002"]
    table = sweep_report(tmp_path)
    assert "| first-order (GAP) | 90.00 | 90.00 | 90.00 | 90.00 | **93.00** | 90.00 |" in table
    assert "lr 0.01, wd 0.002 (the shipped recipe) |" in table
    assert "Not finished" not in table


def test_ties_go_to_grid_order_and_unfinished_heads_wait(tmp_path: Path) -> None:
    sweep(tmp_path, {}, heads=("first-order",))  # six equal points
    for lr, wd in GRID[:4]:  # BP: four of six points done
        record(tmp_path, "fmnist-sweep", f"bp-lr{lr:g}-wd{wd:g}", 0, 0.95, None)
    chosen, waiting = choices(tmp_path)
    assert list(chosen) == ["first-order"]
    assert (chosen["first-order"].lr, chosen["first-order"].weight_decay) == GRID[0]
    assert waiting[0] == "bp (4 of 6 points)"
    assert set(waiting[1:]) == {"mpn (0 of 6 points)", "smso-64 (0 of 6 points)"}
    assert "Not finished: bp (4 of 6 points)" in sweep_report(tmp_path)


def test_the_fair_table_pairs_chosen_runs_and_reuses_the_shipped_recipes(tmp_path: Path) -> None:
    swept, fair, records = tmp_path / "sweep", tmp_path / "fair", tmp_path / "records"
    sweep(swept, {"first-order": (0.02, 5e-4), "bp": (0.01, 2e-3), "mpn": (0.01, 2e-3),
                  "smso-64": (0.01, 2e-3)})  # fmt: skip
    for seed, (gap, bp, smso) in enumerate([(0.931, 0.936, 0.942), (0.932, 0.935, 0.943),
                                            (0.930, 0.937, 0.941)]):  # fmt: skip
        record(fair, "fmnist-fair", "first-order-lr0.02-wd0.0005", seed, 0.94, gap)
        record(records, "fmnist", "bp", seed, 0.945, bp)
        record(records, "fmnist", "smso-64", seed, 0.948, smso)
        record(records, "fmnist", "first-order", seed, 0.94, 0.5)  # not chosen: not used
    record(fair, "fmnist-fair", "bp-lr0.02-wd0.0005", 0, 0.9, 0.9)  # not chosen: not used
    text = fair_report(swept, fair, records)
    assert (
        "| first-order (GAP) | lr 0.02, wd 0.0005 | 3 | 64 | 94.00 ± 0.00 | 93.10 ± 0.10 "
        "| fmnist-fair |" in text
    )
    assert "| BP | lr 0.01, wd 0.002 | 3 |" in text
    # SMSO against the chosen first-order runs (not the fmnist table's 50 %): +1.10 points
    smso_vs_gap = next(
        line for line in text.splitlines() if line.startswith("| smso-64 | first-order")
    )
    assert "+1.10" in smso_vs_gap
    assert "| higher |" in smso_vs_gap
    # the time of the runs trained for the fair table only: the chosen first-order's three
    assert "Training time of these 3 runs, summed over the runs: 0.0 h" in text
    assert "Not in yet: mpn" in text  # chosen, no runs found
    assert "| smso-64 | mpn |" not in text
    for seed, mpn in enumerate([0.944, 0.942, 0.943]):
        record(records, "fmnist", "mpn", seed, 0.95, mpn)
    text = fair_report(swept, fair, records)
    smso_vs_mpn = next(line for line in text.splitlines() if line.startswith("| smso-64 | mpn"))
    assert "| -0.10 [" in smso_vs_mpn  # MPN is paired too: 94.20 against 94.30
    assert "Not in yet" not in text


def test_nothing_chosen_is_a_clear_error_and_the_cli_prints_rows(tmp_path: Path, capsys) -> None:
    with pytest.raises(ConfigError, match="no head's sweep has finished"):
        fair_report(tmp_path, tmp_path, tmp_path)
    sweep(tmp_path, {"first-order": (0.005, 5e-4)})
    assert main(["choose", "--sweep", str(tmp_path), "--to-run"]) == 0
    rows = capsys.readouterr().out.split()
    assert rows[0] == "first-order-lr0.005-wd0.0005"
    assert len(rows) == 4  # every head's first point wins the tie; none is the shipped recipe
