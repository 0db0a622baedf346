"""docs/results/fashion-mnist.md's recipe sweep against its records,
docs/results/records/fmnist-sweep/: each run is a grid point of the shipped recipe with only lr,
weight decay and epochs changed and no test pass, and the published grid and choices are
recomputed from the runs' metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.training.test_fmnist_table_records import record
from training.recipe_sweep import sweep_report

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "docs" / "results" / "records" / "fmnist-sweep"
TABLE_RECORDS = ROOT / "docs" / "results" / "records" / "fmnist-table"
PAGE = ROOT / "docs" / "results" / "fashion-mnist.md"
HEADS = ("first-order", "bp", "mpn", "smso-64")
GRID = [(lr, wd) for lr in (0.005, 0.01, 0.02) for wd in (5e-4, 2e-3)]  # the order ties follow
RUNS = sorted(RECORDS.glob("fashion_mnist-*/seed*"))
NAME = re.compile(r"fashion_mnist-(?P<head>.+)-lr(?P<lr>[0-9.]+)-wd(?P<wd>[0-9.e-]+)")
#: the settings a sweep point may change from the fmnist table's run of its head
CHANGED = {"lr", "weight_decay", "epochs", "eval_test", "out", "resume"}
#: settings added to smso-train after the table's runs, with the value that keeps the old
#: behaviour (``classes``: every class)
ADDED = {"classes": None}


def point(run: Path) -> tuple[str, float, float]:
    """The head, lr and weight decay the run's folder names."""
    match = NAME.fullmatch(run.parent.name)
    assert match is not None, run.parent.name
    return match["head"], float(match["lr"]), float(match["wd"])


def best_val(run: Path) -> float:
    """The best validation accuracy in metrics.jsonl, whose epochs are checked to be 1 to 18."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [line["epoch"] for line in lines] == list(range(1, 19))
    return max(line["val_accuracy"] for line in lines)


def published_grid(page: str) -> dict[str, list[str]]:
    """The page's sweep grid: the cells of each row, keyed by the head's label."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| head | lr 0.005"))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_some_points_have_finished() -> None:
    assert len(RUNS) >= 12


@pytest.mark.parametrize("run", RUNS, ids=lambda run: run.parent.name)
def test_each_run_is_a_grid_point_of_its_heads_table_recipe_without_a_test_pass(run: Path) -> None:
    head, lr, wd = point(run)
    assert head in HEADS
    assert (lr, wd) in GRID
    assert run.name == "seed0"
    config = record(run, "config.json")
    table = record(TABLE_RECORDS / f"fashion_mnist-{head}" / "seed0", "config.json")
    for key, value in ADDED.items():  # absent from the table's (and the first points') configs
        assert config.pop(key, value) == table.pop(key, value) == value
    assert config.keys() == table.keys()
    assert {key for key in config if config[key] != table[key]} <= CHANGED
    assert (config["lr"], config["weight_decay"], config["epochs"]) == (lr, wd, 18)
    assert config["eval_test"] is False
    assert config["seed"] == 0
    assert not (run / "test.json").exists()
    result = record(run, "result.json")
    assert result["test_accuracy"] is None
    assert result["best_val_accuracy"] == best_val(run)


def test_the_published_grid_and_choices_recomputed_from_the_metrics() -> None:
    """Per head: each finished point's best validation accuracy, in percent; where all six have
    finished, the highest in bold (of equal ones the first in grid order) and named as the
    choice, marked where it is the shipped recipe (lr 0.01, weight decay 2e-3)."""
    accuracy = {point(run): best_val(run) for run in RUNS}
    grid = published_grid(PAGE.read_text())
    labels = {
        head: record(TABLE_RECORDS / f"fashion_mnist-{head}" / "seed0", "result.json")["label"]
        for head in HEADS
    }
    assert set(grid) == set(labels.values())
    for head in HEADS:
        cells = ["-" if (head, *p) not in accuracy else f"{100 * accuracy[(head, *p)]:.2f}"
                 for p in GRID]  # fmt: skip
        chosen = "-"
        if all((head, *p) in accuracy for p in GRID):
            values = [accuracy[(head, *p)] for p in GRID]
            best = values.index(max(values))
            cells[best] = f"**{cells[best]}**"
            lr, wd = GRID[best]
            chosen = f"lr {lr:g}, wd {wd:g}" + (" (the shipped recipe)" if best == 3 else "")
        assert grid[labels[head]] == [*cells, chosen], head


def test_the_page_has_the_grids_notes_as_the_report_renders_them() -> None:
    """`smso-experiment choose --sweep docs/results/records/fmnist-sweep`, line for line: the
    notes with the sweep's training time and the heads not finished."""
    page = set(PAGE.read_text().splitlines())
    missing = [line for line in sweep_report(RECORDS).splitlines() if line and line not in page]
    assert missing == []


def test_the_pages_status_names_the_heads_chosen_so_far() -> None:
    """While some head's points are missing, the page says the sweep is running and names the
    heads whose six points have all finished; once none is missing, it does not."""
    done = {point(run)[0] for run in RUNS}
    done = {h for h in done if all((RECORDS / f"fashion_mnist-{h}-lr{lr:g}-wd{wd:g}").is_dir()
                                   for lr, wd in GRID)}  # fmt: skip
    page = re.sub(r"\s+", " ", PAGE.read_text())
    if done == set(HEADS):
        assert "The sweep is still running" not in page
        return
    labels = [
        record(TABLE_RECORDS / f"fashion_mnist-{head}" / "seed0", "result.json")["label"]
        for head in HEADS
        if head in done
    ]
    named = ", ".join(labels[:-1]) + " and " + labels[-1] if len(labels) > 1 else labels[0]
    assert f"**The sweep is still running.** Chosen so far: {named}." in page


def test_the_quoted_gains_of_the_choices_over_the_shipped_recipe() -> None:
    """The page's "by W (first-order), X (BP), Y (MPN) and Z (SMSO p = 64) points of validation
    accuracy over the shipped recipe's": the chosen point's best validation accuracy less
    lr 0.01, wd 2e-3's."""
    page = re.sub(r"\s+", " ", PAGE.read_text())
    quoted = re.search(
        r"by ([0-9.]+) \(first-order\), ([0-9.]+) \(BP\), ([0-9.]+) \(MPN\) and ([0-9.]+) "
        r"\(SMSO p = 64\) points",
        page,
    )
    assert quoted is not None
    accuracy = {point(run): best_val(run) for run in RUNS}
    for head, value in zip(HEADS, quoted.groups(), strict=True):
        best = max(accuracy[(head, *p)] for p in GRID)
        assert value == f"{100 * (best - accuracy[(head, 0.01, 2e-3)]):.2f}"
