"""The output folder: two Parquet datasets, written exactly once, and what a resume reads back.

Layout of OUT (a local folder or any URI pyarrow writes)::

    OUT/_smso_embed.json           the job: the model file's and card's checksums, --normalize...
    OUT/_smso_embed.lock           held by the job running on OUT (:mod:`batch.lock`)
    OUT/embeddings/part-<h>.parquet   one row per image embedded (:func:`embeddings_schema`)
    OUT/errors/part-<h>.parquet       one row per image refused or unreadable (:data:`ERRORS`)

The images to do are cut into chunks of ``rows_per_file`` in path order, and each chunk is
written (:class:`batch.parts.PartWriter`) as one file per table, named by a hash of its paths
(``<h>``: the same images, the same name, whichever engine wrote them and however often), first
under a hidden temporary name (``.part-<h>.parquet.<uuid>.tmp``) and then renamed: a reader
(pyarrow, DuckDB, pandas, Ray all skip names starting with ``.`` or ``_``) never sees half a
file, and a job killed mid-write leaves only a temporary file, which the next ``--resume``
deletes (:func:`scan`).

``--resume`` (:func:`scan`) reads the ``path``, ``file_size`` and ``file_mtime_ns`` columns of
every part of both tables: what OUT holds and from which version of each file. Those images are
not read again unless they changed or were deleted since (:mod:`batch.plan`), so every image is
written once across any number of stopped and resumed runs. A part holds ``rows_per_file``
images (the last ones fewer) in one row group: large enough for pyarrow, DuckDB or pandas to
read a whole dataset quickly, small enough that a stopped job loses little.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from batch.decoding import UNKNOWN
from batch.inputs import Location

__all__ = [
    "DTYPES",
    "EMBEDDINGS",
    "ERRORS",
    "ERRORS_SCHEMA",
    "MANIFEST",
    "TEMPORARY",
    "Held",
    "JobManifest",
    "OutputError",
    "Scan",
    "embeddings_schema",
    "prepare",
    "scan",
]

log = logging.getLogger("batch")

EMBEDDINGS = "embeddings"
ERRORS = "errors"
MANIFEST = "_smso_embed.json"
LOCK = "_smso_embed.lock"  # batch.lock's: a job's lock file, not output (readers skip "_")
TEMPORARY = ".tmp"
FORMAT = "smso-embed/3"  # /1 did not record the model file's sha256, /2 the files' state
OLDER_FORMATS = ("smso-embed/1", "smso-embed/2")
#: --dtype: how the embeddings table stores each embedding
DTYPES = {"float32": pa.float32(), "float16": pa.float16()}

#: The errors table: the image, why it was refused (the service's code, or the job's own:
#: ``batch.embedder``'s kinds) and the message /embed would have answered.
ERRORS_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("kind", pa.string()),
        ("message", pa.string()),
        ("model_name", pa.string()),
        ("model_version", pa.string()),
        ("card_sha256", pa.string()),
        ("file_size", pa.int64()),  # null: the file could not be read
        ("file_mtime_ns", pa.int64()),
    ]
)


def embeddings_schema(embedding_dim: int, top_k: int, dtype: str = "float32") -> pa.Schema:
    """The embeddings table: one row per image, in a part's path order. ``file_size`` and
    ``file_mtime_ns`` are the file's as it was read: what ``--resume`` compares."""
    return pa.schema(
        [
            ("path", pa.string()),
            ("embedding", pa.list_(DTYPES[dtype], embedding_dim)),  # p values
            ("top_k_labels", pa.list_(pa.string(), top_k)),  # best first
            ("top_k_indices", pa.list_(pa.int32(), top_k)),
            ("top_k_scores", pa.list_(pa.float32(), top_k)),  # softmax probabilities
            ("typicality_score", pa.float64()),  # null where the model has no reference
            ("typicality_p_value", pa.float64()),
            ("model_name", pa.string()),
            ("model_version", pa.string()),
            ("card_sha256", pa.string()),
            ("file_size", pa.int64()),
            ("file_mtime_ns", pa.int64()),
        ]
    )


class OutputError(ValueError):
    """OUT cannot be used as asked (exists without --resume, another job's, unreadable)."""


@dataclass(frozen=True)
class JobManifest:
    """What every row of OUT was computed with; a resume must compute the same."""

    model_name: str
    model_version: str
    card_sha256: str
    embedding_dim: int
    top_k: int
    normalize: bool
    model_sha256: str = ""  # sha256 of the model file's bytes ("": not recorded, format /1)
    model_file: str = ""  # where that file was (for messages: a moved copy is the same model)
    dtype: str = "float32"  # the stored embedding's (--dtype)
    format: str = FORMAT

    @classmethod
    def from_json(cls, text: str | bytes) -> JobManifest:
        """A manifest as :meth:`to_json` wrote it, or as an older format did (``/1`` without
        the model file's sha256, ``/2`` without the dtype: float32; the first resume records
        both). ``ValueError`` otherwise."""
        fields = json.loads(text)
        if not isinstance(fields, dict):
            raise ValueError("not a JSON object")
        if fields.get("format") in OLDER_FORMATS:
            fields["format"] = FORMAT
        try:
            return cls(**fields)
        except TypeError as error:
            raise ValueError(str(error)) from None

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=2).encode() + b"\n"

    def differences(self, other: JobManifest) -> list[str]:
        """What ``other`` (the manifest found in OUT) computed differently, in words."""
        mine, theirs = asdict(self), asdict(other)
        changed = []
        if other.model_sha256 and other.model_sha256 != self.model_sha256:
            changed.append(
                f"model file {other.model_file or '?'} (sha256 {other.model_sha256[:16]}), not "
                f"{self.model_file or '?'} (sha256 {self.model_sha256[:16]})"
            )
        ignored = {"model_sha256", "model_file"}
        changed += [
            f"{key} {theirs[key]!r} (now {mine[key]!r})"
            for key in mine
            if key not in ignored and mine[key] != theirs[key]
        ]
        return changed


