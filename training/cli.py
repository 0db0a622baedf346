"""What the console scripts share: a user's mistake is one error line and exit status 2."""

from __future__ import annotations

import sys
from collections.abc import Callable

from training.backbones import PretrainedWeightsError
from training.checkpoint import CheckpointError
from training.datasets import DatasetLayoutError

__all__ = ["USER_ERRORS", "run_cli"]

#: Errors caused by what the user gave (settings, files, datasets, weights), not by a bug.
#: ConfigError, UnknownHeadError and UnknownBackboneError are ValueErrors.
USER_ERRORS: tuple[type[Exception], ...] = (
    ValueError, FileNotFoundError, DatasetLayoutError, CheckpointError, PretrainedWeightsError,
)  # fmt: skip


def run_cli(prog: str, body: Callable[[], int]) -> int:
    """Run ``body``; on a user error print ``prog: error: message`` to stderr and return 2."""
    try:
        return body()
    except USER_ERRORS as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
