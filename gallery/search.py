"""A loaded gallery and its nearest-neighbour search.

:func:`load` reads GALLERY (:mod:`gallery.store`), checks every file against the manifest and
gives one immutable :class:`Gallery`: the codes in usearch's HNSW graph (or, below the size
where a scan is as fast, one matrix that :func:`usearch.index.search` scans exactly), the keys,
paths and labels of the items. :meth:`Gallery.search` takes the model's embeddings ``(Q, p)``,
standardises and encodes them as the gallery's codes (:class:`gallery.codes.Codec`) and answers
each query's ``k`` nearest items, best first, as :class:`Neighbour` values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from usearch.index import BatchMatches, Index, Matches
from usearch.index import search as exact_search

from gallery.codes import Codec, Dtype
from gallery.stamp import Stamp
from gallery.store import GalleryError, Manifest, checked_path, read_array, read_manifest

__all__ = [
    "ExactSearch",
    "Gallery",
    "GraphSearch",
    "Items",
    "Nearest",
    "Neighbour",
    "load",
    "restore",
]

#: the most neighbours one query may ask for
MAX_K = 1_000


@dataclass(frozen=True)
class Neighbour:
    """One gallery item near a query."""

    path: str
    similarity: float  # cosine of the standardised embeddings (b1: of their bits), in [-1, 1]
    label: str  # the item's top-1 class when it was embedded
    key: int  # its key in the gallery


@dataclass(frozen=True)
class Items:
    """What the gallery knows of its items, row ``i`` for key ``keys[i]``; each ``(N,)``."""

    keys: np.ndarray  # uint64, ascending
    path_bytes: bytes  # UTF-8 paths, one after the other
    offsets: np.ndarray  # int64 (N + 1,): path i is path_bytes[offsets[i]:offsets[i + 1]]
    labels: np.ndarray  # int32: class index
    file_sizes: np.ndarray  # int64
    file_mtimes: np.ndarray  # int64, ns

    def __len__(self) -> int:
        return len(self.keys)

    def path(self, row: int) -> str:
        return self.path_bytes[self.offsets[row] : self.offsets[row + 1]].decode()

    def paths(self) -> list[str]:
        return [self.path(row) for row in range(len(self))]

    def rows(self, keys: np.ndarray) -> np.ndarray:
        """The rows of ``keys`` (each must be in the gallery)."""
        return np.searchsorted(self.keys, keys)


class Found(NamedTuple):
    """usearch's answer to ``Q`` queries: keys and distances ``(Q, k)``, and how many of each
    row are real ``(Q,)``."""

    keys: np.ndarray
    distances: np.ndarray
    counts: np.ndarray


class Nearest(NamedTuple):
    """Each of ``Q`` queries' nearest items, best first: their rows in :class:`Items` and
    similarities ``(Q, k')``, and how many of each row are real ``(Q,)`` (a graph may find
    fewer than asked for; the rest of the row is padding)."""

    rows: np.ndarray  # int64
    similarities: np.ndarray  # float64, in [-1, 1]
    counts: np.ndarray  # int64


def _found(result: Matches | BatchMatches, queries: int, key_type: type) -> Found:
    """usearch's answer as :class:`Found` (one query's ``Matches`` has only its real ones)."""
    if isinstance(result, BatchMatches):
        return Found(
            np.asarray(result.keys, key_type).reshape(queries, -1),
            np.asarray(result.distances, np.float64).reshape(queries, -1),
            np.asarray(result.counts, np.int64).reshape(queries),
        )
    keys: np.ndarray = np.asarray(result.keys, key_type).reshape(1, -1)
    distances = np.asarray(result.distances, np.float64).reshape(1, -1)
    return Found(keys, distances, np.array([keys.shape[1]], np.int64))


#: bytes of XOR-ed codes one step of :func:`hamming_scan` holds
_SCAN_BYTES = 1 << 25


def hamming_scan(codes: np.ndarray, queries: np.ndarray, count: int) -> Found:
    """The ``count`` nearest of ``codes`` ``(N, B)`` packed bits to each of ``queries`` ``(Q, B)``
    by Hamming distance, ties by row: rows (as keys), distances in bits ``(Q, count)``.

    ``d(a, b) = popcount(a XOR b)``, summed over the bytes (over 64-bit words where ``B`` is a
    multiple of 8). usearch's own exact search reads a packed row of ``B`` bytes as ``B`` bits
    (usearch 2.25: the first byte alone of a 64-bit code), so binary codes are scanned here."""
    words = np.uint64 if codes.shape[1] % 8 == 0 else np.uint8
    table = np.ascontiguousarray(codes).view(words)  # (N, W)
    asked = np.ascontiguousarray(queries).view(words)  # (Q, W)
    step = max(1, _SCAN_BYTES // max(1, table.nbytes))
    keys = np.empty((len(asked), count), np.int64)
    distances = np.empty((len(asked), count), np.float64)
    for start in range(0, len(asked), step):
        block = asked[start : start + step]
        xor = np.bitwise_xor(table[None, :, :], block[:, None, :])  # (q, N, W)
        d = np.bitwise_count(xor).sum(axis=2, dtype=np.int64)  # (q, N)
        if count < d.shape[1]:  # the count smallest, then in order (ties by row)
            candidates = np.sort(np.argpartition(d, count - 1, axis=1)[:, :count], axis=1)
        else:
            candidates = np.broadcast_to(np.arange(d.shape[1]), d.shape)
        order = np.argsort(np.take_along_axis(d, candidates, axis=1), axis=1, kind="stable")
        nearest = np.take_along_axis(candidates, order, axis=1)
        keys[start : start + len(block)] = nearest
        distances[start : start + len(block)] = np.take_along_axis(d, nearest, axis=1)
    return Found(keys, distances, np.full(len(asked), count, np.int64))


@dataclass(frozen=True)
class ExactSearch:
    """A scan of every code (usearch's exact kernels): for galleries too small for a graph."""

    codes: np.ndarray  # (N, p) or (N, p / 8) codes, row i for key i's row
    keys: np.ndarray  # (N,) the rows' keys
    metric: str

    def __len__(self) -> int:
        return len(self.codes)

    def find(self, codes: np.ndarray, count: int, threads: int, exact: bool) -> Found:
        if self.metric == "hamming":
            found = hamming_scan(self.codes, codes, count)
        else:
            found = _found(
                exact_search(self.codes, codes, count, self.metric, exact=True, threads=threads),
                len(codes),
                np.int64,
            )
        real = np.arange(found.keys.shape[1]) < found.counts[:, None]
        rows = np.where(real, found.keys, 0)  # usearch's keys here: the codes' row numbers
        return Found(self.keys[rows], found.distances, found.counts)


@dataclass(frozen=True)
class GraphSearch:
    """usearch's HNSW graph (``exact``: its exact scan of the same codes)."""

    index: Index

    def __len__(self) -> int:
        return len(self.index)

    def find(self, codes: np.ndarray, count: int, threads: int, exact: bool) -> Found:
        result = self.index.search(codes, count, threads=threads, exact=exact)
        return _found(result, len(codes), np.uint64)


@dataclass(frozen=True)
class Gallery:
    """A gallery ready to search: immutable once loaded (a new build is a new :func:`load`)."""

    folder: Path
    manifest: Manifest
    codec: Codec
    items: Items
    searcher: ExactSearch | GraphSearch

    @property
    def stamp(self) -> Stamp:
        return self.manifest.stamp

    @property
    def size(self) -> int:
        return len(self.items)

    def describe(self) -> dict[str, object]:
        """What ``/metadata`` and the repository index say of it."""
        return {
            "path": str(self.folder),
            "items": self.size,
            "dtype": self.manifest.dtype.value,
            "dimension": self.manifest.dimension,
            "search": self.manifest.search,
            "generation": self.manifest.generation,
            "model_name": self.stamp.model_name,
            "model_version": self.stamp.model_version,
        }

    def nearest(
        self, embeddings: np.ndarray, k: int, exact: bool = False, threads: int = 1
    ) -> Nearest:
        """Each query's ``min(k, N)`` nearest items of ``(Q, p)`` embeddings; ``exact`` scans
        every code even where a graph is."""
        queries = np.atleast_2d(np.asarray(embeddings, np.float32))
        if queries.shape[1] != self.manifest.dimension:
            raise ValueError(
                f"an embedding has {queries.shape[1]} values, "
                f"the gallery's {self.manifest.dimension}"
            )
        count = min(k, self.size)
        if count == 0:
            empty = np.zeros((len(queries), 0))
            return Nearest(empty.astype(np.int64), empty, np.zeros(len(queries), np.int64))
        found = self.searcher.find(self.codec.encode(queries), count, threads, exact)
        keys, counts = found.keys, found.counts
        real = np.arange(keys.shape[1]) < counts[:, None]  # (Q, k'): the found ones
        rows = np.where(real, self.items.rows(np.where(real, keys, self.items.keys[0])), 0)
        distances = np.asarray(found.distances, np.float64)
        return Nearest(rows.astype(np.int64), self.codec.similarity(distances), counts)

    def search(
        self, embeddings: np.ndarray, k: int = 10, min_similarity: float | None = None
    ) -> list[list[Neighbour]]:
        """Each query's nearest items, best first; only those at ``min_similarity`` or above
        where given."""
        rows, similarities, counts = self.nearest(embeddings, k)
        names = self.manifest.classes
        answers: list[list[Neighbour]] = []
        for q in range(len(rows)):
            matches = []
            for j in range(int(counts[q])):
                similarity = float(similarities[q, j])
                if min_similarity is not None and similarity < min_similarity:
                    break
                row = int(rows[q, j])
                label = int(self.items.labels[row])
                matches.append(
                    Neighbour(
                        path=self.items.path(row),
                        similarity=similarity,
                        label=names[label] if 0 <= label < len(names) else "",
                        key=int(self.items.keys[row]),
                    )
                )
            answers.append(matches)
        return answers


def read_items(folder: Path, manifest: Manifest) -> Items:
    """The checked keys, paths and labels of ``manifest``'s items."""
    n, files = manifest.count, manifest.files
    keys = read_array(folder, files["keys"], np.dtype(np.uint64), n)
    if n and (np.diff(keys.astype(np.int64)) <= 0).any():
        raise GalleryError(f"{folder / files['keys'].name}: the keys are not ascending")
    offsets = read_array(folder, files["offsets"], np.dtype(np.int64), n + 1)
    path_bytes = checked_path(folder, files["paths"]).read_bytes()
    if offsets[0] != 0 or offsets[-1] != len(path_bytes) or (np.diff(offsets) < 0).any():
        raise GalleryError(f"{folder / files['offsets'].name} does not cut the paths file")
    try:  # every path once, so that no search meets a path it cannot give
        path_bytes.decode()
    except UnicodeDecodeError as error:
        where = folder / files["paths"].name
        raise GalleryError(f"{where} is not UTF-8 paths (byte {error.start})") from None
    return Items(
        keys=keys,
        path_bytes=path_bytes,
        offsets=offsets,
        labels=read_array(folder, files["labels"], np.dtype(np.int32), n),
        file_sizes=read_array(folder, files["file_sizes"], np.dtype(np.int64), n),
        file_mtimes=read_array(folder, files["file_mtimes"], np.dtype(np.int64), n),
    )


def code_dtype(dtype: Dtype) -> np.dtype:
    """The numpy type of one code's values."""
    return np.dtype(
        {Dtype.F32: np.float32, Dtype.F16: np.float16, Dtype.I8: np.int8, Dtype.B1: np.uint8}[dtype]
    )


def load(folder: Path) -> Gallery:
    """GALLERY, checked; :class:`GalleryError` with one line naming what is wrong."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    needed = {"keys", "paths", "offsets", "labels", "file_sizes", "file_mtimes"}
    needed |= {"index"} if manifest.search == "hnsw" else {"codes"}
    if missing := needed - set(manifest.files):
        raise GalleryError(f"{folder}'s manifest names no {', '.join(sorted(missing))} file")
    items = read_items(folder, manifest)
    codec = Codec(manifest.dtype, manifest.standardisation, manifest.normalized)
    width = manifest.dtype.bytes_per_item(manifest.dimension)
    searcher: ExactSearch | GraphSearch
    if manifest.search == "exact":
        codes = read_array(
            folder, manifest.files["codes"], code_dtype(manifest.dtype), len(items), ndim=2
        )
        if codes.ndim != 2 or codes.shape[1] * codes.itemsize != width:
            raise GalleryError(f"{folder}: the codes are {codes.shape}, not {width} bytes each")
        searcher = ExactSearch(codes, items.keys, manifest.dtype.metric)
    else:
        path = checked_path(folder, manifest.files["index"])
        searcher = GraphSearch(restore(path, manifest))
        if len(searcher) != len(items):
            raise GalleryError(f"{path} holds {len(searcher)} items, the manifest {len(items)}")
    return Gallery(folder, manifest, codec, items, searcher)


def restore(path: Path, manifest: Manifest) -> Index:
    """usearch's graph from ``path``, its kind checked against the manifest's."""
    try:
        meta = Index.metadata(str(path))
    except (RuntimeError, ValueError) as error:
        raise GalleryError(f"{path} is not a usearch index: {error}") from None
    if not meta or meta.get("dimensions") != manifest.dimension:
        raise GalleryError(f"{path} is not a usearch index of {manifest.dimension} dimensions")
    index = Index(
        ndim=manifest.dimension,
        metric=manifest.dtype.metric,
        dtype=manifest.dtype.value,
        connectivity=manifest.hnsw.connectivity,
        expansion_add=manifest.hnsw.expansion_add,
        expansion_search=manifest.hnsw.expansion_search,
    )
    try:
        index.load(str(path))
    except (RuntimeError, ValueError) as error:
        raise GalleryError(f"{path} cannot be loaded by usearch: {error}") from None
    return index
