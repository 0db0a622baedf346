"""The output folder: two Parquet datasets, written exactly once, and what a resume reads back.

Layout of OUT (a local folder or any URI pyarrow writes)::

    OUT/_smso_embed.json           the job: the model file's and card's checksums, --normalize...
    OUT/_smso_embed.lock           held by the job running on OUT (:mod:`batch.lock`)
    OUT/embeddings/part-<h>.parquet   one row per image embedded (:func:`embeddings_schema`)
    OUT/errors/part-<h>.parquet       one row per image refused or unreadable (:data:`ERRORS`)

Each write task of Ray Data (:class:`PartsSink`, a ``Datasink``) writes the rows it is given as
one file per table, named by a hash of the paths in it (``<h>``: the same images, the same
name, however often a retried task writes them), first under a hidden temporary name
(``.part-<h>.parquet.<uuid>.tmp``) and then renamed: a reader (pyarrow, DuckDB, pandas, Ray
itself all skip names starting with ``.`` or ``_``) never sees half a file, and a job killed
mid-write leaves only a temporary file, which the next ``--resume`` deletes (:func:`scan`).

``--resume`` (:func:`scan`) reads the ``path`` column of every part of both tables: those images
are done (embedded or refused) and are not read again, so every image is written once across
any number of stopped and resumed runs. A part holds ``rows_per_file`` images (the last ones
fewer) in one row group: large enough for pyarrow, DuckDB or pandas to read a whole dataset
quickly, small enough that a stopped job loses little.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from ray.data import Datasink
from ray.data.block import Block, BlockAccessor
from ray.data.datasource.datasink import WriteResult

from batch.inputs import Location

__all__ = [
    "EMBEDDINGS",
    "ERRORS",
    "ERRORS_SCHEMA",
    "MANIFEST",
    "JobManifest",
    "OutputError",
    "PartsSink",
    "Scan",
    "WriteCounts",
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
FORMAT = "smso-embed/2"  # /1 did not record the model file's sha256

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
    ]
)


def embeddings_schema(embedding_dim: int, top_k: int) -> pa.Schema:
    """The embeddings table: one row per image, in a part's path order."""
    return pa.schema(
        [
            ("path", pa.string()),
            ("embedding", pa.list_(pa.float32(), embedding_dim)),  # p values, float32
            ("top_k_labels", pa.list_(pa.string(), top_k)),  # best first
            ("top_k_indices", pa.list_(pa.int32(), top_k)),
            ("top_k_scores", pa.list_(pa.float32(), top_k)),  # softmax probabilities
            ("typicality_score", pa.float64()),  # null where the model has no reference
            ("typicality_p_value", pa.float64()),
            ("model_name", pa.string()),
            ("model_version", pa.string()),
            ("card_sha256", pa.string()),
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
    format: str = FORMAT

    @classmethod
    def from_json(cls, text: str | bytes) -> JobManifest:
        """A manifest as :meth:`to_json` wrote it, or as format ``smso-embed/1`` did (without
        the model file's sha256: the first resume records it). ``ValueError`` otherwise."""
        fields = json.loads(text)
        if not isinstance(fields, dict):
            raise ValueError("not a JSON object")
        if fields.get("format") == "smso-embed/1" and "model_sha256" not in fields:
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
class Scan:
    """What OUT holds already."""

    done: frozenset[str]  # the paths of every image in either table
    embedded: int  # rows of the embeddings table
    refused: int  # rows of the errors table
    duplicates: int  # rows whose path is in another row too (none, unless OUT was edited)
    removed_temporary: int  # half-written parts of a stopped job, deleted


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
    paths: list[pa.ChunkedArray] = []
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
                column = pq.read_table(info.path, columns=["path"], filesystem=out.filesystem)
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
            paths.append(column.column("path"))
            counts[table] += column.num_rows
    every = pa.chunked_array(paths, pa.string()) if paths else pa.chunked_array([], pa.string())
    unique = pc.unique(every)
    return Scan(
        frozenset(unique.to_pylist()),
        counts[EMBEDDINGS],
        counts[ERRORS],
        len(every) - len(unique),
        removed,
    )


@dataclass(frozen=True)
class WriteCounts:
    """What one write task wrote: images embedded, and images refused by error kind."""

    embedded: int = 0
    refused: tuple[tuple[str, int], ...] = ()  # (kind, images), by kind


def _part_name(paths: pa.Array) -> str:
    """``part-<h>.parquet``: ``h`` from the paths, in order (the same rows, the same name)."""
    digest = hashlib.sha256()
    for path in paths.to_pylist():
        digest.update(path.encode())
        digest.update(b"\0")
    return f"part-{digest.hexdigest()[:32]}.parquet"


class PartsSink(Datasink[WriteCounts]):
    """Ray Data's write tasks: :class:`batch.embedder.Embedder`'s rows split into the
    embeddings and the errors table, one part each per task, renamed into place whole."""

    def __init__(
        self,
        out: Location,
        classes: list[str],
        identity: dict[str, str],
        embedding_dim: int,
        top_k: int,
        rows_per_file: int,
    ) -> None:
        self.out = out
        self.classes = classes
        self.identity = identity  # model_name, model_version, card_sha256
        self.schema = embeddings_schema(embedding_dim, top_k)
        self.rows_per_file = rows_per_file
        self.counts: list[WriteCounts] = []

    @property
    def supports_distributed_writes(self) -> bool:
        # a local folder is the driver's: every write runs on the driver's node
        return not isinstance(self.out.filesystem, pafs.LocalFileSystem)

    @property
    def min_rows_per_write(self) -> int:
        return self.rows_per_file

    def _constant(self, name: str, rows: int) -> pa.Array:
        return pa.array([self.identity[name]] * rows, pa.string())

    def _labels(self, indices: pa.FixedSizeListArray) -> pa.Array:
        classes = pa.array(self.classes, pa.string())
        labels = pc.take(classes, indices.flatten())
        return pa.FixedSizeListArray.from_arrays(labels, indices.type.list_size)

    def _write(self, table: pa.Table, folder: str, name: str) -> None:
        filesystem = self.out.filesystem
        final = f"{self.out.path}/{folder}/{name}"
        temporary = f"{self.out.path}/{folder}/.{name}.{uuid.uuid4().hex}{TEMPORARY}"
        try:
            with filesystem.open_output_stream(temporary) as stream:
                pq.write_table(table, stream, row_group_size=max(len(table), 1))
            filesystem.move(temporary, final)  # atomic on a local disk; S3 writes objects whole
        except BaseException:
            if _present(filesystem, temporary):
                filesystem.delete_file(temporary)
            raise

    def write(self, blocks: Iterable[Block], ctx: Any) -> WriteCounts:
        tables = [BlockAccessor.for_block(block).to_arrow() for block in blocks]
        tables = [table for table in tables if table.num_rows]
        if not tables:
            return WriteCounts()
        rows = pa.concat_tables(tables)
        name = _part_name(rows.column("path").combine_chunks())
        failed = pc.is_valid(rows.column("error_kind"))
        good = rows.filter(pc.invert(failed))
        bad = rows.filter(failed)
        if good.num_rows:
            indices = good.column("top_k_indices").combine_chunks()
            n = good.num_rows
            embedded = pa.Table.from_arrays(
                [
                    good.column("path"),
                    good.column("embedding"),
                    self._labels(indices),
                    indices,
                    good.column("top_k_scores"),
                    good.column("typicality_score"),
                    good.column("typicality_p_value"),
                    self._constant("model_name", n),
                    self._constant("model_version", n),
                    self._constant("card_sha256", n),
                ],
                schema=self.schema,
            )
            self._write(embedded, EMBEDDINGS, name)
        if bad.num_rows:
            n = bad.num_rows
            errors = pa.Table.from_arrays(
                [
                    bad.column("path"),
                    bad.column("error_kind"),
                    bad.column("error"),
                    self._constant("model_name", n),
                    self._constant("model_version", n),
                    self._constant("card_sha256", n),
                ],
                schema=ERRORS_SCHEMA,
            )
            self._write(errors, ERRORS, name)
        kinds = pc.value_counts(bad.column("error_kind")).to_pylist() if bad.num_rows else []
        refused = tuple(sorted((str(kind["values"]), int(kind["counts"])) for kind in kinds))
        return WriteCounts(good.num_rows, refused)

    def on_write_complete(self, write_result: WriteResult[WriteCounts]) -> None:
        self.counts = list(write_result.write_returns)


def _present(filesystem: pafs.FileSystem, path: str) -> bool:
    try:
        return bool(filesystem.get_file_info(path).is_file)
    except OSError:
        return False
