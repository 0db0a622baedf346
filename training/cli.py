"""What the console scripts share: a user's mistake is one error line and exit status 2, and
help that shows each flag's default once (:class:`HelpFormatter`, from
:mod:`training.help_formatter`, which the training config's parser uses too)."""

from __future__ import annotations

import argparse
import errno
import os
import re
import select
import sys
from collections.abc import Callable

from training.backbones import PretrainedWeightsError
from training.checkpoint import CheckpointError
from training.datasets import DatasetLayoutError
from training.divergence import DivergenceError
from training.help_formatter import HelpFormatter
from training.outputs import OutputError

__all__ = [
    "USER_ERRORS",
    "HelpFormatter",
    "out_of_memory",
    "run_cli",
]

#: Errors caused by what the user gave (settings, files, datasets, weights), not by a bug.
#: ConfigError, UnknownHeadError and UnknownBackboneError are ValueErrors; DivergenceError is
#: a learning rate too high for the data.
USER_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    FileNotFoundError,
    DatasetLayoutError,
    CheckpointError,
    PretrainedWeightsError,
    DivergenceError,
    OutputError,
    # an output path that is a folder, a file where a folder must go, no permission
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
    PermissionError,
)


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {least} or more, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number >= 1 (a clear usage error otherwise)."""
    return _whole_number(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse ``type``: a whole number >= 0 (a clear usage error otherwise)."""
    return _whole_number(text, 0)


def run_cli(prog: str, body: Callable[[], int]) -> int:
    """Run ``body``; on a user error, or memory the settings ask for and the machine does not
    have, print ``prog: error: message`` to stderr and return 2. A reader that stops reading
    standard output (``| head``) ends the run quietly with status 1."""
    try:
        status = body()
        if sys.stdout is not None:  # a closed pipe raises here, not in the flush at exit
            sys.stdout.flush()
        return status
    except BrokenPipeError:
        if not _reader_gone():  # another pipe or socket of the run's: not the user's doing
            raise
        # Python's docs' recipe for SIGPIPE: what is still buffered goes to /dev/null, so that
        # the interpreter's flush at exit cannot raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1
    except USER_ERRORS as exc:
        print(f"{prog}: error: {_message(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in _CANNOT_WRITE:
            raise
        where = f" {exc.filename}" if exc.filename else ""
        print(f"{prog}: error: cannot write{where}: {exc.strerror}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        if not out_of_memory(exc):
            raise
        print(f"{prog}: error: {_out_of_memory_message(exc)}", file=sys.stderr)
        return 2


def _reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (``| head`` has read
    enough): ``poll`` reports ``POLLERR`` on the write end of such a pipe, and on nothing else
    that standard output may be (a terminal, a file, an open pipe)."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # None, or a StringIO (capsys, redirect)
        return False
    poller = select.poll()
    poller.register(descriptor, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


#: An ``OSError`` that only a write raises and no check before the work can foresee: a file
#: system made read-only during a run, no space left, a quota used up (a ``PermissionError``
#: is one of ``USER_ERRORS``, which names the file).
_CANNOT_WRITE = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT})

#: How torch says an allocation failed: CUDA's OutOfMemoryError, the CPU allocator's message.
_NO_MEMORY = re.compile(r"out of memory|can't allocate memory", re.IGNORECASE)
_TRIED = re.compile(r"(?:tried|Tried) to allocate (\d+(?:\.\d+)?) ?(bytes|[KMGT]i?B)")


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's failure to allocate memory (CPU or GPU): the settings ask for
    more than the machine has, not a bug."""
    return isinstance(exc, RuntimeError) and (
        type(exc).__name__ == "OutOfMemoryError" or bool(_NO_MEMORY.search(str(exc)))
    )


def _out_of_memory_message(exc: BaseException) -> str:
    """One line: how much was asked for (when torch says) and which settings use less."""
    tried = _TRIED.search(str(exc))
    amount = ""
    if tried is not None:
        size, unit = float(tried.group(1)), tried.group(2)
        shown = f"{size / 2**30:.1f} GiB" if unit == "bytes" else f"{size:g} {unit}"
        amount = f" (one allocation of {shown})"
    device = str(exc).upper()
    gpu = "CUDA" in device or "MPS" in device or type(exc).__name__ == "OutOfMemoryError"
    return (
        f"out of {'GPU' if gpu else 'CPU'} memory{amount}: the settings ask for more than is "
        "free on this machine (other processes' use counts too); a smaller head (head_options "
        "dim, reduce_dim), batch_size or image_size needs less"
    )


def _message(exc: BaseException) -> str:
    """The error's message; for one re-raised from a data loader worker (which carries the
    worker's traceback in its text), the original's own message alone."""
    text = str(exc).strip()
    if not (text.startswith("Caught ") and "Original Traceback" in text):
        return text
    lines = text.partition("Original Traceback")[2].splitlines()[1:]
    for i, line in enumerate(lines):  # the traceback's frames are indented; then the error
        if line and not line[0].isspace():  # "module.ErrorType: message", maybe more lines
            return "\n".join([line.split(": ", 1)[-1], *lines[i + 1 :]]).strip()
    return text
