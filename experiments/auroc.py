"""AUROCs of several scores on the same images, and DeLong's test of their differences.

For ``m`` positive (out-of-distribution) and ``n`` negative (in-distribution) images and a score
that is higher for positives, ``AUROC = (1 / mn) sum_i sum_j psi(x_i, y_j)`` with
``psi(x, y) = 1 if x > y, 1/2 if x = y, 0 otherwise`` (the Mann-Whitney statistic). DeLong,
DeLong and Clarke-Pearson (1988) estimate the covariance of the AUROCs of ``k`` scores measured
on the same images from the structural components

    V10_i = (1/n) sum_j psi(x_i, y_j)      (per positive, (k, m))
    V01_j = (1/m) sum_i psi(x_i, y_j)      (per negative, (k, n))
    S     = cov(V10) / m + cov(V01) / n    ((k, k))

computed with midranks in ``O((m + n) log(m + n))`` (Sun and Xu, 2014). The difference of two
AUROCs ``d = A_a - A_b`` has variance ``S_aa + S_bb - 2 S_ab``; its 95 % interval is
``d +- 1.96 sqrt(var)``. The test assumes the positives and the negatives are independent
samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Comparison", "compare", "delong"]

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile


def delong(positives: np.ndarray, negatives: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The AUROCs ``(k,)`` of ``k`` scores and their DeLong covariance ``(k, k)``, from their
    values on the positives ``(k, m)`` and the negatives ``(k, n)`` (higher = positive)."""
    from scipy.stats import rankdata

    x, y = np.atleast_2d(positives), np.atleast_2d(negatives)
    m, n = x.shape[1], y.shape[1]
    if m < 2 or n < 2:
        raise ValueError(f"DeLong's test needs at least 2 of each class, got {m} and {n}")
    together = rankdata(np.concatenate([x, y], axis=1), axis=1)  # (k, m + n) midranks
    within_x = rankdata(x, axis=1)  # (k, m)
    within_y = rankdata(y, axis=1)  # (k, n)
    v10 = (together[:, :m] - within_x) / n  # (k, m): share of negatives below each positive
    v01 = 1.0 - (together[:, m:] - within_y) / m  # (k, n): share of positives above each negative
    aurocs = v10.mean(axis=1)
    covariance = np.atleast_2d(np.cov(v10)) / m + np.atleast_2d(np.cov(v01)) / n
    return aurocs, covariance


@dataclass(frozen=True)
class Comparison:
    """Score ``a`` against score ``b`` on one set: ``d = AUROC_a - AUROC_b`` and its 95 %
    interval. ``verdict``: ``win`` (the interval above 0), ``loss`` (below) or ``tie``."""

    difference: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        return "win" if self.low > 0 else "loss" if self.high < 0 else "tie"

    def to_dict(self) -> dict[str, Any]:
        return {
            "difference": self.difference,
            "ci95": [self.low, self.high],
            "verdict": self.verdict,
        }


def compare(aurocs: np.ndarray, covariance: np.ndarray, a: int, b: int) -> Comparison:
    """Score ``a`` against score ``b`` (indices into :func:`delong`'s results)."""
    difference = float(aurocs[a] - aurocs[b])
    variance = float(covariance[a, a] + covariance[b, b] - 2 * covariance[a, b])
    half = Z95 * float(np.sqrt(max(variance, 0.0)))
    return Comparison(difference, difference - half, difference + half)
