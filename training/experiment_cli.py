"""``smso-experiment``: the paper's tables as named rows (:mod:`training.experiments`: ``list``,
``run``, ``report``) and each head's fair recipe (:mod:`training.recipe_sweep`: ``choose``).

One console script over two modules, so that the sweep's choice, which reads the tables'
results, stays above them instead of being imported back by them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from training import experiments, recipe_sweep

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """``smso-experiment choose ...`` goes to :func:`training.recipe_sweep.main`, the rest to
    :func:`training.experiments.main`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["choose"]:
        return recipe_sweep.main(args[1:])
    return experiments.main(args)


if __name__ == "__main__":
    sys.exit(main())
