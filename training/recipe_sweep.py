"""A fair recipe for each head: the sweep's choice on validation, then the full runs compared.

The head comparison on Fashion-MNIST (``smso-experiment run fmnist``) trains every head with
one recipe, tuned for SMSO p = 64. The fair version gives each compared head
(:data:`~training.experiments.SWEEP_HEADS`) the same small grid, ``fmnist-sweep`` (lr x weight
decay, 18 epochs, seed 0, no test pass), and keeps, per head, the point with the best
validation accuracy:

    choice(head) = argmax_{(lr, wd) in grid} val_acc(head, lr, wd)

ties going to the first point in grid order (lr, then weight decay, ascending). Each head's
choice is then trained for the full schedule on seeds 0-2 (``fmnist-fair``, the same rows at
45 epochs with the test pass); where the choice is the shipped recipe, the runs of the
``fmnist`` table are those runs and are reused. The fair table pairs SMSO p = 64 by seed with
first-order, BP and MPN (:data:`FAIR_REFERENCES`), as the ``fmnist`` table pairs each SMSO row
with first-order and BP (:mod:`training.paired_comparison`).

``smso-experiment choose --sweep DIR``: the sweep's grid and the choices;
``--to-run``: the ``fmnist-fair`` rows still to train (those not the shipped recipe);
``--fair DIR [--records DIR]``: the fair table, its paired verdicts and its training time.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.cli import run_cli
from training.config import ConfigError
from training.experiments import (
    FMNIST_RECIPE,
    SWEEP_HEADS,
    SWEEP_LRS,
    SWEEP_WEIGHT_DECAYS,
    TABLES,
    find_row,
    percent,
    results,
    sweep_row_name,
    total_time,
)
from training.paired_comparison import REFERENCE_ROWS, comparison_section

__all__ = ["Choice", "choices", "fair_report", "main", "rows_to_run", "sweep_report"]

SWEEP, FAIR = "fmnist-sweep", "fmnist-fair"
#: What SMSO p = 64 is paired with in the fair table: the paper's first-order and BP, and MPN,
#: the best head of the table with one recipe.
FAIR_REFERENCES = (*REFERENCE_ROWS, "mpn")
DATASET = str(FMNIST_RECIPE["dataset"])


@dataclass(frozen=True)
class Choice:
    """One head's chosen point of the grid."""

    head: str
    lr: float
    weight_decay: float
    val_accuracy: float

    @property
    def row(self) -> str:
        """Its row name, the same in ``fmnist-sweep`` and ``fmnist-fair``."""
        return sweep_row_name(self.head, self.lr, self.weight_decay)

    @property
    def shipped(self) -> bool:
        """Whether it is the shipped recipe (whose 45-epoch runs the ``fmnist`` table holds)."""
        return (self.lr, self.weight_decay) == (FMNIST_RECIPE["lr"], FMNIST_RECIPE["weight_decay"])


def _grid() -> list[tuple[float, float]]:
    return [(lr, wd) for lr in SWEEP_LRS for wd in SWEEP_WEIGHT_DECAYS]


def _sweep_accuracies(sweep: Path) -> dict[str, dict[tuple[float, float], dict[str, Any]]]:
    """head -> (lr, wd) -> the sweep's seed-0 result, for the points that have finished."""
    if not (sweep / "results.jsonl").is_file() and not any(sweep.glob("*/seed*/result.json")):
        return {}  # nothing finished yet (or no such folder)
    found = results(SWEEP, sweep)
    by_head: dict[str, dict[tuple[float, float], dict[str, Any]]] = {}
    for head in SWEEP_HEADS:
        for lr, wd in _grid():
            record = found.get((sweep_row_name(head, lr, wd), DATASET, 0))
            if record is not None:
                by_head.setdefault(head, {})[(lr, wd)] = record
    return by_head


def choices(sweep: Path) -> tuple[dict[str, Choice], list[str]]:
    """Each head's choice, for the heads whose whole grid has finished under ``sweep``; and the
    heads not finished yet, with how many points they have."""
    chosen, waiting = {}, []
    grid = _grid()
    for head, points in _sweep_accuracies(sweep).items():
        if len(points) < len(grid):
            waiting.append(f"{head} ({len(points)} of {len(grid)} points)")
            continue
        # max() keeps the first of equal values: ties go to grid order
        lr, wd = max(grid, key=lambda p: points[p]["best_val_accuracy"])
        chosen[head] = Choice(head, lr, wd, points[(lr, wd)]["best_val_accuracy"])
    waiting += [f"{h} (0 of {len(grid)} points)" for h in SWEEP_HEADS if h not in chosen and not
                any(w.startswith(f"{h} ") for w in waiting)]  # fmt: skip
    return chosen, waiting


def rows_to_run(sweep: Path) -> list[str]:
    """The ``fmnist-fair`` rows to train: each chosen point that is not the shipped recipe."""
    chosen, _ = choices(sweep)
    return [c.row for c in chosen.values() if not c.shipped]


