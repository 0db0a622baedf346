"""Where the console scripts write: every output checked before any work, written atomically,
and a failure to write reported as one line that names the output.

Before any work, :func:`check_output_file` (a file: a checkpoint, an ONNX model, a report) and
:func:`check_writable` (a folder files go in: a run folder) raise :class:`OutputError` when the
output cannot be written there: a folder where a file goes, a file where a folder goes, the
input file itself, an existing file of another kind (a run's ``metrics.jsonl`` where a
checkpoint goes), or a folder this user cannot create files in (its permissions, a read-only
file system). :func:`write_atomically` writes to a hidden name beside the output and renames it
into place, so an interrupted or failed write leaves the old file as it was; an ``OSError``
while writing (no space left, say) becomes an :class:`OutputError` naming the output, never
the hidden file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "OutputError",
    "Replaceable",
    "check_output_file",
    "check_writable",
    "file_above",
    "write_atomically",
]


class OutputError(ValueError):
    """An output that cannot be written where it was asked for, or that would replace a file
    of another kind; the message names it and says what to do."""


@dataclass(frozen=True)
class Replaceable:
    """What a file already at an output must hold for the output to replace it: an earlier
    output of the same tool (an ONNX model, a checkpoint, a report), never a user's other file."""

    holds: Callable[[Path], bool]  # whether the file at the path holds it (reads the file)
    kind: str  # the file it must be, in words: "an ONNX model"
    instead: str = "give another file name"  # what to do otherwise


def file_above(path: Path) -> Path | None:
    """The nearest existing path above ``path`` when it is a file (no folder can be made
    there, so nothing can be written at ``path``), else ``None``."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def check_writable(folder: str | os.PathLike[str], what: str) -> None:
    """Raise :class:`OutputError` before any work when this user cannot create files in
    ``folder`` or, where it does not exist yet, in the nearest folder above it (where it would
    be made). ``what`` names the output in the message (``"the output runs/x/best.pt"``).

    The check creates and removes an empty hidden folder there: permissions, access control
    lists, read-only file systems and immutable folders all answer it as they answer a write.
    """
    existing = Path(folder)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():  # a file in the way: check_output_file and callers name it
        return
    try:
        probe = tempfile.mkdtemp(prefix=".smso-write-check-", dir=existing)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise OutputError(
            f"{what} cannot be written: this user cannot create files in the folder {existing} "
            f"({reason}); give a place you can write to"
        ) from error
    with contextlib.suppress(OSError):
        os.rmdir(probe)


def check_output_file(
    path: str | os.PathLike[str],
    what: str,
    keep: tuple[str | os.PathLike[str], ...] = (),
    replaces: Replaceable | None = None,
) -> None:
    """Raise :class:`OutputError` before any work when no file can be written at ``path``
    (``what`` names it, e.g. ``--json``): it is a folder, one of the folders it would go in is
    a file, it is one of ``keep`` (the input files a write there would replace), it exists and
    does not hold what ``replaces`` says the output may replace (any file, without it), or its
    folder is not writable (:func:`check_writable`). A device or pipe (``/dev/stdout``) is
    written as it is and not checked further."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{what} {path} is a folder: give a file name")
    blocking = file_above(path)
    if blocking is not None:
        raise OutputError(f"{what} {path} cannot be written: {blocking} is a file, not a folder")
    if path.exists() and not path.is_file():  # a device or a pipe: opened, never replaced
        return
    for other in keep:
        if path.exists() and Path(other).exists() and path.samefile(other):
            raise OutputError(
                f"{what} {path} is the input file {other}, which writing it would replace: "
                "give another file name"
            )
    if replaces is not None and path.is_file() and not replaces.holds(path):
        raise OutputError(
            f"{what} {path} exists and is not {replaces.kind}, which writing it would replace: "
            f"{replaces.instead} (or remove the file)"
        )
    check_writable(path.parent, f"{what} {path}")


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write(file)`` to a hidden file beside ``path``, then rename it to ``path``: an
    interrupted or failed write never leaves a half-written file, nor touches an old one.

    Raises :class:`OutputError` naming ``path`` (not the hidden file) when the file cannot be
    created or written (no permission, no space left, a read-only file system)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with tmp.open("wb") as file:
            write(file)
        os.replace(tmp, path)
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        kept = "; the file there is unchanged" if path.exists() else ""
        raise OutputError(f"cannot write {path}: {reason} (in {path.parent}){kept}") from error
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
