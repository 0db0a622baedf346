"""docs/results/fashion-mnist.md against the records it is made of,
docs/results/records/fmnist-table/: the table and the paired verdicts recomputed, and each run's
best.pt its validation arg-max."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from training.experiments import TABLES, report

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "docs" / "results" / "records" / "fmnist-table"
PAGE = ROOT / "docs" / "results" / "fashion-mnist.md"
SEEDS = (0, 1, 2)
RUNS = sorted(RECORDS.glob("fashion_mnist-*/seed*"))


def record(run: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / name).read_text())
    return data


def val_accuracies(run: Path) -> list[float]:
    """metrics.jsonl's validation accuracy of epochs 1, 2, ... (checked to be in order)."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [line["epoch"] for line in lines] == list(
        range(1, record(run, "config.json")["epochs"] + 1)
    )
    return [line["val_accuracy"] for line in lines]


def confusion_accuracy(run: Path) -> float:
    """The share of test images on the confusion matrix's diagonal."""
    confusion = np.array(record(run, "test.json")["confusion"])
    assert confusion.sum() == 10_000
    return float(np.trace(confusion)) / 10_000


def published_table(page: str, header: str) -> dict[tuple[str, ...], list[str]]:
    """The rows of the markdown table whose header line starts with ``header``, keyed by the
    cells before the first numeric column (the model; the model and its reference)."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    width = 2 if header.startswith("| model | reference") else 1
    rows: dict[tuple[str, ...], list[str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows[tuple(cells[:width])] = cells
    return rows


def runs_by_row() -> dict[str, list[Path]]:
    """Each fmnist row's run folders, seeds 0, 1, 2, in table order."""
    return {
        row.name: [RECORDS / f"fashion_mnist-{row.name}" / f"seed{s}" for s in SEEDS]
        for row in TABLES["fmnist"]
    }


def test_the_records_are_every_row_of_the_grid_for_each_seed() -> None:
    expected = [run for runs in runs_by_row().values() for run in runs]
    assert sorted(RECORDS.glob("fashion_mnist-*/seed*")) == sorted(expected)
    assert len(expected) == 33


@pytest.mark.parametrize("run", RUNS, ids=lambda run: f"{run.parent.name}/{run.name}")
def test_best_pt_is_the_first_epoch_of_the_best_validation_accuracy(run: Path) -> None:
    """smso-train replaces best.pt only on a strictly higher validation accuracy
    (training/train.py: ``val.accuracy > run.best_accuracy``), so of tied epochs the first is
    kept; test.json names the epoch best.pt holds and its test accuracy."""
    accuracies = val_accuracies(run)
    best = max(accuracies)
    test, result = record(run, "test.json"), record(run, "result.json")
    assert test["epoch"] == 1 + accuracies.index(best)
    assert result["best_val_accuracy"] == best
    assert test["test_images"] == 10_000
    assert result["test_accuracy"] == test["test_accuracy"] == confusion_accuracy(run)


def test_the_tie_rule_matters_for_some_records() -> None:
    """The check above would pass with "the last of tied epochs" were no epochs tied."""
    tied = [run for run in RUNS if val_accuracies(run).count(max(val_accuracies(run))) > 1]
    assert len(tied) >= 1


def test_the_published_tables_are_the_report_of_the_records() -> None:
    """`smso-experiment report fmnist --out docs/results/records/fmnist-table` renders the page's
    table, its notes and the paired comparisons line for line, and the page has no other row."""
    page = PAGE.read_text()
    rendered = report("fmnist", RECORDS)
    lines = set(page.splitlines())
    missing = [line for line in rendered.splitlines() if line.strip() and line not in lines]
    assert missing == []
    for header in ("| model | dataset |", "| model | reference |"):
        assert published_table(page, header) == published_table(rendered, header)


def percent(values: list[float]) -> str:
    return f"{100 * statistics.mean(values):.2f} ± {100 * statistics.stdev(values):.2f}"


