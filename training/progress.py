"""Progress of a loop over batches: a tqdm bar on a terminal, a plain line every so often when
the output is a file or a pipe (no carriage returns or escape codes piling up in a log)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator, Sized
from typing import Any, Generic, Protocol, TypeVar

from tqdm import tqdm

__all__ = ["LINE_INTERVAL", "LineProgress", "Progress", "progress"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
log = logging.getLogger(__name__)

#: Seconds between two progress lines when the output is not a terminal.
LINE_INTERVAL = 30.0


class Progress(Protocol[T_co]):
    """What the loops use of a progress display."""

    def __iter__(self) -> Iterator[T_co]: ...

    def set_postfix(self, **values: Any) -> None: ...


class LineProgress(Generic[T]):
    """Iterates over ``iterable``, logging ``description: i/n batches, key value`` at most every
    ``interval`` seconds (never for a loop shorter than that)."""

    def __init__(self, iterable: Iterable[T], description: str, interval: float = LINE_INTERVAL):
        self.iterable = iterable
        self.description = description
        self.interval = interval
        self.postfix: dict[str, Any] = {}

    def set_postfix(self, **values: Any) -> None:
        self.postfix = values

    def __iter__(self) -> Iterator[T]:
        total = len(self.iterable) if isinstance(self.iterable, Sized) else "?"
        last = time.monotonic()
        for done, item in enumerate(self.iterable, 1):
            yield item
            now = time.monotonic()
            if now - last >= self.interval:
                last = now
                extra = "".join(f", {k} {v}" for k, v in self.postfix.items())
                log.info("%s: %d/%s batches%s", self.description, done, total, extra)


def progress(iterable: Iterable[T], description: str, enabled: bool = True) -> Progress[T]:
    """A tqdm bar when stderr is a terminal, else a ``LineProgress``; silent when not
    ``enabled`` (the processes other than the first under torchrun)."""
    if enabled and sys.stderr.isatty():
        return tqdm(iterable, desc=description, leave=False, unit="batch")
    return LineProgress(iterable, description, LINE_INTERVAL if enabled else float("inf"))
