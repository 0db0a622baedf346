"""A progress line while a job runs: images written, images/s, the time left, each stage's time.

Counted where it cannot be wrong: the images in parts renamed into OUT
(:attr:`batch.parts.PartCollector.written`), read every ``interval_s``, with the stages' busy
seconds so far (:class:`batch.stages.StageTimes`). On a terminal the line is redrawn in place;
in a log (stderr not a terminal) a line is printed every ``log_interval_s``.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import Protocol, TextIO

from batch.stages import STAGES, StageTimes

__all__ = ["Progress", "format_duration", "format_rate"]


def format_duration(seconds: float) -> str:
    """``1:02:03``, ``2:03`` or ``45 s``."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    if minutes:
        return f"{minutes}:{secs:02d}"
    return f"{secs} s"


def format_rate(per_s: float) -> str:
    """``1,234``, ``12.3`` or ``0.38``: at least two significant digits, so that a job of a few
    images does not read as 0 images/s."""
    if per_s >= 100:
        return f"{per_s:,.0f}"
    if per_s >= 1:
        return f"{per_s:.1f}"
    return f"{per_s:.2g}"


class Written(Protocol):
    """What the line reads: :class:`batch.parts.PartCollector`."""

    written: int

    def times(self) -> StageTimes: ...


class Progress:
    """A thread reporting the images written of ``total``, until the ``with`` ends."""

    def __init__(
        self,
        total: int,
        source: Written,
        stream: TextIO | None = None,
        interval_s: float = 1.0,
        log_interval_s: float = 30.0,
    ) -> None:
        self.total, self.source = total, source
        self.stream = stream or sys.stderr
        self.interval_s, self.log_interval_s = interval_s, log_interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="smso-embed-progress", daemon=True)
        self._start = time.perf_counter()
        self._tty = self.stream.isatty()

    def __enter__(self) -> Progress:
        self._start = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        if self._tty:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def line(
        self,
        done: int,
        elapsed: float,
        since: tuple[int, float] | None = None,
        times: StageTimes | None = None,
    ) -> str:
        """The line after ``elapsed`` seconds with ``done`` images written; the rate (and the
        time left) from ``since`` (images written, seconds) on: the first part written, so that
        the engine's start-up does not count against the images still to do; and each stage's
        busy seconds (``times``)."""
        share = done / self.total if self.total else 1.0
        head = f"smso-embed: {done:,} / {self.total:,} images ({share:.0%})"
        stages = ""
        if times is not None and any(times.busy(stage) for stage in STAGES):
            stages = "; " + ", ".join(f"{stage} {times.busy(stage):.1f} s" for stage in STAGES)
        first_done, first_s = since or (0, 0.0)
        if done <= first_done or elapsed <= first_s:
            text = f"{head}, starting ({format_duration(elapsed)})" if not done else head
            return text + stages
        rate = (done - first_done) / (elapsed - first_s)
        left = format_duration((self.total - done) / rate)
        return f"{head}, {format_rate(rate)} images/s, {left} left{stages}"

    def _run(self) -> None:
        last_logged = time.perf_counter()
        since: tuple[int, float] | None = None
        while not self._stop.wait(self.interval_s):
            done = self.source.written
            now = time.perf_counter()
            if since is None and done:
                since = (done, now - self._start)
            text = self.line(done, now - self._start, since, self.source.times())
            if self._tty:
                self.stream.write(f"\r\033[K{text}")
                self.stream.flush()
            elif now - last_logged >= self.log_interval_s:
                self.stream.write(text + "\n")
                self.stream.flush()
                last_logged = now
