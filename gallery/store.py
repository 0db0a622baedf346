"""A gallery on disk: one folder, a manifest and the arrays it names, each checked at load.

Layout of GALLERY::

    GALLERY/gallery.json            the manifest (:class:`Manifest`): the stamp, the dtype, the
                                    standardisation, the search, and every file below with its
                                    size and sha256
    GALLERY/index-<g>.usearch       the codes in usearch's HNSW graph ("hnsw" galleries)
    GALLERY/codes-<g>.npy           the codes as one matrix ("exact" galleries)
    GALLERY/keys-<g>.npy            (N,) uint64, ascending: each item's key in the index
    GALLERY/paths-<g>.bin           the items' paths, UTF-8, one after the other
    GALLERY/offsets-<g>.npy         (N + 1,) int64: path i is paths[offsets[i]:offsets[i + 1]]
    GALLERY/labels-<g>.npy          (N,) int32: each item's top-1 class (an index in ``classes``)
    GALLERY/file_sizes-<g>.npy      (N,) int64 and
    GALLERY/file_mtimes-<g>.npy     (N,) int64: the image file each row came from, as it was
                                    embedded (what an incremental ``smso-index`` compares)

``<g>`` is the build's generation. A build writes its files under a new generation, then
replaces ``gallery.json`` in one rename, then deletes the older generation's files: a reader
sees the old gallery or the new one, never half of each. The arrays are ``.npy`` files read
without pickle (no code runs from a gallery file), and each is checked against the manifest's
size and sha256 before use: a truncated or altered gallery is a :class:`GalleryError` naming
the file, never a wrong answer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gallery.codes import Dtype, Standardisation
from gallery.stamp import Stamp

__all__ = [
    "FORMAT",
    "MANIFEST",
    "FileEntry",
    "GalleryError",
    "Hnsw",
    "Manifest",
    "read_array",
    "read_manifest",
    "write_array",
    "write_manifest",
]

FORMAT = "smso-gallery/1"
MANIFEST = "gallery.json"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024  # a manifest is a few kB; anything far larger is not one
#: the names a build writes (and a later build deletes): nothing else in the folder is touched
GENERATED = re.compile(
    r"(index|codes|keys|paths|offsets|labels|file_sizes|file_mtimes)-[0-9a-f]{12}"
    r"\.(usearch|npy|bin)|\.gallery\.json\.[0-9a-f]{12}\.tmp"
)


class GalleryError(ValueError):
    """GALLERY cannot be read: missing, truncated, altered or not a gallery (one line)."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a gallery: its name in the folder, size and sha256."""

    name: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Hnsw:
    """usearch's graph parameters (the HNSW paper's M, efConstruction and ef)."""

    connectivity: int = 16
    expansion_add: int = 128
    expansion_search: int = 64


@dataclass(frozen=True)
class Manifest:
    """What a gallery holds and how to search it."""

    stamp: Stamp
    dtype: Dtype
    dimension: int
    count: int
    classes: tuple[str, ...]  # the model's class names: labels index them
    standardisation: Standardisation
    normalized: bool  # the embeddings were of unit length (queries are made so too)
    search: str  # "exact": a scan of every code; "hnsw": usearch's graph
    hnsw: Hnsw
    files: Mapping[str, FileEntry]
    generation: str
    next_key: int  # the key the next item added gets
    library: str  # usearch's version that wrote it
    format: str = FORMAT
    extra: Mapping[str, object] = field(default_factory=dict)  # the build's summary

    def to_json(self) -> bytes:
        fields = {
            "format": self.format,
            "stamp": self.stamp.to_json(),
            "dtype": self.dtype.value,
            "dimension": self.dimension,
            "count": self.count,
            "classes": list(self.classes),
            "standardisation": self.standardisation.to_json(),
            "normalized": self.normalized,
            "search": self.search,
            "hnsw": vars(self.hnsw),
            "files": {key: vars(entry) for key, entry in self.files.items()},
            "generation": self.generation,
            "next_key": self.next_key,
            "library": self.library,
            "extra": dict(self.extra),
        }
        return json.dumps(fields, indent=1).encode() + b"\n"

    @classmethod
    def from_json(cls, text: bytes) -> Manifest:
        """The manifest in ``text``; ``ValueError`` with what is wrong otherwise."""
        fields = json.loads(text)
        if not isinstance(fields, dict):
            raise ValueError("not a JSON object")
        if fields.get("format") != FORMAT:
            raise ValueError(f"format is {fields.get('format')!r}, not {FORMAT!r}")
        try:
            dimension = int(fields["dimension"])
            count = int(fields["count"])
            dtype = Dtype(fields["dtype"])
            search = str(fields["search"])
            files = {
                str(key): FileEntry(str(e["name"]), int(e["bytes"]), str(e["sha256"]))
                for key, e in dict(fields["files"]).items()
            }
            classes = tuple(str(name) for name in fields["classes"])
            hnsw = Hnsw(**{key: int(value) for key, value in dict(fields["hnsw"]).items()})
            normalized = fields.get("normalized", False)
            if not isinstance(normalized, bool):
                raise ValueError(f"normalized is {normalized!r}, not true or false")
            standardisation = fields.get("standardisation")
            if not isinstance(standardisation, dict):
                raise ValueError("standardisation is not an object")
            extra = fields.get("extra") or {}
            if not isinstance(extra, dict):
                raise ValueError("extra is not an object")
            manifest = cls(
                stamp=Stamp.from_json(fields.get("stamp")),
                dtype=dtype,
                dimension=dimension,
                count=count,
                classes=classes,
                standardisation=Standardisation.from_json(standardisation, dimension),
                normalized=normalized,
                search=search,
                hnsw=hnsw,
                files=files,
                generation=str(fields.get("generation", "")),
                next_key=int(fields.get("next_key", count)),
                library=str(fields.get("library", "")),
                extra=extra,
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"a field is missing or of the wrong type ({error})") from None
        if dimension < 1 or count < 0 or search not in ("exact", "hnsw"):
            raise ValueError("dimension, count or search out of range")
        for entry in files.values():
            if Path(entry.name).name != entry.name or entry.name.startswith("."):
                raise ValueError(f"file name {entry.name!r} is not a plain name in the folder")
        return manifest


