"""A progress line while a job runs: images written, images/s and the time left.

Counted where it cannot be wrong: the parts renamed into OUT (their footers' row counts, each
part read once), polled every ``interval_s``. On a terminal the line is redrawn in place; in a
log (stderr not a terminal) a line is printed every ``log_interval_s``.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from batch.inputs import Location
from batch.outputs import EMBEDDINGS, ERRORS

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


class Progress:
    """A thread reporting the images written to ``out`` of ``total``, until the ``with`` ends."""

    def __init__(
        self,
        out: Location,
        total: int,
        stream: TextIO | None = None,
        interval_s: float = 1.0,
        log_interval_s: float = 30.0,
    ) -> None:
        self.out, self.total = out, total
        self.stream = stream or sys.stderr
        self.interval_s, self.log_interval_s = interval_s, log_interval_s
        self.seen: dict[str, int] = {}  # part path -> rows
        self.done = 0
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

    def poll(self) -> int:
        """The images written so far (parts read once each)."""
        for table in (EMBEDDINGS, ERRORS):
            selector = pafs.FileSelector(f"{self.out.path}/{table}", allow_not_found=True)
            try:
                infos = self.out.filesystem.get_file_info(selector)
            except OSError:
                continue
            for info in infos:
                name = info.base_name
                if info.path in self.seen or name.startswith(".") or not name.endswith(".parquet"):
                    continue
                try:
                    rows = pq.read_metadata(info.path, filesystem=self.out.filesystem).num_rows
                except OSError:
                    continue
                self.seen[info.path] = rows
                self.done += rows
        return self.done

    def line(self, done: int, elapsed: float, since: tuple[int, float] | None = None) -> str:
        """The line after ``elapsed`` seconds with ``done`` images written; the rate (and the
        time left) from ``since`` (images written, seconds) on: the first part written, so that
        Ray's start-up does not count against the images still to do."""
        share = done / self.total if self.total else 1.0
        head = f"smso-embed: {done:,} / {self.total:,} images ({share:.0%})"
        first_done, first_s = since or (0, 0.0)
        if done <= first_done or elapsed <= first_s:
            return f"{head}, starting ({format_duration(elapsed)})" if not done else head
        rate = (done - first_done) / (elapsed - first_s)
        left = format_duration((self.total - done) / rate)
        return f"{head}, {format_rate(rate)} images/s, {left} left"

    def _run(self) -> None:
        last_logged = time.perf_counter()
        since: tuple[int, float] | None = None
        while not self._stop.wait(self.interval_s):
            done = self.poll()
            now = time.perf_counter()
            if since is None and done:
                since = (done, now - self._start)
            text = self.line(done, now - self._start, since)
            if self._tty:
                self.stream.write(f"\r\033[K{text}")
                self.stream.flush()
            elif now - last_logged >= self.log_interval_s:
                self.stream.write(text + "\n")
                self.stream.flush()
                last_logged = now
