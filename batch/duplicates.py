"""Near-duplicate pairs of a collection (``smso-index --duplicates THRESHOLD``).

Every item is looked up in the gallery (its ``k`` nearest others); each pair at ``THRESHOLD``
similarity or above is kept once, the two paths in sorted order, and the pairs are written as
one Parquet file, most similar first::

    path_a: string, path_b: string, similarity: float32

With an HNSW gallery a pair can be missed where the graph misses a neighbour (its recall is in
docs/search.md); an exact gallery finds every pair among each item's ``k`` nearest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gallery.search import Gallery

__all__ = ["DUPLICATES_SCHEMA", "DuplicateSummary", "find_duplicates"]

DUPLICATES_SCHEMA = pa.schema(
    [("path_a", pa.string()), ("path_b", pa.string()), ("similarity", pa.float32())]
)
BLOCK = 4_096  # queries per search call


@dataclass(frozen=True)
class DuplicateSummary:
    pairs: int
    threshold: float
    neighbours: int
    path: str


def find_duplicates(
    gallery: Gallery,
    paths: Sequence[str],
    embeddings: np.ndarray,
    threshold: float,
    target: Path,
    neighbours: int = 10,
    threads: int = 0,
) -> DuplicateSummary:
    """The pairs among the gallery's items (``paths``, with their ``embeddings`` ``(N, p)``)
    at ``threshold`` or above, written to ``target``."""
    pairs: dict[tuple[int, int], float] = {}
    row_of = {path: row for row, path in enumerate(gallery.items.paths())}
    for start in range(0, len(embeddings), BLOCK):
        block = embeddings[start : start + BLOCK]
        rows, similarities, counts = gallery.nearest(block, neighbours + 1, threads=threads)
        for q in range(len(block)):
            me = row_of[paths[start + q]]
            for j in range(int(counts[q])):
                similarity = float(similarities[q, j])
                if similarity < threshold:
                    break
                other = int(rows[q, j])
                if other != me:
                    pair = (min(me, other), max(me, other))
                    pairs[pair] = max(similarity, pairs.get(pair, -2.0))
    ordered = sorted(pairs.items(), key=lambda item: -item[1])
    a, b = [], []
    for (first, second), _ in ordered:
        x, y = sorted((gallery.items.path(first), gallery.items.path(second)))
        a.append(x)
        b.append(y)
    table = pa.table(
        {
            "path_a": pa.array(a, pa.string()),
            "path_b": pa.array(b, pa.string()),
            "similarity": pa.array([s for _, s in ordered], pa.float32()),
        },
        schema=DUPLICATES_SCHEMA,
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.tmp")
    pq.write_table(table, temporary)
    temporary.replace(target)
    return DuplicateSummary(len(ordered), threshold, neighbours, str(target))
