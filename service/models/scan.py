"""Reading a model repository folder (Triton's layout, ``<root>/<name>/<version>/model.onnx``):
cheaply, off the event loop, and without ever failing on what one entry holds.

A model is a folder whose name is a served name (letters, digits, ``_ . -``; at most 128); its
versions are the sub-folders named by a positive integer in plain ASCII digits without leading
zeros (``7``, not ``007`` or ``²``) that hold a ``model.onnx``, and the highest one is served.
Anything else in the folder is passed over: a :class:`Skipped` entry says why, logged once when
it first appears (not at every scan) and listed in the repository index.

:class:`Scanner` keeps what it read: a folder is listed again only when its modification time
changes (a sub-folder was added, removed or renamed), and everything is read anew every
``refresh`` scans for file systems whose times are coarse. A steady scan costs a few ``stat``
calls per model, whatever the number of versions. At most :data:`MAX_ENTRIES` entries of one
model folder are read.

A model folder, version folder or model file that is a symbolic link is served only where it
leads to a place inside the repository (its real path under the root's); one that leads outside
is passed over (``a link to outside the repository``), and the next lower version is served.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISLNK, S_ISREG

__all__ = ["MAX_ENTRIES", "MODEL_FILE", "NAME", "Scanner", "Skipped", "Version", "scan", "shown"]

log = logging.getLogger("service")

MODEL_FILE = "model.onnx"
#: A model folder's name: what clients put in a URL path.
NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
#: A version folder's name: a positive integer, ASCII digits, no leading zero, at most 18 digits.
VERSION = re.compile(r"[1-9][0-9]{0,17}")
#: The entries of one model folder read at most (the rest are passed over, with a warning).
MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class Version:
    """The version of a model the repository holds: its number, file, and the file's
    modification time, size, inode and change time (a changed file is a new model, even one
    copied in with its old modification time and the same size)."""

    number: int
    path: Path
    stamp: tuple[int, ...]


def shown(name: str) -> str:
    """A folder entry's name as it can be shown and sent (JSON, protobuf): bytes that are not
    UTF-8 as ``\\xNN``, at most 128 characters."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")[:128]


@dataclass(frozen=True)
class Skipped:
    """An entry of the folder that is not served, and why (``version`` is ``""`` for a model
    folder passed over as a whole)."""

    name: str
    version: str
    reason: str

    def index(self) -> dict[str, str]:
        """As the repository index lists it: UNAVAILABLE with the reason."""
        return {
            "name": self.name,
            "version": self.version,
            "state": "UNAVAILABLE",
            "reason": f"skipped: {self.reason}",
        }


@dataclass
class _Folder:
    """What one model folder held when it was last listed."""

    mtime: int
    numbers: list[int]  # candidate versions, highest first
    skipped: list[Skipped] = field(default_factory=list)
    linked: set[int] = field(default_factory=set)  # versions whose folder is a symbolic link


def _listed(path: Path, limit: int) -> tuple[list[os.DirEntry[str]], bool]:
    """At most ``limit`` entries of ``path``, and whether there were more."""
    entries: list[os.DirEntry[str]] = []
    with os.scandir(path) as it:
        for entry in it:
            if len(entries) == limit:
                return entries, True
            entries.append(entry)
    return entries, False


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _read_folder(path: Path, name: str) -> _Folder:
    """List the model folder ``path``: its candidate versions and what it passes over."""
    mtime = path.stat().st_mtime_ns
    entries, more = _listed(path, MAX_ENTRIES)
    numbers: list[int] = []
    skipped: list[Skipped] = []
    linked: set[int] = set()
    for entry in entries:
        if entry.name.startswith(".") or not _is_dir(entry):
            continue
        if VERSION.fullmatch(entry.name):
            numbers.append(int(entry.name))
            if entry.is_symlink():
                linked.add(int(entry.name))
        else:
            why = (
                "a version folder is named by a positive integer in plain digits, "
                "without leading zeros"
            )
            skipped.append(Skipped(name, shown(entry.name), why))
    if more:
        skipped.append(
            Skipped(name, "", f"the folder holds more than {MAX_ENTRIES:,} entries; the rest")
        )
    return _Folder(mtime, sorted(numbers, reverse=True), skipped, linked)