def sweep_report(sweep: Path) -> str:
    """The grid as markdown: per head and point, the best validation accuracy (the choice in
    bold), its epoch, and the sweep's training time."""
    points = _sweep_accuracies(sweep)
    chosen, waiting = choices(sweep)
    grid = _grid()
    names = ["head"] + [f"lr {lr:g}, wd {wd:g}" for lr, wd in grid] + ["chosen"]
    lines = ["| " + " | ".join(names) + " |", "|---|" + "--:|" * len(grid) + "---|"]
    for head in SWEEP_HEADS:
        cells = [find_row("fmnist", head).label]
        for point in grid:
            record = points.get(head, {}).get(point)
            value = "-" if record is None else f"{100 * record['best_val_accuracy']:.2f}"
            choice = chosen.get(head)
            bold = choice is not None and (choice.lr, choice.weight_decay) == point
            cells.append(f"**{value}**" if bold else value)
        choice = chosen.get(head)
        cells.append(
            "-"
            if choice is None
            else f"lr {choice.lr:g}, wd {choice.weight_decay:g}"
            + (" (the shipped recipe)" if choice.shipped else "")
        )
        lines.append("| " + " | ".join(cells) + " |")
    records = [r for head in points.values() for r in head.values()]
    notes = [
        "",
        f"Best validation accuracy (%) over {TABLES[SWEEP][0].settings['epochs']} epochs, "
        "seed 0, 5,000 validation images; no test pass. Per head, the highest is chosen (ties: "
        "the first in the grid's order).",
        "",
        total_time(records) if records else "No run has finished yet.",
    ]
    if waiting:
        notes += ["", f"Not finished: {', '.join(waiting)}."]
    return "\n".join(lines + notes)


def fair_report(sweep: Path, fair: Path, records: Path) -> str:
    """Each head with its chosen recipe, seeds 0-2 at the full schedule, and the paired verdicts:
    the runs under ``fair`` (``fmnist-fair``), or, for a choice that is the shipped recipe, the
    ``fmnist`` table's runs under ``records``; then the training time of the runs under
    ``fair`` (the reused runs are timed with their table)."""
    chosen, waiting = choices(sweep)
    if not chosen:
        raise ConfigError(f"no head's sweep has finished under {sweep}: nothing is chosen yet")
    fair_runs = results(FAIR, fair) if any(not c.shipped for c in chosen.values()) else {}
    table_runs = results("fmnist", records) if any(c.shipped for c in chosen.values()) else {}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for head, choice in chosen.items():
        found = table_runs if choice.shipped else fair_runs
        row = head if choice.shipped else choice.row
        seeds = sorted(s for (r, d, s) in found if r == row and d == DATASET)
        if seeds:
            runs[(head, DATASET)] = [found[(row, DATASET, s)] for s in seeds]
    names = ["head", "recipe (chosen on validation)", "seeds", "feature dim", "best val %"]
    names += ["test %", "runs from"]
    lines = ["| " + " | ".join(names) + " |", "|---|---|--:|--:|--:|--:|---|"]
    for head in SWEEP_HEADS:
        found_runs = runs.get((head, DATASET), [])
        if head not in chosen or not found_runs:
            continue
        choice = chosen[head]
        lines.append(
            "| "
            + " | ".join(
                [
                    find_row("fmnist", head).label,
                    f"lr {choice.lr:g}, wd {choice.weight_decay:g}",
                    str(len(found_runs)),
                    f"{found_runs[0]['feature_dim']:,}",
                    percent([r["best_val_accuracy"] for r in found_runs]),
                    percent([r["test_accuracy"] for r in found_runs if r["test_accuracy"]]),
                    "the fmnist table (shipped recipe)" if choice.shipped else FAIR,
                ]
            )
            + " |"
        )
    notes = comparison_section(runs, list(SWEEP_HEADS), FAIR_REFERENCES)
    trained = [r for h, c in chosen.items() if not c.shipped for r in runs.get((h, DATASET), [])]
    if trained:
        notes += ["", total_time(trained)]
    missing = [h for h in chosen if (h, DATASET) not in runs]
    if missing or waiting:
        notes += ["", f"Not in yet: {', '.join(missing + waiting)}."]
    return "\n".join(lines + notes)


def main(argv: Sequence[str] | None = None) -> int:
    """``smso-experiment choose``: the sweep's grid and choices, the rows to run, the fair
    table."""
    parser = argparse.ArgumentParser(
        prog="smso-experiment choose", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--sweep", type=Path, default=Path("runs/fmnist-sweep"))
    parser.add_argument(
        "--to-run", action="store_true", help="print only the fmnist-fair rows still to train"
    )
    parser.add_argument("--fair", type=Path, help="the fmnist-fair runs: print the fair table")
    parser.add_argument(
        "--records",
        type=Path,
        default=Path("docs/results/records/fmnist-table"),
        help="the fmnist table's runs (reused where a head's choice is the shipped recipe)",
    )
    args = parser.parse_args(argv)

    def body() -> int:
        if args.to_run:
            print(" ".join(rows_to_run(args.sweep)))
        elif args.fair is not None:
            print(fair_report(args.sweep, args.fair, args.records))
        else:
            print(sweep_report(args.sweep))
        return 0

    return run_cli("smso-experiment choose", body)
