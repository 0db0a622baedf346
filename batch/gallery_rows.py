"""What ``smso-index`` reads from smso-embed's output: every embedded image of one or more OUT
folders, as the rows of a gallery (:class:`gallery.build.Rows`), with the model's stamp.

Each OUT's manifest (``_smso_embed.json``) names the model that wrote it; every OUT given must
name the same one (the card's checksum decides), and so must every row. The embeddings table is
read column by column (path, embedding, top-1 label, file state), never the errors table: a
refused image is not in the gallery. A path in two OUT folders is refused (two jobs embedded the
same image: give one of them).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from batch.inputs import Location
from batch.outputs import EMBEDDINGS, MANIFEST, JobManifest, OutputError
from gallery.build import Rows
from gallery.stamp import Stamp

__all__ = ["GallerySource", "read_rows"]

COLUMNS = ["path", "embedding", "top_k_indices", "top_k_labels", "file_size", "file_mtime_ns"]


@dataclass(frozen=True)
class GallerySource:
    """The rows of the OUT folders, the model they came from and its class names."""

    rows: Rows
    stamp: Stamp
    classes: tuple[str, ...]  # by index; "" for a class no row has as its top-1
    folders: int


def _manifest(out: Location) -> JobManifest:
    where = out.uri(out.path)
    try:
        with out.filesystem.open_input_stream(f"{out.path}/{MANIFEST}") as stream:
            return JobManifest.from_json(stream.read())
    except FileNotFoundError:
        raise OutputError(f"{where} holds no smso-embed output ({MANIFEST} is missing)") from None
    except OSError as error:
        raise OutputError(f"{where}/{MANIFEST} cannot be read: {error}") from None
    except ValueError as error:
        raise OutputError(f"{where}/{MANIFEST} is not readable: {error}") from None


def _table(out: Location) -> pa.Table:
    where = out.uri(f"{out.path}/{EMBEDDINGS}")
    try:
        dataset = pads.dataset(
            f"{out.path}/{EMBEDDINGS}", format="parquet", filesystem=out.filesystem
        )
        return dataset.to_table(columns=COLUMNS)
    except (pa.ArrowInvalid, OSError) as error:
        raise OutputError(f"{where} cannot be read as smso-embed's embeddings: {error}") from None


def read_rows(outs: Sequence[Location]) -> GallerySource:
    """Every embedded image of ``outs``; :class:`OutputError` in one line where they cannot
    make one gallery."""
    stamp: Stamp | None = None
    first = ""
    normalized = False
    tables = []
    for out in outs:
        manifest = _manifest(out)
        found = Stamp(manifest.model_name, manifest.model_version, manifest.card_sha256)
        where = out.uri(out.path)
        if stamp is None:
            stamp, first, normalized = found, where, manifest.normalize
        elif found.card_sha256 != stamp.card_sha256:
            raise OutputError(
                f"{where} was embedded with {found.describe()}, {first} with "
                f"{stamp.describe()}: one gallery holds one model's embeddings"
            )
        elif manifest.normalize != normalized:
            raise OutputError(f"{where} and {first} differ in --normalize: give one kind")
        tables.append(_table(out))
    if stamp is None:
        raise OutputError("no OUT folder given")
    table = pa.concat_tables(tables)
    paths = table.column("path").to_pylist()
    if len(set(paths)) != len(paths):
        twice = [path for path, n in collections.Counter(paths).items() if n > 1]
        raise OutputError(
            f"{twice[0]} (and {len(twice) - 1} more) is in more than one OUT folder: give each "
            "image once"
        )
    embedding = table.column("embedding").combine_chunks()
    dimension = embedding.type.list_size
    values = pc.list_flatten(embedding).to_numpy(zero_copy_only=False)
    embeddings = values.astype(np.float32).reshape(len(table), dimension)
    top_index = pc.list_element(table.column("top_k_indices"), 0).to_numpy(zero_copy_only=False)
    top_label = pc.list_element(table.column("top_k_labels"), 0).to_pylist()
    names: dict[int, str] = dict(zip(top_index.tolist(), top_label, strict=True))
    classes = tuple(names.get(i, "") for i in range(max(names, default=-1) + 1))
    rows = Rows(
        paths=paths,
        embeddings=embeddings,
        labels=top_index.astype(np.int32),
        file_sizes=_int64(table.column("file_size")),
        file_mtimes=_int64(table.column("file_mtime_ns")),
        normalized=normalized,
    )
    return GallerySource(rows, stamp, classes, len(outs))


def _int64(column: pa.ChunkedArray) -> np.ndarray:
    """A file-state column as int64, -1 where unknown (null)."""
    return pc.fill_null(column, -1).to_numpy(zero_copy_only=False).astype(np.int64)
