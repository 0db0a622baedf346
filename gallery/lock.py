"""One build at a time on a gallery folder: a lock that a killed ``smso-index`` does not leave
behind.

Two builds writing one GALLERY would each delete the other's files when they replace the
manifest (:func:`gallery.store.write_manifest` removes every other generation's), leaving a
manifest that names files no longer there. :func:`hold` refuses the second build before it
writes anything. The lock is :func:`fcntl.flock` on ``GALLERY/.smso-index.lock``, held for the
whole build; the kernel releases it when the process ends, however it ends, so there is never a
stale lock to remove. The file holds the process id of the build holding it, for the message.
Readers (a server loading the gallery) take no lock: the manifest's one rename is what they
see.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from gallery.store import GalleryError

__all__ = ["LOCK", "GalleryInUseError", "hold"]

LOCK = ".smso-index.lock"


class GalleryInUseError(GalleryError):
    """Another build holds GALLERY's lock: it is running now."""


@contextlib.contextmanager
def hold(folder: Path) -> Iterator[None]:
    """GALLERY for this build alone until the ``with`` ends (the folder created where it does
    not exist); :class:`GalleryInUseError` at once where another build holds it."""
    if folder.exists() and not folder.is_dir():
        raise GalleryError(f"{folder} is a file, not a gallery folder")
    folder.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode(errors="replace").strip()
            who = f" (process {holder})" if holder.isdigit() else ""
            raise GalleryInUseError(
                f"{folder} is being built by another smso-index{who}: wait for it to end, "
                "then run again (it updates what the other one wrote)"
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(descriptor)  # the lock goes with the descriptor
