"""The fair table's own runs, docs/results/fmnist-fair/: each a head's recipe chosen by the sweep
(docs/results/fmnist-sweep/), trained at the full schedule with nothing else changed, its
checkpoint the validation arg-max, tested once; and the page's fair table their report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.training.test_fmnist_table_records import confusion_accuracy, val_accuracies
from training.recipe_sweep import choices, fair_report

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
SWEEP, FAIR, TABLE = RESULTS / "fmnist-sweep", RESULTS / "fmnist-fair", RESULTS / "fmnist-table"
PAGE = RESULTS / "fashion-mnist.md"
RUNS = sorted(FAIR.glob("fashion_mnist-*/seed*"))
FAIR_HEADER = "| head | recipe (chosen on validation) |"


def record(run: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / name).read_text())
    return data


@pytest.mark.parametrize("run", RUNS, ids=lambda run: f"{run.parent.name}/{run.name}")
def test_each_run_is_a_chosen_point_at_45_epochs_tested_once_at_its_best_epoch(run: Path) -> None:
    chosen, _ = choices(SWEEP)
    rows = {c.row for c in chosen.values() if not c.shipped}
    row = run.parent.name.removeprefix("fashion_mnist-")
    assert row in rows  # only a choice that is not the shipped recipe is trained again
    assert run.name in {"seed0", "seed1", "seed2"}
    config = record(run, "config.json")
    swept = record(SWEEP / run.parent.name / "seed0", "config.json")
    changed = {key for key in config.keys() | swept.keys() if config.get(key) != swept.get(key)}
    assert changed <= {"epochs", "eval_test", "seed", "out", "resume"}
    assert (config["epochs"], config["eval_test"]) == (45, True)
    assert config["seed"] == int(run.name.removeprefix("seed"))
    accuracies = val_accuracies(run)
    test, result = record(run, "test.json"), record(run, "result.json")
    assert test["epoch"] == 1 + accuracies.index(max(accuracies))
    assert result["best_val_accuracy"] == max(accuracies)
    assert test["test_images"] == 10_000
    assert result["test_accuracy"] == test["test_accuracy"] == confusion_accuracy(run)


def test_the_page_has_the_fair_table_once_every_chosen_head_has_its_three_seeds() -> None:
    """Until then the page has no fair table; after, `smso-experiment choose --sweep
    docs/results/fmnist-sweep --fair docs/results/fmnist-fair` line for line."""
    chosen, waiting = choices(SWEEP)
    done = not waiting and all(
        c.shipped or all((FAIR / f"fashion_mnist-{c.row}" / f"seed{s}").is_dir() for s in (0, 1, 2))
        for c in chosen.values()
    )
    page = PAGE.read_text()
    if not done:
        assert FAIR_HEADER not in page
        return
    rendered = fair_report(SWEEP, FAIR, TABLE)
    missing = [line for line in rendered.splitlines() if line and line not in page]
    assert missing == []
