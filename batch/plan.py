"""What a run must do: INPUT as it is now against what OUT holds.

Every image of INPUT falls in one of these, and OUT ends with exactly one row per image of
INPUT:

* **new**: in INPUT, not in OUT: embedded;
* **changed**: in OUT from a version of the file whose size or modification time differs
  from the file's now (the rule of ``rsync`` and ``make``; a file rewritten with the same size
  and time is not seen): its row is taken out and the file embedded again. An error row of a
  file that could not be read, and can be now, counts as changed;
* **retried** (``--retry-errors``): in OUT's errors table: taken out and embedded again (a
  file fixed since, a filesystem that failed for a while);
* **unchanged**: kept as it is, not read.

And each row of OUT whose image is no longer in INPUT is **deleted**. Rows are taken out of
their parts by :func:`batch.parts.rewrite_part` (a part's other rows are kept, not embedded
again), before the run embeds anything.
"""

from __future__ import annotations

import os
import stat
from collections import defaultdict
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from batch.decoding import UNKNOWN
from batch.inputs import Location
from batch.outputs import ERRORS, Scan

__all__ = ["FileState", "Plan", "file_states", "plan"]


@dataclass(frozen=True)
class FileState:
    """A file's size and modification time, nanoseconds (:data:`UNKNOWN` where it could not be
    read)."""

    size: int
    mtime_ns: int


def file_states(location: Location, uris: list[str]) -> dict[str, FileState]:
    """The state now of each of ``uris`` on ``location``'s filesystem (a local file by
    ``os.stat``, following links as reading it does; a remote one by one listing call)."""
    states: dict[str, FileState] = {}
    if not uris:
        return states
    if not location.scheme:
        for uri in uris:
            try:
                status = os.stat(location.path_of(uri))
            except OSError:
                states[uri] = FileState(UNKNOWN, UNKNOWN)
                continue
            if not stat.S_ISREG(status.st_mode):  # a FIFO, a folder: never read (batch.walk)
                states[uri] = FileState(UNKNOWN, UNKNOWN)
                continue
            states[uri] = FileState(status.st_size, status.st_mtime_ns)
        return states
    infos = location.filesystem.get_file_info([location.path_of(uri) for uri in uris])
    for uri, info in zip(uris, infos, strict=True):
        if info.type != pafs.FileType.File:
            states[uri] = FileState(UNKNOWN, UNKNOWN)
        else:
            mtime = info.mtime_ns if info.mtime_ns is not None else UNKNOWN
            states[uri] = FileState(info.size if info.size is not None else UNKNOWN, mtime)
    return states


@dataclass(frozen=True)
class Plan:
    """The run's work: what to embed, and which rows to take out of which parts first."""

    todo: list[str]  # sorted: new, changed and retried images
    new: int
    changed: int
    retried: int
    deleted: int
    unchanged: int
    drop: dict[str, frozenset[str]] = field(default_factory=dict)  # part path -> paths

    @property
    def taken_out(self) -> int:
        """Rows of OUT taken out: changed, retried and deleted images."""
        return sum(len(paths) for paths in self.drop.values())


def _changed(held_size: int, held_mtime: int, now: FileState, is_error: bool) -> bool:
    if held_size == UNKNOWN:  # not read then (or OUT from format /2): readable now?
        return is_error and now.size != UNKNOWN
    return (held_size, held_mtime) != (now.size, now.mtime_ns)


def plan(uris: list[str], scan: Scan, location: Location, retry_errors: bool = False) -> Plan:
    """What a run over ``uris`` (INPUT now, sorted) does, given what OUT holds (``scan``)."""
    current = set(uris)
    in_out = [uri for uri in uris if uri in scan.held]
    states = file_states(location, in_out)
    drop: dict[str, set[str]] = defaultdict(set)
    todo: list[str] = []
    changed = retried = 0
    for uri in uris:
        held = scan.held.get(uri)
        if held is None:
            todo.append(uri)
            continue
        is_error = held.table == ERRORS
        if _changed(held.size, held.mtime_ns, states[uri], is_error):
            changed += 1
        elif retry_errors and is_error:
            retried += 1
        else:
            continue
        drop[held.part].add(uri)
        todo.append(uri)
    deleted = 0
    for uri, held in scan.held.items():
        if uri not in current:
            drop[held.part].add(uri)
            deleted += 1
    return Plan(
        todo=todo,
        new=len(todo) - changed - retried,
        changed=changed,
        retried=retried,
        deleted=deleted,
        unchanged=len(in_out) - changed - retried,
        drop={part: frozenset(paths) for part, paths in drop.items()},
    )
