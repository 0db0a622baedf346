"""OUT's parts: the images to do cut into chunks, each chunk written whole, once.

:func:`chunked` cuts the sorted list of images to do into chunks of ``rows_per_file``: chunk
``c`` holds images ``c * rows_per_file`` to ``(c + 1) * rows_per_file - 1``. Each image's row
carries its chunk through every stage, in any engine and in any order; :class:`PartCollector`
gathers the rows of each chunk and, once the chunk is complete, hands them to
:class:`PartWriter`, which writes them sorted by path as ``embeddings/part-<h>.parquet`` and
``errors/part-<h>.parquet`` (``h``: a hash of the chunk's paths). The same images to do give
the same files, row for row and name for name, whichever engine embedded them.

:func:`rewrite_part` takes rows out of a part (images deleted or changed since, errors to
retry): the part is first renamed to a hidden temporary name, then its kept rows are written
under the name of their own paths, then the old file is deleted. A job killed between the steps
leaves the kept rows out of OUT, never twice in it: the next ``--resume`` embeds them again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from batch.decoding import UNKNOWN
from batch.inputs import Location
from batch.outputs import DTYPES, EMBEDDINGS, ERRORS, ERRORS_SCHEMA, TEMPORARY, embeddings_schema
from batch.stages import StageTimes

__all__ = [
    "PartCollector",
    "PartWriter",
    "WriteCounts",
    "chunked",
    "part_name",
    "rewrite_part",
]


def chunked(todo: list[str], rows_per_file: int) -> pa.Table:
    """``todo`` (sorted) as a table ``path`` (string), ``chunk`` (int64): image ``i`` in chunk
    ``i // rows_per_file``."""
    chunks = np.arange(len(todo), dtype=np.int64) // rows_per_file
    return pa.table({"path": pa.array(todo, pa.string()), "chunk": pa.array(chunks)})


def part_name(paths: pa.Array | pa.ChunkedArray) -> str:
    """``part-<h>.parquet``: ``h`` from the paths, in order (the same rows, the same name)."""
    digest = hashlib.sha256()
    for path in paths.to_pylist():
        digest.update(path.encode())
        digest.update(b"\0")
    return f"part-{digest.hexdigest()[:32]}.parquet"


@dataclass
class WriteCounts:
    """What was written: images embedded, and images refused by error kind."""

    embedded: int = 0
    refused: dict[str, int] = field(default_factory=dict)

    def add(self, other: WriteCounts) -> None:
        self.embedded += other.embedded
        for kind, images in other.refused.items():
            self.refused[kind] = self.refused.get(kind, 0) + images

    @property
    def images(self) -> int:
        return self.embedded + sum(self.refused.values())


def _write_whole(out: Location, folder: str, name: str, table: pa.Table) -> None:
    """``table`` as ``OUT/folder/name``: written under a hidden temporary name, then renamed
    (atomic on a local disk; an object store writes objects whole)."""
    filesystem = out.filesystem
    final = f"{out.path}/{folder}/{name}"
    temporary = f"{out.path}/{folder}/.{name}.{uuid.uuid4().hex}{TEMPORARY}"
    try:
        with filesystem.open_output_stream(temporary) as stream:
            pq.write_table(table, stream, row_group_size=max(len(table), 1))
        filesystem.move(temporary, final)
    except BaseException:
        if _present(filesystem, temporary):
            filesystem.delete_file(temporary)
        raise


def _present(filesystem: pafs.FileSystem, path: str) -> bool:
    try:
        return bool(filesystem.get_file_info(path).is_file)
    except OSError:
        return False