@dataclass(frozen=True)
class Held:
    """One row of OUT: where it is, and the file's size and time when it was read (-1: not
    known, the file could not be read or OUT was written by format /2)."""

    table: str  # EMBEDDINGS or ERRORS
    part: str  # the part's path on OUT's filesystem
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Scan:
    """What OUT holds already."""

    held: dict[str, Held]  # every image in either table, by path (its last row where repeated)
    embedded: int  # rows of the embeddings table
    refused: int  # rows of the errors table
    duplicates: int  # rows whose path is in another row too (none, unless OUT was edited)
    removed_temporary: int  # half-written parts of a stopped job, deleted

    @property
    def done(self) -> frozenset[str]:
        """The paths of every image in either table."""
        return frozenset(self.held)


def _exists(location: Location, path: str) -> pafs.FileType:
    try:
        return location.filesystem.get_file_info(path).type
    except OSError as error:
        raise OutputError(f"{location.uri(path)}: cannot be read ({error})") from None


def prepare(out: Location, manifest: JobManifest, resume: bool) -> None:
    """Make OUT ready: a new folder, or with ``resume`` the folder of the same job (or none).
    :class:`OutputError` where OUT exists and ``resume`` is off, or holds another job."""
    where = out.uri(out.path)
    kind = _exists(out, out.path)
    manifest_path = f"{out.path}/{MANIFEST}"
    if kind == pafs.FileType.File:
        raise OutputError(f"{where} is a file; give a folder for the output")
    if kind == pafs.FileType.Directory:
        has_manifest = _exists(out, manifest_path) == pafs.FileType.File
        selector = pafs.FileSelector(out.path)
        entries = [e for e in out.filesystem.get_file_info(selector) if e.base_name != LOCK]
        if entries and not resume:
            raise OutputError(
                f"{where} exists; pass --resume to continue the job written there, or give a "
                "new folder"
            )
        if entries and not has_manifest:
            raise OutputError(f"{where} is not empty and holds no smso-embed job ({MANIFEST})")
        if has_manifest:
            with out.filesystem.open_input_stream(manifest_path) as stream:
                try:
                    found = JobManifest.from_json(stream.read())
                except ValueError as error:
                    raise OutputError(f"{where}/{MANIFEST} is not readable: {error}") from None
            changed = manifest.differences(found)
            if changed:
                raise OutputError(
                    f"{where} holds another job's output ({'; '.join(changed)}); resume it "
                    "with the same model file and flags, or give a new folder"
                )
    for table in (EMBEDDINGS, ERRORS):
        out.filesystem.create_dir(f"{out.path}/{table}", recursive=True)
    with out.filesystem.open_output_stream(manifest_path) as stream:
        stream.write(manifest.to_json())


def _parts(out: Location, table: str) -> list[pafs.FileInfo]:
    selector = pafs.FileSelector(f"{out.path}/{table}", allow_not_found=True)
    return [info for info in out.filesystem.get_file_info(selector) if info.is_file]


def scan(out: Location, clean: bool = True) -> Scan:
    """The images OUT holds; with ``clean``, half-written temporary parts are deleted (their
    images are written again)."""
    held: dict[str, Held] = {}
    rows = 0
    counts = {EMBEDDINGS: 0, ERRORS: 0}
    removed = 0
    for table in (EMBEDDINGS, ERRORS):
        for info in _parts(out, table):
            if info.base_name.startswith("."):
                if clean and info.base_name.endswith(TEMPORARY):
                    out.filesystem.delete_file(info.path)
                    removed += 1
                continue
            if not info.base_name.endswith(".parquet"):
                continue
            try:
                names = pq.read_schema(info.path, filesystem=out.filesystem).names
                state = [name for name in ("file_size", "file_mtime_ns") if name in names]
                column = pq.read_table(
                    info.path, columns=["path", *state], filesystem=out.filesystem
                )
            except (pa.ArrowInvalid, OSError) as error:
                raise OutputError(
                    f"{out.uri(info.path)} is not a readable Parquet file ({error}); it was not "
                    "written by smso-embed (which renames only whole files): move it away"
                ) from None
            kind = column.schema.field("path").type
            if kind != pa.string():
                raise OutputError(
                    f"{out.uri(info.path)} has a path column of type {kind}, not string: it was "
                    "not written by smso-embed: move it away"
                )
            paths = column.column("path").to_pylist()
            unknown = [UNKNOWN] * len(paths)
            sizes, mtimes = (
                (
                    pc.fill_null(column.column(name), UNKNOWN).to_pylist()
                    if name in state
                    else unknown
                )
                for name in ("file_size", "file_mtime_ns")
            )
            for path, size, mtime in zip(paths, sizes, mtimes, strict=True):
                held[path] = Held(table, info.path, size, mtime)
            rows += len(paths)
            counts[table] += column.num_rows
    return Scan(held, counts[EMBEDDINGS], counts[ERRORS], rows - len(held), removed)
