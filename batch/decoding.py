"""Reading and decoding a batch of images: the first two stages of every engine.

:func:`decode` reads each image's bytes from its filesystem and turns them into the model's
input with the service's own :class:`service.imaging.images.Preprocessor`, under the service's
limits (the file's size, the pixel count and aspect ratio read from the header). A file that
cannot be read or is refused becomes a row with an error kind and message instead of an image:
the job goes on. Each row also carries the file's size and modification time as it was read
(what a later ``--resume`` compares to find changed files: :mod:`batch.plan`) and the seconds
its reading and its decoding took (:class:`batch.stages.StageTimes`).

The embedded engine runs it in a pool of threads, the Ray engine in Ray tasks (or in the
inference actors): the same function, the same rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from batch.inputs import Location
from batch.walk import FileTooLargeError, RegularFile, read_regular
from service.core.card import Preprocessing
from service.imaging.images import ImageError, ImageTooLargeError, Preprocessor

__all__ = [
    "FILE_TOO_LARGE",
    "IMAGE_TOO_LARGE",
    "INVALID_IMAGE",
    "NOT_FINITE",
    "UNKNOWN",
    "UNREADABLE",
    "DecodeOptions",
    "decode",
]

#: The error kinds of the errors table: the service's codes for refused images (400, 413), and
#: the job's own for files it could not read or a model whose outputs are not finite.
UNREADABLE = "unreadable"  # the filesystem could not open or read the file
FILE_TOO_LARGE = "file_too_large"  # more bytes than the service accepts for one upload
IMAGE_TOO_LARGE = "image_too_large"  # more pixels than the service accepts (its 413)
INVALID_IMAGE = "invalid_image"  # not a decodable image of an accepted format (its 400)
NOT_FINITE = "output_not_finite"  # the model's outputs are NaN or infinite: the model's fault

#: ``file_size`` and ``file_mtime_ns`` of a file that could not be read.
UNKNOWN = -1


@dataclass(frozen=True)
class DecodeOptions:
    """What :func:`decode` needs: where the files are and the service's limits."""

    location: Location  # the images' filesystem (paths in the batch are URIs on it)
    preprocessing: Preprocessing  # the model card's
    max_pixels: int  # width x height of one image (the service's max_pixels)
    max_bytes: int  # one encoded file (the service's max_upload_bytes)


class _RefusedError(Exception):
    def __init__(self, kind: str, message: str, size: int, mtime_ns: int) -> None:
        super().__init__(message)
        self.kind, self.size, self.mtime_ns = kind, size, mtime_ns


def _too_large(size: int, mtime_ns: int, uri: str, limit: int) -> _RefusedError:
    return _RefusedError(
        FILE_TOO_LARGE, f"{uri}: {size:,} bytes, more than the {limit:,} accepted", size, mtime_ns
    )


def _read(options: DecodeOptions, uri: str) -> RegularFile:
    """The file's bytes: a local one only if it is a regular file (a FIFO named in a list would
    block the reader for ever), refused where it is larger than the service accepts. The size
    and time are the open file's (``fstat``): the version whose bytes were read."""
    location = options.location
    path = location.path_of(uri)
    if location.scheme:
        info = location.filesystem.get_file_info(path)
        mtime_ns = info.mtime_ns if info.mtime_ns is not None else UNKNOWN
        with location.filesystem.open_input_file(path) as stream:
            size = stream.size()
            if size > options.max_bytes:
                raise _too_large(size, mtime_ns, uri, options.max_bytes)
            return RegularFile(stream.read(), size, mtime_ns)
    try:
        return read_regular(path, options.max_bytes)
    except FileTooLargeError as error:
        raise _too_large(error.size, error.mtime_ns, uri, options.max_bytes) from None


def decode(batch: dict[str, np.ndarray], options: DecodeOptions) -> dict[str, np.ndarray]:
    """A batch of ``N`` paths -> the model's inputs and what each file was.

    ``{"path": (N,), "chunk": (N,)}`` (``chunk``: the output part each image belongs to, passed
    through) -> ``path``, ``chunk``; ``image`` (N, C, S, S) float32 (zeros where the file
    failed); ``error_kind`` and ``error`` (N,) (``""`` where it did not); ``file_size`` and
    ``file_mtime_ns`` (N,) int64 (:data:`UNKNOWN` where it could not be read); ``read_s`` and
    ``decode_s`` (N,) float64, the seconds each stage took for each image."""
    preprocess = Preprocessor(options.preprocessing, options.max_pixels)
    spec = options.preprocessing
    paths = [str(path) for path in batch["path"]]
    n = len(paths)
    images = np.zeros((n, len(spec.mean), spec.crop, spec.crop), np.float32)
    kinds, errors = [""] * n, [""] * n
    sizes = np.full(n, UNKNOWN, np.int64)
    mtimes = np.full(n, UNKNOWN, np.int64)
    read_s, decode_s = np.zeros(n), np.zeros(n)
    for i, uri in enumerate(paths):
        start = read_at = time.perf_counter()
        try:
            file = _read(options, uri)
            sizes[i], mtimes[i] = file.size, file.mtime_ns
            read_at = time.perf_counter()
            images[i] = preprocess(file.data, uri)
        except _RefusedError as refused:
            kinds[i], errors[i] = refused.kind, str(refused)
            sizes[i], mtimes[i] = refused.size, refused.mtime_ns
        except ImageTooLargeError as error:
            kinds[i], errors[i] = IMAGE_TOO_LARGE, str(error)
        except ImageError as error:
            kinds[i], errors[i] = INVALID_IMAGE, str(error)
        except OSError as error:  # missing, not a regular file, permissions, the network
            # strerror, not str(error): the latter repeats the path, maybe not valid UTF-8
            kinds[i], errors[i] = UNREADABLE, f"{uri}: cannot be read ({error.strerror or error})"
        except MemoryError:
            kinds[i], errors[i] = IMAGE_TOO_LARGE, f"{uri}: out of memory while decoding"
        end = time.perf_counter()
        if read_at > start:  # read: the rest was decoding (or refusing)
            read_s[i], decode_s[i] = read_at - start, end - read_at
        else:
            read_s[i] = end - start
    return {
        "path": np.array(paths, dtype=object),
        "chunk": np.asarray(batch["chunk"], np.int64),
        "image": images,
        "error_kind": np.array(kinds, dtype=object),
        "error": np.array(errors, dtype=object),
        "file_size": sizes,
        "file_mtime_ns": mtimes,
        "read_s": read_s,
        "decode_s": decode_s,
    }