def new_generation() -> str:
    """A new build's suffix for its file names."""
    return uuid.uuid4().hex[:12]


def read_manifest(folder: Path) -> Manifest:
    """GALLERY's manifest; :class:`GalleryError` naming the folder and what is wrong."""
    path = folder / MANIFEST
    try:
        with path.open("rb") as handle:
            text = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        kind = "is not a folder" if not folder.is_dir() else f"has no {MANIFEST}"
        raise GalleryError(f"{folder} {kind}: not a gallery (smso-index writes one)") from None
    except OSError as error:
        raise GalleryError(f"{path} cannot be read: {error.strerror}") from None
    if len(text) > MAX_MANIFEST_BYTES:
        raise GalleryError(f"{path} is larger than {MAX_MANIFEST_BYTES} bytes: not a manifest")
    try:
        return Manifest.from_json(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise GalleryError(f"{path} is not a gallery manifest: {error}") from None


def checked_path(folder: Path, entry: FileEntry) -> Path:
    """The file of ``entry`` once its size and sha256 match the manifest's."""
    path = folder / entry.name
    try:
        size = path.stat().st_size
    except OSError:
        raise GalleryError(f"{path} is missing: the gallery is incomplete") from None
    if size != entry.bytes:
        raise GalleryError(
            f"{path} has {size} bytes, the manifest {entry.bytes}: the file is truncated or "
            "was replaced; build the gallery again"
        )
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 22):
                digest.update(chunk)
    except OSError as error:
        raise GalleryError(f"{path} cannot be read: {error.strerror or error}") from None
    if digest.hexdigest() != entry.sha256:
        raise GalleryError(f"{path} does not match its checksum in the manifest: it was altered")
    return path


def read_array(
    folder: Path, entry: FileEntry, dtype: np.dtype, rows: int, ndim: int = 1
) -> np.ndarray:
    """A checked ``.npy`` file of ``rows`` rows of ``dtype`` and ``ndim`` dimensions, loaded
    without pickle."""
    path = checked_path(folder, entry)
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise GalleryError(f"{path} is not a numpy array file: {error}") from None
    if array.dtype != dtype or array.ndim != ndim or len(array) != rows:
        raise GalleryError(
            f"{path} holds {array.shape} {array.dtype}, the manifest says {rows} rows of {dtype}"
        )
    return array


def _fsynced(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def entry_of(path: Path) -> FileEntry:
    """A written file's entry (size, sha256), after it reached the disk."""
    _fsynced(path)
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return FileEntry(path.name, path.stat().st_size, digest.hexdigest())


def write_array(folder: Path, name: str, array: np.ndarray) -> FileEntry:
    """``array`` as ``folder/name`` (``.npy``), and its entry."""
    path = folder / name
    with path.open("wb") as handle:
        np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
    return entry_of(path)


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """The manifest, replaced in one rename; then the files of other generations deleted."""
    temporary = folder / f".{MANIFEST}.{manifest.generation}.tmp"
    temporary.write_bytes(manifest.to_json())
    _fsynced(temporary)
    os.replace(temporary, folder / MANIFEST)
    keep = {entry.name for entry in manifest.files.values()} | {MANIFEST}
    for path in folder.iterdir():
        if path.name not in keep and GENERATED.fullmatch(path.name):
            path.unlink(missing_ok=True)
