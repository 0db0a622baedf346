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

A local folder or glob is walked by :func:`batch.walk.walk`: no symbolic link leading outside
INPUT is followed unless ``follow_symlinks`` is given, each folder is walked once (loops end),
and only regular files are kept; what was left out is in :attr:`Inputs.skipped`. A list names
its files itself: each is read where it points (a FIFO or a device named in it becomes an error
row when the job reads it, never opened for reading: :mod:`batch.embedder`).

A local name that is not valid UTF-8 (the filesystem allows any bytes but ``/`` and NUL) is
named in the output, which stores UTF-8 text, as a ``file://`` URI with its path
percent-encoded (RFC 3986: ``/data/caf\\xe9.jpg`` is ``file:///data/caf%E9.jpg``);
:meth:`Location.uri` and :meth:`Location.path_of` turn one into the other, one to one. A list
may name such a file by that URI (every ``file://`` entry is percent-decoded) or in a Parquet
``binary`` column of the raw bytes.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from batch.walk import open_regular, walk

__all__ = [
    "IMAGE_EXTENSIONS",
    "InputError",
    "Inputs",
    "Location",
    "locate",
    "resolve",
    "utf8_path",
]

#: A folder's files that are embedded (the formats the service decodes: service.imaging.images).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")
GLOB_CHARACTERS = frozenset("*?[")
LIST_SUFFIXES = (".parquet", ".pq", ".csv")
FILE_URI = "file://"


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
        """The URI of ``path`` (a path on this filesystem): what names it in the output. A
        local path that is not valid UTF-8 (``os.fsdecode``'s surrogate escapes) becomes a
        percent-encoded ``file://`` URI."""
        if self.scheme:
            return f"{self.scheme}://{path}"
        try:
            path.encode()
        except UnicodeEncodeError:
            return FILE_URI + urllib.parse.quote(os.fsencode(path), safe="/")
        return path

    def path_of(self, uri: str) -> str:
        """The path on this filesystem that :meth:`uri` named ``uri`` (local paths as
        ``os.fsdecode`` gives them, for :mod:`os`'s functions)."""
        if self.scheme:
            return uri.removeprefix(f"{self.scheme}://")
        if uri.startswith(FILE_URI):
            return os.fsdecode(urllib.parse.unquote_to_bytes(uri.removeprefix(FILE_URI)))
        return uri

    def at(self, path: str) -> Location:
        """The same filesystem at another path."""
        return Location(self.filesystem, path, self.scheme)


def utf8_path(target: str) -> None:
    """:class:`InputError` where the local path ``target`` is not valid UTF-8: pyarrow, which
    reads MODEL and writes OUT, takes UTF-8 paths only."""
    try:
        target.encode()
    except UnicodeEncodeError:
        shown = target.encode(errors="surrogateescape").decode(errors="backslashreplace")
        raise InputError(
            f"{shown}: this name is not valid UTF-8; give a path whose name is (rename it, or "
            "link to it under such a name)"
        ) from None


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
    skipped: dict[str, int] = field(default_factory=dict)  # left out of a walk, by reason


def _is_hidden(relative: str) -> bool:
    return any(part.startswith(".") for part in relative.split("/"))


#: What a folder or glob found: the URIs, and what a local walk left out (by reason).
Found = tuple[list[str], dict[str, int]]


def _walked(
    location: Location, root: str, parts: tuple[str, ...], follow: bool, images_only: bool
) -> Found:
    """A local walk's files under ``root`` (matching ``parts``), as URIs."""
    keep = _is_image if images_only else _any_name
    found = walk(root, parts, keep=keep, follow_symlinks=follow)
    return [location.uri(path) for path in found.files], found.skipped.as_dict()


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def _any_name(name: str) -> bool:
    return True


def _folder(location: Location, follow_symlinks: bool) -> Found:
    if not location.scheme:
        return _walked(location, location.path, ("**", "*"), follow_symlinks, images_only=True)
    selector = pafs.FileSelector(location.path, recursive=True)
    uris = []
    for info in location.filesystem.get_file_info(selector):
        if info.type != pafs.FileType.File:
            continue
        relative = info.path[len(location.path) :].lstrip("/")
        if not _is_hidden(relative) and _is_image(info.path):
            uris.append(location.uri(info.path))
    return uris, {}


def _glob(target: str, location: Location, follow_symlinks: bool) -> Found:
    parts = location.path.split("/")
    if not location.scheme:  # the shell's rules: ** for any depth, * within one folder
        if target.endswith("/"):  # the shell's rule: folders only
            return [], {}
        parts = os.path.normpath(location.path).split("/")
        fixed = next(i for i, part in enumerate(parts) if GLOB_CHARACTERS & set(part))
        root = "/".join(parts[:fixed]) or "/"
        if not os.path.isdir(root):
            return [], {}
        return _walked(location, root, tuple(parts[fixed:]), follow_symlinks, images_only=False)
    # a remote URI: list from the folder before the first wildcard (fnmatch: * crosses folders)
    fixed = next(i for i, part in enumerate(parts) if GLOB_CHARACTERS & set(part))
    base = location.at("/".join(parts[:fixed]))
    try:
        infos = base.filesystem.get_file_info(pafs.FileSelector(base.path, recursive=True))
    except (FileNotFoundError, OSError) as error:
        raise InputError(f"{target}: cannot list {base.path} ({error})") from None
    uris = [
        location.uri(info.path)
        for info in infos
        if info.type == pafs.FileType.File and fnmatch.fnmatchcase(info.path, location.path)
    ]
    return uris, {}


def _read_list(location: Location, column: str) -> list[str]:
    """The column ``column`` of a Parquet or CSV file, as strings (nulls and blanks dropped; a
    ``binary`` column's bytes are local names, decoded as ``os.fsdecode`` does)."""
    path, filesystem = location.path, location.filesystem
    try:
        with (
            open_regular(path) if not location.scheme else filesystem.open_input_file(path)
        ) as stream:
            if path.lower().endswith(".csv"):
                options = pacsv.ConvertOptions(
                    include_columns=[column], column_types={column: pa.string()}
                )
                table = pacsv.read_csv(stream, convert_options=options)
            else:
                if column not in pq.read_schema(stream).names:
                    raise KeyError(column)
                table = pq.read_table(stream, columns=[column])
        values = table.column(column)
        if pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
            return [os.fsdecode(value).strip() for value in values.to_pylist() if value]
        strings = values.cast(pa.string()).to_pylist()
    except KeyError:
        raise InputError(
            f"{location.uri(path)} has no column {column!r}; name the column of paths with --column"
        ) from None
    except (pa.ArrowInvalid, pa.ArrowKeyError, pa.ArrowNotImplementedError, OSError) as error:
        message = str(error).splitlines()[0][:300]
        if "include_columns" in message or "No match for FieldRef" in message:
            message = f"it has no column {column!r}; name the column of paths with --column"
        raise InputError(f"{location.uri(path)} cannot be read as a list: {message}") from None
    return [value.strip() for value in strings if value is not None and value.strip()]


def _listed(location: Location, column: str) -> tuple[Location, list[str], int]:
    """The images a list names, as URIs on their (one) filesystem, and how many were repeats."""
    entries = _read_list(location, column)
    if not entries:
        raise InputError(f"{location.uri(location.path)} lists no paths in column {column!r}")
    folder = location.path.rsplit("/", 1)[0] if "/" in location.path else ""
    images: Location | None = None
    uris = []
    for entry in entries:
        if "://" in entry and not entry.startswith(FILE_URI):
            where = locate(entry)
        elif location.scheme:  # a relative or absolute path on the list's own filesystem
            where = location.at(entry if entry.startswith("/") else f"{folder}/{entry}")
        else:  # a file:// URI is percent-encoded (RFC 8089), as Location.uri writes one
            local = Location(location.filesystem, "").path_of(entry)
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
    if images is None:  # not reached: entries is not empty
        raise InputError(f"{location.uri(location.path)} lists no paths in column {column!r}")
    return images, unique, len(uris) - len(unique)


def _kind(target: str, location: Location) -> pafs.FileType:
    """What ``location`` is: a local path by :func:`os.stat` (any name the filesystem gives,
    and a FIFO or a device as ``Unknown``), a URI by its filesystem."""
    try:
        if location.scheme:
            return location.filesystem.get_file_info(location.path).type
        mode = os.stat(location.path).st_mode
    except FileNotFoundError:
        return pafs.FileType.NotFound
    except OSError as error:
        raise InputError(f"{target}: cannot be read ({error.strerror or error})") from None
    if stat.S_ISDIR(mode):
        return pafs.FileType.Directory
    return pafs.FileType.File if stat.S_ISREG(mode) else pafs.FileType.Unknown


def resolve(target: str, column: str = "path", follow_symlinks: bool = False) -> Inputs:
    """INPUT as a sorted list of image URIs; :class:`InputError` saying why where there are
    none or INPUT cannot be read. A local folder or glob follows symbolic links leading outside
    it only with ``follow_symlinks``."""
    location = locate(target)
    if GLOB_CHARACTERS & set(Path(location.path).name) or any(
        GLOB_CHARACTERS & set(part) for part in location.path.split("/")
    ):
        found, skipped = _glob(target, location, follow_symlinks)
        uris = sorted(set(found))
        if not uris:
            raise InputError(f"{target}: the glob matches no files")
        return Inputs(location, uris, "glob", skipped=skipped)
    kind = _kind(target, location)
    if kind == pafs.FileType.NotFound:
        raise InputError(f"{target}: no such file or folder")
    if kind == pafs.FileType.Directory:
        found, skipped = _folder(location, follow_symlinks)
        uris = sorted(found)
        if not uris:
            raise InputError(
                f"{target}: the folder holds no image files "
                f"({', '.join(IMAGE_EXTENSIONS)}, in any case)"
            )
        return Inputs(location, uris, "folder", skipped=skipped)
    if location.path.lower().endswith(LIST_SUFFIXES):
        if kind != pafs.FileType.File:
            raise InputError(
                f"{target}: not a regular file (a FIFO or a device?); give the list as a file"
            )
        images, uris, duplicates = _listed(location, column)
        return Inputs(images, uris, "list", duplicates)
    raise InputError(
        f"{target}: not a folder, a glob, or a list of images (.parquet or .csv with a column "
        f"of paths); to embed one image, give its folder or a glob"
    )
