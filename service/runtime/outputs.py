"""What a forward pass answers, by name: :class:`BackendOutputs`.

One type from the session to the routes: the runners (:mod:`service.runtime.runner`) fill it from
the graph's outputs of the same names, the session host sends it to its workers, the typicality
scoring (:func:`service.models.scoring.scored`) turns ``features`` into a score and adds its
``p_value``, the micro-batcher hands each image its rows, and the routes and the protocol read
the fields they answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["OUTPUT_NAMES", "BackendOutputs"]


@dataclass(frozen=True, kw_only=True)
class BackendOutputs:
    """The outputs of ``B`` images, each array with ``B`` rows (row ``b``: image ``b``).

    Every model answers ``logits`` and ``embedding``. For the typicality score a file offers one
    of two: the score itself (``typicality``, where ``export.typicality_graph`` put it in the
    graph) or the backbone's averaged ``features`` (the score is then computed in numpy:
    ``modelcard.typicality``). Once scored, ``typicality`` holds the score in float64,
    ``p_value`` its p-value, and ``features`` is gone; without a typicality reference, neither
    is there.
    """

    logits: np.ndarray  # (B, K) float32: one value per class of the card
    embedding: np.ndarray  # (B, p) float32: the SMSO embedding that /embed serves
    typicality: np.ndarray | None = None  # (B,) score, higher: less typical; None: no score
    features: np.ndarray | None = None  # (B, C_b) float32 averaged backbone features, or None
    p_value: np.ndarray | None = None  # (B,) float64 share of reference images as atypical

    def __post_init__(self) -> None:
        counts = {name: len(array) for name, array in self.named().items()}
        if len(set(counts.values())) > 1:
            shown = ", ".join(f"{name} {rows}" for name, rows in counts.items())
            raise ValueError(f"outputs of different numbers of rows: {shown}")

    def __len__(self) -> int:
        """``B``, the images answered."""
        return len(self.logits)

    def named(self) -> dict[str, np.ndarray]:
        """The outputs present, by name, in the order of :data:`OUTPUT_NAMES`."""
        arrays = {name: getattr(self, name) for name in OUTPUT_NAMES}
        return {name: array for name, array in arrays.items() if array is not None}

    @classmethod
    def from_named(cls, arrays: Mapping[str, np.ndarray]) -> BackendOutputs:
        """The outputs of a graph by their names (``logits``, ``embedding``, then
        ``typicality`` or ``features``); a ValueError naming any other."""
        unknown = [name for name in arrays if name not in OUTPUT_NAMES]
        if unknown:
            raise ValueError(f"unknown outputs {unknown}; known: {', '.join(OUTPUT_NAMES)}")
        return cls(**arrays)

    def map(self, change: Callable[[np.ndarray], np.ndarray]) -> BackendOutputs:
        """``change`` applied to every output present (a slice of rows, a copy)."""
        return dataclasses.replace(
            self, **{name: change(array) for name, array in self.named().items()}
        )

    def rows(self, start: int, stop: int) -> BackendOutputs:
        """Rows ``start`` to ``stop`` (excluded) of every output: views, not copies."""
        return self.map(lambda array: array[start:stop])

    def split(self) -> list[BackendOutputs]:
        """Each row of every output as outputs of their own (views): ``B`` outputs of one row.

        The batcher hands each image its row this way, in the inference thread. The rows of
        outputs whose numbers of rows agree (checked when these were made) agree too, so they
        are not checked again: 1 µs a row instead of 4.6 (a batch of 64, 2 CPU cores)."""
        arrays = {name: getattr(self, name) for name in OUTPUT_NAMES}
        rows = []
        for n in range(len(self)):
            row = object.__new__(BackendOutputs)
            row.__dict__.update(
                {name: None if a is None else a[n : n + 1] for name, a in arrays.items()}
            )
            rows.append(row)
        return rows

    @classmethod
    def concatenate(cls, parts: Sequence[BackendOutputs]) -> BackendOutputs:
        """The rows of ``parts`` one after another (each with the same outputs present)."""
        if not parts:
            raise ValueError("no outputs to concatenate")
        named = [part.named() for part in parts]
        for arrays in named[1:]:
            if list(arrays) != list(named[0]):
                raise ValueError(f"outputs {list(arrays)} cannot follow {list(named[0])}")
        joined = {name: np.concatenate([arrays[name] for arrays in named]) for name in named[0]}
        return cls(**joined)


#: Every output a :class:`BackendOutputs` may hold, in the order the fields are declared.
OUTPUT_NAMES = tuple(field.name for field in dataclasses.fields(BackendOutputs))
