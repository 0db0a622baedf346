"""The fair table's own runs, docs/results/records/fmnist-fair/: each a head's recipe chosen by
the sweep (docs/results/records/fmnist-sweep/), trained at the full schedule with nothing else
changed, its checkpoint the validation arg-max, tested once; and the page's fair table their
report."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training.test_fmnist_sweep_records import GRID, HEADS, best_val, point
from tests.training.test_fmnist_table_records import (
    confusion_accuracy,
    percent,
    record,
    val_accuracies,
    verdict_cells,
)
from training.recipe_sweep import choices, fair_report

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
RECORDS = RESULTS / "records"
SWEEP, FAIR, TABLE = RECORDS / "fmnist-sweep", RECORDS / "fmnist-fair", RECORDS / "fmnist-table"
PAGE = RESULTS / "fashion-mnist.md"
RUNS = sorted(FAIR.glob("fashion_mnist-*/seed*"))
FAIR_HEADER = "| head | recipe (chosen on validation) |"


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
    docs/results/records/fmnist-sweep --fair docs/results/records/fmnist-fair` line for line."""
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
    lines = set(page.splitlines())
    missing = [line for line in rendered.splitlines() if line and line not in lines]
    assert missing == []


def tables_after(page: str, header: str) -> list[dict[str, list[str]]]:
    """The markdown tables from the one whose header starts with ``header`` on, to the next
    section: each as its rows' cells keyed by the first two cells joined."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    tables: list[dict[str, list[str]]] = []
    inside = False
    for line in lines[start:]:
        if line.startswith("#"):
            break
        if not line.startswith("|"):
            inside = False
            continue
        if not inside:
            tables.append({})
            inside = True
            continue  # the header
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not set(cells[0]) <= set("-:"):
            tables[-1][" / ".join(cells[:2])] = cells
    return tables


def test_the_fair_table_and_verdicts_recomputed_from_the_records() -> None:
    """Independently of the report: each head's choice, the highest best validation accuracy of
    its sweep points (first in grid order); its three runs, the fmnist table's where the choice
    is the shipped recipe; mean ± sd over seeds of best validation and test accuracy; and SMSO
    p = 64 against first-order, BP and MPN, paired by seed, with the page's verdict rule."""
    accuracy = {point(run): best_val(run) for run in SWEEP.glob("fashion_mnist-*/seed0")}
    if not all((head, *p) in accuracy for head in HEADS for p in GRID):
        pytest.skip("the sweep has not finished: no fair table yet")
    runs, recipes = {}, {}
    for head in HEADS:
        values = [accuracy[(head, *p)] for p in GRID]
        lr, wd = GRID[values.index(max(values))]
        recipes[head] = f"lr {lr:g}, wd {wd:g}"
        folder = (
            TABLE / f"fashion_mnist-{head}"
            if (lr, wd) == (0.01, 2e-3)
            else FAIR / f"fashion_mnist-{head}-lr{lr:g}-wd{wd:g}"
        )
        runs[head] = [folder / f"seed{s}" for s in (0, 1, 2)]
    if not all(run.is_dir() for seeds in runs.values() for run in seeds):
        pytest.skip("the chosen recipes' full runs have not finished")
    val = {h: [max(val_accuracies(r)) for r in seeds] for h, seeds in runs.items()}
    test = {h: [confusion_accuracy(r) for r in seeds] for h, seeds in runs.items()}
    label = {h: record(seeds[0], "result.json")["label"] for h, seeds in runs.items()}
    dims = {h: record(seeds[0], "result.json")["feature_dim"] for h, seeds in runs.items()}

    fair, verdicts = tables_after(PAGE.read_text(), FAIR_HEADER)[:2]
    table_label = {
        h: record(TABLE / f"fashion_mnist-{h}" / "seed0", "result.json")["label"] for h in HEADS
    }
    assert len(fair) == len(HEADS)
    for head in HEADS:
        shipped = recipes[head] == "lr 0.01, wd 0.002"
        expected = [table_label[head], recipes[head], "3", f"{dims[head]:,}"]
        expected += [percent(val[head]), percent(test[head])]
        expected += ["the fmnist table (shipped recipe)" if shipped else "fmnist-fair"]
        assert fair[f"{table_label[head]} / {recipes[head]}"] == expected

    assert len(verdicts) == 3
    for reference in ("first-order", "bp", "mpn"):
        expected = verdict_cells(
            (label["smso-64"], label[reference]),
            (dims["smso-64"], dims[reference]),
            (val["smso-64"], val[reference]),
            (test["smso-64"], test[reference]),
        )
        assert verdicts[f"{label['smso-64']} / {label[reference]}"] == expected