def _known(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A file-state column with -1 (not read) as null."""
    return pc.if_else(pc.equal(column, UNKNOWN), pa.scalar(None, pa.int64()), column)


class PartWriter:
    """A chunk's rows (:func:`batch.embedder.row_schema`) as its parts of the two tables."""

    def __init__(
        self,
        out: Location,
        classes: list[str],
        identity: dict[str, str],
        embedding_dim: int,
        top_k: int,
        dtype: str = "float32",
    ) -> None:
        self.out = out
        self.classes = pa.array(classes, pa.string())
        self.identity = identity  # model_name, model_version, card_sha256
        self.schema = embeddings_schema(embedding_dim, top_k, dtype)
        self.dtype = DTYPES[dtype]

    def _constant(self, name: str, rows: int) -> pa.Array:
        return pa.array([self.identity[name]] * rows, pa.string())

    def _labels(self, indices: pa.FixedSizeListArray) -> pa.Array:
        labels = pc.take(self.classes, indices.flatten())
        return pa.FixedSizeListArray.from_arrays(labels, indices.type.list_size)

    def _embedding(self, column: pa.ChunkedArray) -> pa.Array:
        vectors = column.combine_chunks()
        if vectors.type.value_type == self.dtype:
            return vectors
        flat = vectors.flatten().to_numpy(zero_copy_only=False)
        stored = pa.array(flat.astype(self.dtype.to_pandas_dtype()), self.dtype)
        return pa.FixedSizeListArray.from_arrays(stored, vectors.type.list_size)

    def write(self, rows: pa.Table) -> WriteCounts:
        """Write one chunk's ``rows``, sorted by path; the counts written."""
        if not rows.num_rows:
            return WriteCounts()
        rows = rows.sort_by("path")
        name = part_name(rows.column("path"))
        failed = pc.is_valid(rows.column("error_kind"))
        good = rows.filter(pc.invert(failed))
        bad = rows.filter(failed)
        if good.num_rows:
            indices = good.column("top_k_indices").combine_chunks()
            n = good.num_rows
            embedded = pa.Table.from_arrays(
                [
                    good.column("path"),
                    self._embedding(good.column("embedding")),
                    self._labels(indices),
                    indices,
                    good.column("top_k_scores"),
                    good.column("typicality_score"),
                    good.column("typicality_p_value"),
                    self._constant("model_name", n),
                    self._constant("model_version", n),
                    self._constant("card_sha256", n),
                    _known(good.column("file_size")),
                    _known(good.column("file_mtime_ns")),
                ],
                schema=self.schema,
            )
            _write_whole(self.out, EMBEDDINGS, name, embedded)
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
                    _known(bad.column("file_size")),
                    _known(bad.column("file_mtime_ns")),
                ],
                schema=ERRORS_SCHEMA,
            )
            _write_whole(self.out, ERRORS, name, errors)
        kinds = pc.value_counts(bad.column("error_kind")).to_pylist() if bad.num_rows else []
        refused = {str(kind["values"]): int(kind["counts"]) for kind in kinds}
        return WriteCounts(good.num_rows, refused)


class PartCollector:
    """Rows in any order and any grouping -> each chunk written once it is complete.

    ``chunks`` is :func:`chunked`'s table. :meth:`add` may be called from one thread at a
    time (the writer thread, or the driver iterating Ray's output); :attr:`written` and
    :meth:`times` may be read from any thread (the progress line)."""

    def __init__(self, writer: PartWriter, chunks: pa.Table) -> None:
        self.writer = writer
        ids = chunks.column("chunk").to_numpy()
        self.expected = np.bincount(ids) if len(ids) else np.zeros(0, np.int64)
        self.pending: dict[int, list[pa.Table]] = {}
        self.rows: dict[int, int] = {}
        self.counts = WriteCounts()
        self.written = 0  # images in parts renamed into OUT
        self.first_part_s = 0.0  # time.perf_counter() when the first part was in OUT
        self._times = StageTimes()
        self._lock = threading.Lock()

    def add(self, rows: pa.Table) -> None:
        """Take ``rows`` (:func:`batch.embedder.row_schema`); write the chunks they complete."""
        if not rows.num_rows:
            return
        with self._lock:
            self._times.add_rows(rows)
        ids = rows.column("chunk").to_numpy()
        for chunk in np.unique(ids):
            part = rows.filter(pa.array(ids == chunk)) if len(np.unique(ids)) > 1 else rows
            key = int(chunk)
            self.pending.setdefault(key, []).append(part)
            self.rows[key] = self.rows.get(key, 0) + part.num_rows
            if self.rows[key] > self.expected[key]:
                raise RuntimeError(f"chunk {key}: more rows than images ({self.rows[key]:,})")
            if self.rows[key] == self.expected[key]:
                self._write(key)

    def _write(self, chunk: int) -> None:
        start = time.perf_counter()
        counts = self.writer.write(pa.concat_tables(self.pending.pop(chunk)))
        with self._lock:
            self._times.write_s += time.perf_counter() - start
        self.counts.add(counts)
        self.written += counts.images
        if not self.first_part_s:
            self.first_part_s = time.perf_counter()

    def missing(self) -> int:
        """Images of the chunks not written (0 after a job that ran to its end)."""
        return int(self.expected.sum()) - self.written

    def times(self) -> StageTimes:
        """The stages' busy seconds so far (a copy)."""
        with self._lock:
            return dataclasses.replace(self._times)


def rewrite_part(out: Location, path: str, drop: frozenset[str]) -> int:
    """Take the rows whose path is in ``drop`` out of the part at ``path`` (on OUT's
    filesystem); the rows taken out. The part keeps its other rows under their own name, or is
    deleted where none is left."""
    filesystem = out.filesystem
    table = pq.read_table(path, filesystem=filesystem)
    keep = pc.invert(pc.is_in(table.column("path"), pa.array(sorted(drop), pa.string())))
    kept = table.filter(keep)
    folder, _, name = path.rpartition("/")
    hidden = f"{folder}/.{name}.{uuid.uuid4().hex}{TEMPORARY}"
    filesystem.move(path, hidden)  # from here, the part's rows are out of OUT
    if kept.num_rows:
        table_folder = folder.rpartition("/")[2]
        _write_whole(out, table_folder, part_name(kept.column("path")), kept)
    filesystem.delete_file(hidden)
    return table.num_rows - kept.num_rows
