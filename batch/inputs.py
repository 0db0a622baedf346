"""What ``smso-embed`` embeds: the INPUT argument resolved to a sorted list of image URIs.

INPUT is one of

* a folder: every image file under it, recursively (extensions :data:`IMAGE_EXTENSIONS`, any
  case; hidden files and folders, whose names start with ``.``, are skipped);
* a glob (``photos/**/*.jpg``): every file it matches, whatever its extension;
* a ``.parquet`` or ``.csv`` file with a column of paths or URIs (``--column``, by default
  ``path``); a relative path in it is taken relative to the list's own folder, so that a list
  travels with its images. A path listed twice is embedded once.

Local paths and any URI that pyarrow's filesystems read (``s3://``, ``gs://``, ``hdfs://``...)
are accepted; all the images of a job live on one filesystem. Every image is named in the
output by its URI as :func:`resolve` gives it: an absolute local path, or ``scheme://path``.
That name is also what ``--resume`` matches on.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq

__all__ = [
    "IMAGE_EXTENSIONS",
    "InputError",
    "Inputs",
    "Location",
    "locate",
    "resolve",
]

#: A folder's files that are embedded (the formats the service decodes: service.imaging.images).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")
GLOB_CHARACTERS = frozenset("*?[")
LIST_SUFFIXES = (".parquet", ".pq", ".csv")


class InputError(ValueError):
    """INPUT cannot be read as a folder, a glob or a list of images (what to change is said)."""


@dataclass(frozen=True)
class Location:
    """A place on a filesystem: ``filesystem`` and the ``path`` on it that pyarrow uses, and the
    ``scheme`` (``""`` for local files) that turns such a path back into a URI."""

    filesystem: pafs.FileSystem
    path: str
    scheme: str = ""

    def uri(self, path: str) -> str:
        """The URI of ``path`` (a path on this filesystem)."""
        return f"{self.scheme}://{path}" if self.scheme else path

    def at(self, path: str) -> Location:
        """The same filesystem at another path."""
        return Location(self.filesystem, path, self.scheme)


def locate(target: str) -> Location:
    """``target`` (a local path, absolute or relative, or a URI) as a :class:`Location`."""
    if "://" in target and not target.startswith("file://"):
        scheme = target.split("://", 1)[0]
        try:
            filesystem, path = pafs.FileSystem.from_uri(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as error:
            raise InputError(f"{target}: pyarrow cannot open this URI ({error})") from None
        return Location(filesystem, path, scheme)
    local = target.removeprefix("file://")
    return Location(pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(local)))


@dataclass(frozen=True)
class Inputs:
    """The images of a job: their filesystem and their URIs, sorted, each once."""

    location: Location  # the filesystem the images are on (its path: what INPUT named)
    uris: list[str]  # every image's URI, sorted, without duplicates
    described: str  # what INPUT was, for messages: "folder", "glob" or "list"
    duplicates: int = 0  # paths a list named more than once (embedded once)

    def path_of(self, uri: str) -> str:
        """The path on :attr:`location`'s filesystem of ``uri``."""
        prefix = f"{self.location.scheme}://" if self.location.scheme else ""
        return uri.removeprefix(prefix)


def _is_hidden(relative: str) -> bool:
    return any(part.startswith(".") for part in relative.split("/"))


def _folder(location: Location) -> list[str]:
    selector = pafs.FileSelector(location.path, recursive=True)
    found = []
    for info in location.filesystem.get_file_info(selector):
        if info.type != pafs.FileType.File:
            continue
        relative = info.path[len(location.path) :].lstrip("/")
        if not _is_hidden(relative) and info.path.lower().endswith(IMAGE_EXTENSIONS):
            found.append(location.uri(info.path))
    return found


def _glob(target: str, location: Location) -> list[str]:
    if not location.scheme:  # the shell's rules: ** for any depth, * within one folder
        pattern = os.path.abspath(os.path.expanduser(target.removeprefix("file://")))
        return [path for path in glob.glob(pattern, recursive=True) if os.path.isfile(path)]
    # a remote URI: list from the folder before the first wildcard (fnmatch: * crosses folders)
    parts = location.path.split("/")
    fixed = next(i for i, part in enumerate(parts) if GLOB_CHARACTERS & set(part))
    base = location.at("/".join(parts[:fixed]))
    try:
        infos = base.filesystem.get_file_info(pafs.FileSelector(base.path, recursive=True))
    except (FileNotFoundError, OSError) as error:
        raise InputError(f"{target}: cannot list {base.path} ({error})") from None
    return [
        location.uri(info.path)
        for info in infos
        if info.type == pafs.FileType.File and fnmatch.fnmatchcase(info.path, location.path)
    ]


