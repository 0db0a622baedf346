"""Local files found and opened safely: a folder walked without leaving it (symbolic links,
loops, special files), and a file opened only if it is a regular one.

:func:`walk` lists the files under ``root`` whose path below it matches a glob's components
(``("**", "*")`` for a whole folder), with the shell's rules: ``*``, ``?`` and ``[...]`` within
one name, ``**`` for any number of folders, names starting with ``.`` matched only by a
component that starts with ``.`` (and ``**`` never entering them). Unlike :func:`glob.glob` and
pyarrow's recursive listing, it

* follows no symbolic link that leads outside ``root`` (to a folder or a file) unless told to
  (``follow_symlinks``): a job reads only what INPUT holds;
* walks each folder once, known by its ``(st_dev, st_ino)``: a link back to a parent (a loop)
  or a second link to a folder is not walked again, so the walk ends however the links are
  laid out. The tree itself is walked first and links last, so a file reached both ways is
  named by its path in the tree;
* keeps only regular files: a FIFO, a socket or a device is never opened (opening a FIFO for
  reading waits for a writer, for ever);
* takes any name the filesystem gives, valid UTF-8 or not (``os.fsdecode``'s surrogate escapes:
  :meth:`batch.inputs.Location.uri` names them in the output).

What it left out is counted in :class:`Skipped`, for the job's summary.

:func:`open_regular` opens a file for reading only where it is a regular file, never waiting: a
FIFO named in a list is refused by its :func:`os.stat` without being opened, and the file that
is opened (without blocking, in case it was swapped for a FIFO meanwhile) is checked again.
:func:`read_regular` does the same and reads the whole file in as few system calls as it can
(the decode stage reads every image of a job with it).
"""

from __future__ import annotations

import fnmatch
import io
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "NotRegularFileError",
    "RegularFile",
    "Skipped",
    "Walk",
    "open_regular",
    "read_regular",
    "walk",
]

#: What :func:`open_regular` says a file is, by its ``st_mode``.
_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
)


class NotRegularFileError(OSError):
    """A path names a FIFO, a socket, a device or a folder, where a file's bytes were wanted."""

    def __init__(self, mode: int) -> None:
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        super().__init__(f"not a regular file ({kind}); only regular files are read")
        self.strerror = str(self)


