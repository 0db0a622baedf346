"""Watching the training loss for divergence: a warning when it grows several-fold, a stop when
it is no longer a finite number.

A loss that climbs far above its best, or turns NaN or infinite, almost always means that the
learning rate is too high for the data and batch size; both messages say so and name the lr.
"""

from __future__ import annotations

import math

__all__ = ["GROWTH_WARNING", "LOSS_FLOOR", "DivergenceError", "LossWatch"]

#: The training loss this many times its best so far draws a warning...
GROWTH_WARNING = 3.0
#: ...counting a best below this as this: 0.01 -> 0.05 near convergence is noise, not divergence.
LOSS_FLOOR = 0.1


class DivergenceError(RuntimeError):
    """The training loss became NaN or infinite; the message names the likely cause."""


class LossWatch:
    """Follows an epoch's mean training loss against the best seen so far.

    ``check(epoch, loss)`` raises ``DivergenceError`` for a non-finite loss and returns a
    warning (or None) when the loss is at least ``factor`` times its best (or ``LOSS_FLOOR``).
    """

    def __init__(self, lr: float, factor: float = GROWTH_WARNING) -> None:
        self.lr = lr
        self.factor = factor
        self.best: tuple[int, float] | None = None  # (epoch, loss)

    def _advice(self) -> str:
        return (
            f"the learning rate ({self.lr:g}) is likely too high for this data and batch size; "
            f"try a lower --lr, e.g. {self.lr / 5:g}"
        )

    def check(self, epoch: int, loss: float) -> str | None:
        if not math.isfinite(loss):
            raise DivergenceError(
                f"training diverged in epoch {epoch}: the training loss is {loss}; {self._advice()}"
            )
        if self.best is None or loss < self.best[1]:
            self.best = (epoch, loss)
            return None
        best_epoch, best = self.best
        if loss >= self.factor * max(best, LOSS_FLOOR):
            return (
                f"epoch {epoch}: the training loss {loss:.4g} is {loss / best:.0f}x its best "
                f"({best:.4g}, epoch {best_epoch}): {self._advice()}"
            )
        return None
