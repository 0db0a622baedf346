"""One job at a time on an output folder: a lock that a killed job does not leave behind.

Two jobs writing one OUT cut their parts differently (``--rows-per-file``, ``--decode-batch``),
so each writes every image under other part names and OUT ends with images twice, which no
``--resume`` repairs. :func:`hold` refuses the second job before it reads or writes anything.

The lock is :func:`fcntl.flock` on ``OUT/_smso_embed.lock`` (a name that Parquet readers skip),
held by the command's process for the whole job. The kernel releases it when that process ends,
however it ends (SIGKILL, a crash, a lost terminal), so there is never a stale lock to remove:
the file that stays behind is not the lock, only where it is taken. The file holds the process
id of the job holding it, for the message.

Only a local OUT is locked: an object store (``s3://``, ``gs://``) has no lock that a killed
process gives back, so there the user must run one job per OUT (docs/batch.md says so). A
shared file system mounted on several machines locks as its ``flock`` does (NFS v4 does).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

import pyarrow.fs as pafs

from batch.inputs import Location
from batch.outputs import LOCK, OutputError

__all__ = ["OutputInUseError", "hold"]


class OutputInUseError(OutputError):
    """Another smso-embed job holds OUT's lock: it is running now."""


def _holder(descriptor: int) -> str:
    """The process id the holder wrote, as words (``""`` where it cannot be read)."""
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(descriptor, 32, 0).decode().strip()
        if text.isdigit():
            return f" (process {text})"
    return ""


@contextlib.contextmanager
def hold(out: Location) -> Iterator[None]:
    """OUT for this job alone until the ``with`` ends; :class:`OutputInUseError` at once where
    another job holds it. OUT is created where it does not exist (a local folder only)."""
    if out.scheme or not isinstance(out.filesystem, pafs.LocalFileSystem):
        yield  # nothing to lock with: one job per OUT is the user's to keep
        return
    if os.path.lexists(out.path) and not os.path.isdir(out.path):
        yield  # a file: batch.outputs.prepare says so
        return
    os.makedirs(out.path, exist_ok=True)
    path = os.path.join(out.path, LOCK)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputInUseError(
                f"{out.uri(out.path)} is in use by another smso-embed job{_holder(descriptor)}: "
                "wait for it to end (or stop it), then run again with --resume; or give another "
                "folder"
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(descriptor)  # the lock goes with the descriptor
