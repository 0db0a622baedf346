"""Retrieval's measures: how good the neighbours are, and how many of the exact ones a graph finds.

For ``Q`` queries each with the rows of its ``k`` nearest gallery items, best first:

* ``precision@k``: the share of the ``k`` neighbours whose label is the query's, averaged over
  the queries;
* ``mAP@k``: the mean over the queries of ``AP@k = sum_i P@i rel_i / sum_i rel_i`` (``i`` up to
  ``k``, ``rel_i`` 1 where neighbour ``i`` has the query's label; 0 where none has), the hashing
  literature's mAP@k;
* ``recall@k`` of an approximate search: the share of the exact ``k`` nearest that it found,
  ``|A_q & E_q| / k`` averaged over the queries.
"""

from __future__ import annotations

import numpy as np

__all__ = ["average_precision", "precision", "recall", "self_found"]


def _relevant(rows: np.ndarray, gallery_labels: np.ndarray, query_labels: np.ndarray) -> np.ndarray:
    """``(Q, k)`` bools: neighbour ``i`` of query ``q`` has the query's label."""
    return gallery_labels[rows] == np.asarray(query_labels)[:, None]


def precision(rows: np.ndarray, gallery_labels: np.ndarray, query_labels: np.ndarray) -> float:
    """precision@k of neighbours ``rows`` ``(Q, k)``."""
    return float(_relevant(rows, gallery_labels, query_labels).mean())


def average_precision(
    rows: np.ndarray, gallery_labels: np.ndarray, query_labels: np.ndarray
) -> float:
    """mAP@k of neighbours ``rows`` ``(Q, k)``."""
    rel = _relevant(rows, gallery_labels, query_labels).astype(np.float64)
    hits = np.cumsum(rel, axis=1)
    at_i = hits / np.arange(1, rel.shape[1] + 1)  # P@i
    found = rel.sum(axis=1)
    ap = np.divide((at_i * rel).sum(axis=1), found, out=np.zeros(len(rel)), where=found > 0)
    return float(ap.mean())


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    """recall@k of ``found`` ``(Q, k)`` against the ``exact`` ``(Q, k)`` nearest (rows or keys;
    a padding value that is in no exact row counts as a miss)."""
    k = exact.shape[1]
    hits = sum(len(np.intersect1d(a, e)) for a, e in zip(found[:, :k], exact, strict=True))
    return hits / exact.size


def self_found(rows: np.ndarray, similarities: np.ndarray, own: np.ndarray, floor: float) -> float:
    """The share of queries that are gallery items (row ``own[q]``) whose first neighbour is
    themselves, at similarity ``floor`` or above."""
    return float(((rows[:, 0] == own) & (similarities[:, 0] >= floor)).mean())