def _read_list(location: Location, column: str) -> list[str]:
    """The column ``column`` of a Parquet or CSV file, as strings (nulls and blanks dropped)."""
    path, filesystem = location.path, location.filesystem
    try:
        if path.lower().endswith(".csv"):
            with filesystem.open_input_stream(path) as stream:
                options = pacsv.ConvertOptions(
                    include_columns=[column], column_types={column: pa.string()}
                )
                table = pacsv.read_csv(stream, convert_options=options)
        else:
            names = pq.read_schema(path, filesystem=filesystem).names
            if column not in names:
                raise KeyError(column)
            table = pq.read_table(path, columns=[column], filesystem=filesystem)
    except KeyError:
        raise InputError(
            f"{location.uri(path)} has no column {column!r}; name the column of paths with --column"
        ) from None
    except (pa.ArrowInvalid, pa.ArrowKeyError, OSError) as error:
        message = str(error).splitlines()[0][:300]
        if "include_columns" in message or "No match for FieldRef" in message:
            message = f"it has no column {column!r}; name the column of paths with --column"
        raise InputError(f"{location.uri(path)} cannot be read as a list: {message}") from None
    values = table.column(column).cast(pa.string()).to_pylist()
    return [value.strip() for value in values if value is not None and value.strip()]


def _listed(location: Location, column: str) -> tuple[Location, list[str], int]:
    """The images a list names, as URIs on their (one) filesystem, and how many were repeats."""
    entries = _read_list(location, column)
    if not entries:
        raise InputError(f"{location.uri(location.path)} lists no paths in column {column!r}")
    folder = location.path.rsplit("/", 1)[0] if "/" in location.path else ""
    images: Location | None = None
    uris = []
    for entry in entries:
        if "://" in entry and not entry.startswith("file://"):
            where = locate(entry)
        elif location.scheme:  # a relative or absolute path on the list's own filesystem
            where = location.at(entry if entry.startswith("/") else f"{folder}/{entry}")
        else:
            local = entry.removeprefix("file://")
            where = locate(local if os.path.isabs(local) else os.path.join(folder, local))
        if images is None:
            images = where
        elif where.scheme != images.scheme:
            raise InputError(
                f"{location.uri(location.path)} mixes filesystems ({images.scheme or 'local'} "
                f"and {where.scheme or 'local'}); a job reads its images from one"
            )
        uris.append(where.uri(where.path))
    unique = sorted(set(uris))
    assert images is not None  # entries is not empty
    return images, unique, len(uris) - len(unique)


def resolve(target: str, column: str = "path") -> Inputs:
    """INPUT as a sorted list of image URIs; :class:`InputError` saying why where there are
    none or INPUT cannot be read."""
    location = locate(target)
    if GLOB_CHARACTERS & set(Path(location.path).name) or any(
        GLOB_CHARACTERS & set(part) for part in location.path.split("/")
    ):
        uris = sorted(set(_glob(target, location)))
        if not uris:
            raise InputError(f"{target}: the glob matches no files")
        return Inputs(location, uris, "glob")
    try:
        info = location.filesystem.get_file_info(location.path)
    except OSError as error:
        raise InputError(f"{target}: cannot be read ({error})") from None
    if info.type == pafs.FileType.NotFound:
        raise InputError(f"{target}: no such file or folder")
    if info.type == pafs.FileType.Directory:
        uris = sorted(_folder(location))
        if not uris:
            raise InputError(
                f"{target}: the folder holds no image files "
                f"({', '.join(IMAGE_EXTENSIONS)}, in any case)"
            )
        return Inputs(location, uris, "folder")
    if location.path.lower().endswith(LIST_SUFFIXES):
        images, uris, duplicates = _listed(location, column)
        return Inputs(images, uris, "list", duplicates)
    raise InputError(
        f"{target}: not a folder, a glob, or a list of images (.parquet or .csv with a column "
        f"of paths); to embed one image, give its folder or a glob"
    )