def paired(a: list[float], b: list[float]) -> tuple[str, float, float]:
    """``+0.42 [-0.10, +0.94]``, the mean of a - b in points and scipy's paired t interval, and
    the interval's ends."""
    interval = stats.ttest_rel(np.multiply(a, 100), np.multiply(b, 100)).confidence_interval(0.95)
    low, high = float(interval.low), float(interval.high)
    mean = 100 * float(np.mean(np.subtract(a, b)))
    return f"{mean:+.2f} [{low:+.2f}, {high:+.2f}]", low, high


Pair = tuple[list[float], list[float]]


def verdict_cells(
    labels: tuple[str, str], dims: tuple[int, int], val: Pair, test: Pair
) -> list[str]:
    """A verdict line's cells, a row against its reference over 3 seeds: the labels, the
    dimensions, the paired validation and test differences, the seeds ahead on test and the
    verdict by the page's rule (higher / lower where the test interval excludes 0, else "not
    lower by more than 0.5" where its lower end is above -0.5 points, else inconclusive)."""
    val_delta, _, _ = paired(*val)
    test_delta, low, high = paired(*test)
    if low > 0:
        verdict = "higher"
    elif high < 0:
        verdict = "lower"
    elif low > -0.5:
        verdict = "not lower by more than 0.5"
    else:
        verdict = "inconclusive"
    ahead = sum(a > b for a, b in zip(*test, strict=True))
    cells = [*labels, "fashion_mnist", "3", f"{dims[0]:,} vs {dims[1]:,}", val_delta, test_delta]
    return [*cells, f"{ahead} of 3", verdict]


def test_the_published_rows_and_verdicts_recomputed_from_the_records() -> None:
    """Independently of the report: mean ± sample standard deviation over the seeds of the best
    validation accuracy (metrics.jsonl) and of the test accuracy (test.json's confusion
    matrix); each SMSO row against GAP and BP, paired by seed, with scipy's interval and the
    verdict rule the page states (higher / lower where the interval excludes 0, else "not lower
    by more than 0.5" where its lower end is above -0.5 points, else inconclusive)."""
    page = PAGE.read_text()
    runs = runs_by_row()
    val = {row: [max(val_accuracies(run)) for run in seeds] for row, seeds in runs.items()}
    test = {row: [confusion_accuracy(run) for run in seeds] for row, seeds in runs.items()}
    label = {row: record(seeds[0], "result.json")["label"] for row, seeds in runs.items()}
    dims = {row: record(seeds[0], "result.json")["feature_dim"] for row, seeds in runs.items()}

    table = published_table(page, "| model | dataset |")
    assert set(table) == {(label[row],) for row in runs}
    for row, seeds in runs.items():
        results = [record(run, "result.json") for run in seeds]
        assert {(r["feature_dim"], r["head_parameters"]) for r in results} == {
            (dims[row], results[0]["head_parameters"])
        }
        expected = [label[row], "fashion_mnist", "3", f"{dims[row]:,}"]
        expected += [f"{results[0]['head_parameters']:,}", percent(val[row]), percent(test[row])]
        assert table[(label[row],)][:7] == expected

    verdicts = published_table(page, "| model | reference |")
    smso = [row for row in runs if row.startswith("smso")]
    assert set(verdicts) == {(label[r], label[ref]) for r in smso for ref in ("first-order", "bp")}
    for row in smso:
        for reference in ("first-order", "bp"):
            expected = verdict_cells(
                (label[row], label[reference]),
                (dims[row], dims[reference]),
                (val[row], val[reference]),
                (test[row], test[reference]),
            )
            assert verdicts[(label[row], label[reference])] == expected


def test_the_shipped_recipes_row_is_the_one_thread_runs_the_page_names() -> None:
    """The page says the SMSO p = 64 row's runs reach the one-thread runs' best validation and
    test accuracy, seed by seed."""
    page = re.sub(r"\s+", " ", PAGE.read_text())
    quoted = re.search(r"runs of the recipe's choice below \(([^)]*) %\)", page)
    assert quoted is not None
    runs = runs_by_row()["smso-64"]
    measured = [
        f"{100 * max(val_accuracies(r)):.2f}/{100 * confusion_accuracy(r):.2f}" for r in runs
    ]
    assert quoted.group(1).split(", ") == measured