class Scanner:
    """Scans ``root`` again and again, reading only what changed (see the module's docstring)."""

    def __init__(self, root: Path, refresh: int = 60) -> None:
        self.root = root
        self.refresh = refresh
        self._scans = 0
        self._root_mtime: int | None = None
        self._names: list[str] = []
        self._linked: set[str] = set()  # model folders that are symbolic links
        self._real_root = os.path.realpath(root)
        self._root_skipped: list[Skipped] = []
        self._folders: dict[str, _Folder] = {}
        self._warned: set[Skipped] = set()
        self._found: dict[str, Version] = {}  # the last scan's models

    def __call__(self) -> tuple[dict[str, Version], list[Skipped]]:
        """Each model's highest version, and the entries passed over. ``OSError`` only when the
        root itself cannot be read; a model folder that cannot be read is passed over."""
        self._scans += 1
        if self._scans % self.refresh == 0:
            self._root_mtime = None
            self._folders.clear()
        mtime = self.root.stat().st_mtime_ns
        if mtime != self._root_mtime:
            self._read_root()
            self._root_mtime = mtime
        found: dict[str, Version] = {}
        skipped = list(self._root_skipped)
        for name in self._names:
            try:
                version, passed_over = self._model(name)
            except OSError as error:
                self._folders.pop(name, None)
                if error.errno in (errno.ENOENT, errno.ENOTDIR):  # removed meanwhile
                    continue
                skipped.append(Skipped(name, "", f"cannot be read: {error.strerror}"))
                # unreadable for a while (too many open files, a permission being changed):
                # what it served goes on being served, not unloaded and loaded again
                if name in self._found:
                    found[name] = self._found[name]
                continue
            skipped.extend(passed_over)
            if version is not None:
                found[name] = version
        self._warn(skipped)
        self._found = found
        return found, skipped

    def _read_root(self) -> None:
        self._names, self._root_skipped, self._linked = [], [], set()
        self._real_root = os.path.realpath(self.root)  # the root may be a link itself
        entries, more = _listed(self.root, MAX_ENTRIES)
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.startswith(".") or not _is_dir(entry):
                continue
            if NAME.fullmatch(entry.name):
                self._names.append(entry.name)
                if entry.is_symlink():
                    self._linked.add(entry.name)
            else:
                why = "not a model name (letters, digits, _ . -; at most 128)"
                self._root_skipped.append(Skipped(shown(entry.name), "", why))
        if more:
            why = f"the repository holds more than {MAX_ENTRIES:,} entries; the rest"
            self._root_skipped.append(Skipped("", "", why))
        for gone in set(self._folders) - set(self._names):
            del self._folders[gone]

    def _model(self, name: str) -> tuple[Version | None, list[Skipped]]:
        path = self.root / name
        folder = self._folders.get(name)
        if folder is None or path.stat().st_mtime_ns != folder.mtime:
            folder = self._folders[name] = _read_folder(path, name)
        outside: list[Skipped] = []
        for number in folder.numbers:
            file = path / str(number) / MODEL_FILE
            try:
                stat = os.lstat(file)
                linked = name in self._linked or number in folder.linked or S_ISLNK(stat.st_mode)
                if linked and not self._inside(file):
                    outside.append(Skipped(name, str(number), "a link to outside the repository"))
                    continue
                if S_ISLNK(stat.st_mode):
                    stat = file.stat()
            except OSError:  # no model file (yet), or removed meanwhile
                continue
            if not S_ISREG(stat.st_mode):
                continue
            stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino, stat.st_ctime_ns)
            return Version(number, file, stamp), folder.skipped + outside
        return None, folder.skipped + outside

    def _inside(self, path: Path) -> bool:
        """Whether ``path``'s real path (every link followed) lies inside the repository."""
        real = os.path.realpath(path)
        return os.path.commonpath([real, self._real_root]) == self._real_root

    def _warn(self, skipped: list[Skipped]) -> None:
        """One warning per entry passed over, when it first appears."""
        current = set(skipped)
        for entry in sorted(current - self._warned, key=lambda s: (s.name, s.version)):
            where = f"{entry.name!r}" + (f" version {entry.version!r}" if entry.version else "")
            log.warning("repository: %s skipped: %s", where, entry.reason)
        self._warned = current


def scan(root: Path) -> dict[str, Version]:
    """Each model folder's highest version, read once (:class:`Scanner` for repeated scans)."""
    return Scanner(root)()[0]