def _regular(mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise NotRegularFileError(mode)


def open_regular(path: str) -> io.BufferedReader:
    """``path`` opened for reading (binary, buffered), where it is a regular file;
    :class:`NotRegularFileError` (an ``OSError``) without waiting where it is not."""
    _regular(os.stat(path).st_mode)  # a FIFO is never opened
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _regular(os.fstat(descriptor).st_mode)  # the file opened, if it changed since
        os.set_blocking(descriptor, True)
        return open(descriptor, "rb", closefd=True)  # the caller closes it
    except BaseException:
        os.close(descriptor)
        raise


@dataclass(frozen=True)
class RegularFile:
    """A regular file's bytes, and its ``os.fstat`` as it was opened."""

    data: bytes
    size: int  # st_size when opened
    mtime_ns: int


class FileTooLargeError(OSError):
    """The file holds more bytes than the reader accepts."""

    def __init__(self, size: int, limit: int, mtime_ns: int) -> None:
        super().__init__(f"{size:,} bytes, more than the {limit:,} accepted")
        self.size, self.limit, self.mtime_ns = size, limit, mtime_ns


def read_regular(path: str, max_bytes: int) -> RegularFile:
    """The bytes of ``path``, where it is a regular file of at most ``max_bytes`` bytes:
    :class:`NotRegularFileError` (never waiting) or :class:`FileTooLargeError` otherwise. Read
    with one ``read`` call where the file does not grow meanwhile."""
    _regular(os.stat(path).st_mode)  # a FIFO is never opened
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        status = os.fstat(descriptor)  # the file opened, if it changed since
        _regular(status.st_mode)
        if status.st_size > max_bytes:
            raise FileTooLargeError(status.st_size, max_bytes, status.st_mtime_ns)
        pieces = [os.read(descriptor, status.st_size + 1)]
        read = len(pieces[0])
        while pieces[-1] and read <= max_bytes:  # it grew since fstat: read on to its end
            pieces.append(os.read(descriptor, max(status.st_size, 65536)))
            read += len(pieces[-1])
        if read > max_bytes:
            raise FileTooLargeError(read, max_bytes, status.st_mtime_ns)
        return RegularFile(b"".join(pieces), status.st_size, status.st_mtime_ns)
    finally:
        os.close(descriptor)


@dataclass
class Skipped:
    """Entries a walk matched but left out, by reason."""

    outside: int = 0  # symbolic links leading outside the root (--follow-symlinks follows them)
    walked: int = 0  # folders reached again through a link (a loop, or a second name for one)
    special: int = 0  # FIFOs, sockets and devices: not regular files, never opened
    broken: int = 0  # links to nothing, and entries that vanished or could not be listed

    def as_dict(self) -> dict[str, int]:
        """The reasons that count, by name (``{}`` where nothing was left out)."""
        counts = {
            "links_outside_input": self.outside,
            "folders_already_walked": self.walked,
            "not_regular_files": self.special,
            "broken_or_unlistable": self.broken,
        }
        return {reason: n for reason, n in counts.items() if n}


@dataclass(frozen=True)
class Walk:
    """A walk's result: the files found (paths under the root, unsorted) and what was skipped."""

    files: list[str]
    skipped: Skipped = field(default_factory=Skipped)


def _hidden_allowed(part: str) -> bool:
    return part.startswith(".")


class _Walker:
    def __init__(
        self,
        root: str,
        parts: tuple[str, ...],
        keep: Callable[[str], bool],
        follow_symlinks: bool,
    ) -> None:
        self.root = root
        self.real_root = os.path.realpath(root)
        self.parts = parts if parts[-1] != "**" else (*parts, "*")  # a last ** means its files
        self.keep = keep
        self.follow = follow_symlinks
        self.seen: set[tuple[int, int, int]] = set()  # (st_dev, st_ino, pattern index) walked
        self.files: list[str] = []
        self.skipped = Skipped()
        self.links: list[tuple[str, int]] = []  # linked folders, walked after the tree

    def inside(self, path: str) -> bool:
        real = os.path.realpath(path)
        return real == self.real_root or real.startswith(self.real_root.rstrip("/") + "/")

    def states(self, index: int) -> list[int]:
        """``index`` and the states a ``**`` matching no folder leads to."""
        found = [index]
        while self.parts[index] == "**":
            index += 1
            found.append(index)
        return found

    def enter(self, path: str, index: int) -> list[tuple[str, int]]:
        """The folder ``path`` in state ``index``, unless walked already in that state."""
        try:
            info = os.stat(path)
        except OSError:
            self.skipped.broken += 1
            return []
        key = (info.st_dev, info.st_ino, index)
        if key in self.seen:
            self.skipped.walked += 1
            return []
        self.seen.add(key)
        return self.visit(path, index)

    def visit(self, folder: str, index: int) -> list[tuple[str, int]]:
        """Match the entries of ``folder``; the sub-folders to walk next, with their states."""
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            self.skipped.broken += 1
            return []
        below: list[tuple[str, int]] = []
        last = len(self.parts) - 1
        for state in self.states(index):
            part = self.parts[state]
            for entry in entries:
                if entry.name.startswith(".") and not _hidden_allowed(part):
                    continue
                if part == "**":  # any sub-folder, in the same state
                    self.folder(entry, state, below)
                elif fnmatch.fnmatchcase(entry.name, part):
                    if state == last:
                        self.file(entry)
                    else:
                        self.folder(entry, state + 1, below)
        return below

    def folder(self, entry: os.DirEntry[str], state: int, below: list[tuple[str, int]]) -> None:
        if entry.is_symlink():
            if _target_is_folder(entry):
                self.links.append((entry.path, state))
            return
        if entry.is_dir(follow_symlinks=False):
            below.append((entry.path, state))

    def file(self, entry: os.DirEntry[str]) -> None:
        if not self.keep(entry.name):
            return
        if entry.is_symlink():
            if _target_is_folder(entry):
                return
            if not self.follow and not self.inside(entry.path):
                self.skipped.outside += 1
                return
            try:
                regular = stat.S_ISREG(entry.stat().st_mode)
            except OSError:
                self.skipped.broken += 1
                return
        elif entry.is_dir(follow_symlinks=False):
            return
        else:
            regular = entry.is_file(follow_symlinks=False)
        if regular:
            self.files.append(entry.path)
        else:
            self.skipped.special += 1

    def run(self) -> Walk:
        pending = [(self.root, 0)]
        while pending or self.links:
            while pending:  # the tree, depth first
                path, state = pending.pop()
                pending += reversed(self.enter(path, state))
            if self.links:  # then one link at a time, each walked as a tree of its own
                path, state = self.links.pop(0)
                if not self.follow and not self.inside(path):
                    self.skipped.outside += 1
                else:
                    pending.append((path, state))
        return Walk(self.files, self.skipped)


def _target_is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=True)
    except OSError:
        return False


def walk(
    root: str,
    parts: tuple[str, ...] = ("**", "*"),
    keep: Callable[[str], bool] = lambda name: True,
    follow_symlinks: bool = False,
) -> Walk:
    """The regular files under the folder ``root`` whose path below it matches ``parts`` (a
    glob's components) and whose name passes ``keep``; see the module's docstring."""
    return _Walker(root, parts, keep, follow_symlinks).run()
