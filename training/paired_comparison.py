"""Head against head, paired by seed: the mean accuracy difference and its confidence interval.

Two rows of a table trained with the same seed share their validation images (the seed draws
them) and their backbone's initial weights, so the fair comparison of row A with row B is the
per-seed difference ``d_s = acc_A(s) - acc_B(s)``, not two independent means. Over the ``n``
seeds both rows have,

    mean = (1/n) sum_s d_s,    se = stdev(d) / sqrt(n),
    95 % interval = mean +- t_{0.975, n-1} * se        (Student's t, as a paired t-test)

the interval ``scipy.stats.ttest_rel`` gives. The verdict, by a rule fixed before any grid
result was in:

- "higher" when the interval lies above 0, "lower" when it lies below;
- else "not lower by more than 0.5" (points) when its lower end is above ``-MARGIN``: the
  claim "at least as accurate" within a stated margin (a non-inferiority test at 2.5 %);
- else "inconclusive": the seeds cannot tell.

With 3 seeds the t quantile is 4.30, so the interval is +-2.5 standard deviations of the
differences wide: only consistent differences are called. The interval covers the spread over
seeds on one test set, not the sampling error of that set's images, and a table of several
comparisons makes no correction for their number.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats

__all__ = [
    "MARGIN",
    "REFERENCE_ROWS",
    "PairedDifference",
    "comparison_section",
    "paired_difference",
]

#: The rows the paper's claim compares SMSO with: "at least as accurate as first-order and BP,
#: with far fewer dimensions".
REFERENCE_ROWS = ("first-order", "bp")
#: The non-inferiority margin, as a fraction of accuracy: 0.5 points.
MARGIN = 0.005


@dataclass(frozen=True)
class PairedDifference:
    """``a - b`` over paired values, in the units of the values."""

    n: int  # pairs
    mean: float  # mean difference
    low: float  # lower end of the confidence interval (nan for fewer than 2 pairs)
    high: float  # upper end (nan for fewer than 2 pairs)
    ahead: int  # pairs where a > b

    @property
    def verdict(self) -> str:
        """``"higher"``, ``"lower"``, ``"not lower by more than 0.5"`` or ``"inconclusive"``
        (see the module's docstring); ``"-"`` for fewer than 2 pairs."""
        if self.n < 2:
            return "-"
        if self.low > 0:
            return "higher"
        if self.high < 0:
            return "lower"
        if self.low > -MARGIN:
            return f"not lower by more than {100 * MARGIN:g}"
        return "inconclusive"


def paired_difference(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95
) -> PairedDifference:
    """The mean of ``a[i] - b[i]`` with its Student's t ``confidence`` interval."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need as many values in a as in b, at least one: {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    n, mean = len(diffs), statistics.fmean(diffs)
    ahead = sum(d > 0 for d in diffs)
    if n < 2:
        return PairedDifference(n, mean, math.nan, math.nan, ahead)
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * statistics.stdev(diffs) / math.sqrt(n)
    return PairedDifference(n, mean, mean - half, mean + half, ahead)


def _points(d: PairedDifference) -> str:
    """``+0.42 [-0.10, +0.94]`` in percentage points (the interval left out for one pair)."""
    if d.n < 2:
        return f"{100 * d.mean:+.2f}"
    return f"{100 * d.mean:+.2f} [{100 * d.low:+.2f}, {100 * d.high:+.2f}]"


def comparison_section(
    runs: dict[tuple[str, str], list[dict[str, Any]]],
    row_order: Sequence[str],
    references: Sequence[str] = REFERENCE_ROWS,
) -> list[str]:
    """Markdown lines comparing every SMSO row with the ``references`` rows (by default
    first-order and BP) of the same dataset, paired by seed; no lines when the table has no such
    pair.

    ``runs`` maps ``(row, dataset)`` to result records (each with ``seed``, ``label``,
    ``feature_dim``, ``best_val_accuracy``, ``test_accuracy``); ``row_order`` gives the rows
    in table order.
    """
    lines = []
    datasets = sorted({dataset for _, dataset in runs})
    for dataset in datasets:
        for name in row_order:
            if not name.startswith("smso") or (name, dataset) not in runs:
                continue
            for reference in references:
                if (reference, dataset) in runs:
                    line = _compare(runs[(name, dataset)], runs[(reference, dataset)], dataset)
                    lines += [line] if line else []
    if not lines:
        return []
    header = [
        "",
        "Paired by seed (each seed's two runs share validation images and initial backbone "
        "weights): the row's accuracy minus the reference's, in points, mean over the seeds both "
        "have a test result for [95 % Student's t interval]. `verdict` on test: higher or lower "
        f"where the interval excludes 0; else 'not lower by more than {100 * MARGIN:g}' where "
        f"its lower end is above -{100 * MARGIN:g} (the margin fixed before the results); else "
        "inconclusive. The interval covers the spread over seeds on this one test set, not the "
        "sampling error of its images; the comparisons are not corrected for their number; "
        "3 of 3 seeds ahead happens by chance 1 time in 8.",
        "",
        "| model | reference | dataset | seeds | dims | val Δ | test Δ | seeds ahead on test "
        "| verdict on test |",
        "|---|---|---|--:|--:|--:|--:|--:|---|",
    ]
    return header + lines


def _compare(rows: list[dict[str, Any]], references: list[dict[str, Any]], dataset: str) -> str:
    """One table line: ``rows`` against ``references`` over the seeds both have ('' if none)."""
    by_seed = {r.get("seed", 0): r for r in references}
    pairs = [
        (r, by_seed[seed])
        for r in rows
        if (seed := r.get("seed", 0)) in by_seed
        and r["test_accuracy"] is not None
        and by_seed[seed]["test_accuracy"] is not None
    ]
    if not pairs:
        return ""
    val = paired_difference(
        [r["best_val_accuracy"] for r, _ in pairs], [q["best_val_accuracy"] for _, q in pairs]
    )
    test = paired_difference(
        [r["test_accuracy"] for r, _ in pairs], [q["test_accuracy"] for _, q in pairs]
    )
    row, reference = pairs[0]
    dims = f"{row['feature_dim']:,} vs {reference['feature_dim']:,}"
    cells = [row["label"], reference["label"], dataset, str(len(pairs)), dims]
    cells += [_points(val), _points(test), f"{test.ahead} of {test.n}", test.verdict]
    return "| " + " | ".join(cells) + " |"
