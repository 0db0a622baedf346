"""Writing a gallery: a first build, and the update that follows a resumed ``smso-embed``.

:func:`build` takes every current row (:class:`Rows`: the paths, embeddings and top-1 labels,
and the state of each file as it was embedded) and the folder:

* no gallery there: the standardisation is fitted on the rows
  (:class:`gallery.codes.Standardisation`), every row is encoded and written;
* a gallery of the same model and dtype: the rows are compared with its items by path and file
  state. New paths are added, deleted ones removed, and changed ones (another size or mtime:
  ``smso-embed --resume`` embedded them again) removed and added again; the others keep their
  codes and keys. usearch's graph takes the removals and additions in place; a graph whose
  removed slots outnumber the live ones is rebuilt from the live codes, and so is one that
  grows past ``exact_below`` from an exact gallery;
* a gallery of another model or dtype, or ``rebuild``: built again from scratch.

Below ``exact_below`` items the gallery is a scan of one matrix (as fast as the graph there, and
exact); from it up, usearch's HNSW graph. :class:`BuildSummary` says what was done.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import usearch
from usearch.index import Index

from gallery.codes import Codec, Dtype, Standardisation
from gallery.lock import LOCK, hold
from gallery.search import code_dtype, read_items, restore
from gallery.stamp import Stamp, StampMismatchError
from gallery.store import (
    MANIFEST,
    FileEntry,
    GalleryError,
    Hnsw,
    Manifest,
    checked_path,
    entry_of,
    new_generation,
    read_array,
    read_manifest,
    write_array,
    write_manifest,
)

__all__ = ["EXACT_BELOW", "BuildOptions", "BuildSummary", "Rows", "build"]

#: the size from which a graph answers faster than a scan of every code: one f32 query of the
#: shipped model on 2 cores took 48 us scanned and 59 us in the graph at 1,000 items, 99 and 61
#: at 2,000, 813 and 133 at 20,000 (``python -m bench.search --only crossover``, docs/search.md)
EXACT_BELOW = 1_000


@dataclass(frozen=True)
class Rows:
    """The items a gallery is to hold, row ``i`` each; the file state says which version of
    each image was embedded."""

    paths: Sequence[str]
    embeddings: np.ndarray  # (N, p) float32
    labels: np.ndarray  # (N,) int32: top-1 class index
    file_sizes: np.ndarray  # (N,) int64
    file_mtimes: np.ndarray  # (N,) int64, ns
    normalized: bool = False  # the embeddings are of unit length (smso-embed --normalize)

    def __len__(self) -> int:
        return len(self.paths)


@dataclass(frozen=True)
class BuildOptions:
    """How to build (``smso-index``'s flags)."""

    dtype: Dtype = Dtype.F32
    exact_below: int = EXACT_BELOW  # fewer items than this: an exact scan, no graph
    hnsw: Hnsw = field(default_factory=Hnsw)
    rebuild: bool = False  # from scratch even where an update would do
    # usearch's threads adding to the graph: one, since its concurrent adds leave some items
    # that no search reaches (unum-cloud/USearch#735: 1 to 9 of 20,000 here)
    threads: int = 1


@dataclass(frozen=True)
class BuildSummary:
    """What a build did."""

    items: int
    added: int
    changed: int
    removed: int
    kept: int
    rebuilt: bool  # from scratch (a first build, another model or dtype, or asked for)
    search: str
    dtype: str
    seconds: float
    bytes_on_disk: int
    reason: str  # why it was rebuilt, or "" for an update


def build(
    folder: Path, rows: Rows, stamp: Stamp, classes: Sequence[str], options: BuildOptions
) -> BuildSummary:
    """GALLERY holding exactly ``rows``, built or updated (see the module's docstring)."""
    started = time.perf_counter()
    folder = Path(folder)
    if len(set(rows.paths)) != len(rows):
        raise GalleryError("the rows hold a path more than once")
    if len(rows) < 2:
        raise GalleryError(f"a gallery needs at least 2 images, the embeddings hold {len(rows)}")
    with hold(folder):  # one build at a time (gallery.lock)
        return _build(folder, rows, stamp, classes, options, started)


def _build(
    folder: Path,
    rows: Rows,
    stamp: Stamp,
    classes: Sequence[str],
    options: BuildOptions,
    started: float,
) -> BuildSummary:
    existing, reason = _existing(folder, stamp, rows.normalized, options)
    generation = new_generation()
    if existing is None:
        plan = _Plan.fresh(rows, options)
    else:
        plan = _Plan.update(folder, existing, rows, options)
    files = _write(folder, generation, plan)
    manifest = Manifest(
        stamp=stamp,
        dtype=options.dtype,
        dimension=plan.codec.dimension,
        count=len(plan.keys),
        classes=tuple(classes),
        standardisation=plan.codec.standardisation,
        normalized=plan.codec.normalized,
        search=plan.search,
        hnsw=options.hnsw,
        files=files,
        generation=generation,
        next_key=plan.next_key,
        library=f"usearch {usearch.__version__}",
    )
    write_manifest(folder, manifest)
    on_disk = sum(entry.bytes for entry in files.values()) + (folder / MANIFEST).stat().st_size
    return BuildSummary(
        items=len(plan.keys),
        added=plan.added,
        changed=plan.changed,
        removed=plan.removed,
        kept=plan.kept,
        rebuilt=existing is None,
        search=plan.search,
        dtype=options.dtype.value,
        seconds=time.perf_counter() - started,
        bytes_on_disk=on_disk,
        reason=reason,
    )


def _existing(
    folder: Path, stamp: Stamp, normalized: bool, options: BuildOptions
) -> tuple[Manifest | None, str]:
    """The gallery to update, or None and why it is built from scratch."""
    if not folder.exists():
        return None, "a new gallery"
    if not folder.is_dir():
        raise GalleryError(f"{folder} is a file, not a gallery folder")
    if not (folder / MANIFEST).exists():
        if any(path.name != LOCK for path in folder.iterdir()):
            raise GalleryError(
                f"{folder} holds files and no {MANIFEST}: not a gallery; give an empty or new "
                "folder"
            )
        return None, "a new gallery"
    existing = read_manifest(folder)
    if options.rebuild:
        return None, "--rebuild"
    try:
        existing.stamp.require(stamp, f"the gallery in {folder}", "the embeddings given")
    except StampMismatchError as error:
        return None, f"another model: {error}"
    if existing.dtype is not options.dtype:
        return None, f"another dtype ({existing.dtype.value} to {options.dtype.value})"
    if existing.normalized != normalized:
        return None, "embeddings normalised to unit length where they were not, or the reverse"
    return existing, ""


@dataclass
class _Plan:
    """The gallery to write: its codec, items (in key order) and codes or graph."""

    codec: Codec
    keys: np.ndarray  # (N,) uint64 ascending
    paths: list[str]
    labels: np.ndarray
    file_sizes: np.ndarray
    file_mtimes: np.ndarray
    content: np.ndarray | Index  # an exact gallery's codes (N, w), or the graph holding them
    next_key: int
    added: int
    changed: int
    removed: int
    kept: int

    @property
    def search(self) -> str:
        return "hnsw" if isinstance(self.content, Index) else "exact"

    @classmethod
    def fresh(cls, rows: Rows, options: BuildOptions) -> _Plan:
        order = np.argsort(np.asarray(rows.paths, dtype=object), kind="stable")
        embeddings = np.asarray(rows.embeddings, np.float32)[order]
        codec = Codec(options.dtype, Standardisation.fit(embeddings), rows.normalized)
        codes = codec.encode(embeddings)
        keys = np.arange(len(rows), dtype=np.uint64)
        return cls(
            codec=codec,
            keys=keys,
            paths=[rows.paths[i] for i in order],
            labels=np.asarray(rows.labels, np.int32)[order],
            file_sizes=np.asarray(rows.file_sizes, np.int64)[order],
            file_mtimes=np.asarray(rows.file_mtimes, np.int64)[order],
            content=_graph(codec.dimension, options, keys, codes)
            if len(keys) >= options.exact_below
            else codes,
            next_key=len(rows),
            added=len(rows),
            changed=0,
            removed=0,
            kept=0,
        )

    @classmethod
    def update(cls, folder: Path, existing: Manifest, rows: Rows, options: BuildOptions) -> _Plan:
        items = read_items(folder, existing)
        codec = Codec(existing.dtype, existing.standardisation, existing.normalized)
        old_paths = items.paths()
        old_row = {path: i for i, path in enumerate(old_paths)}
        new_sizes = np.asarray(rows.file_sizes, np.int64)
        new_mtimes = np.asarray(rows.file_mtimes, np.int64)
        keep_old = np.zeros(len(items), bool)
        add: list[int] = []
        changed = 0
        for i, path in enumerate(rows.paths):
            j = old_row.get(path)
            if j is None:
                add.append(i)
            elif items.file_sizes[j] == new_sizes[i] and items.file_mtimes[j] == new_mtimes[i]:
                keep_old[j] = True
            else:
                add.append(i)
                changed += 1
        removed_keys = items.keys[~keep_old]
        added_keys = np.arange(existing.next_key, existing.next_key + len(add), dtype=np.uint64)
        added_codes = codec.encode(np.asarray(rows.embeddings, np.float32)[add])
        keys = np.concatenate([items.keys[keep_old], added_keys])
        plan = cls(
            codec=codec,
            keys=keys,
            paths=[p for p, kept in zip(old_paths, keep_old, strict=True) if kept]
            + [rows.paths[i] for i in add],
            labels=np.concatenate([items.labels[keep_old], np.asarray(rows.labels, np.int32)[add]]),
            file_sizes=np.concatenate([items.file_sizes[keep_old], new_sizes[add]]),
            file_mtimes=np.concatenate([items.file_mtimes[keep_old], new_mtimes[add]]),
            content=added_codes,  # replaced below by every code, or the graph
            next_key=existing.next_key + len(add),
            added=len(add) - changed,
            changed=changed,
            removed=int((~keep_old).sum()) - changed,
            kept=int(keep_old.sum()),
        )
        if existing.search == "exact":
            old_codes = read_array(
                folder, existing.files["codes"], code_dtype(existing.dtype), len(items), ndim=2
            )
            codes = np.concatenate([old_codes[keep_old], added_codes])
            big = len(keys) >= options.exact_below
            plan.content = _graph(codec.dimension, options, keys, codes) if big else codes
            return plan
        graph = restore(checked_path(folder, existing.files["index"]), existing)
        if len(removed_keys):
            graph.remove(removed_keys)
        if len(added_keys):
            graph.add(added_keys, added_codes, threads=options.threads)
        meta = Index.metadata(str(folder / existing.files["index"].name)) or {}
        deleted = int(meta.get("count_deleted", 0))
        if deleted + len(removed_keys) > len(graph):  # more dead slots than live items: compact
            live = np.asarray(graph.get(keys), dtype=code_dtype(existing.dtype))
            graph = _graph(codec.dimension, options, keys, live.reshape(len(keys), -1))
        plan.content = graph
        return plan


def _graph(dimension: int, options: BuildOptions, keys: np.ndarray, codes: np.ndarray) -> Index:
    """usearch's HNSW graph of ``codes`` under ``keys``."""
    graph = Index(
        ndim=dimension,
        metric=options.dtype.metric,
        dtype=options.dtype.value,
        connectivity=options.hnsw.connectivity,
        expansion_add=options.hnsw.expansion_add,
        expansion_search=options.hnsw.expansion_search,
    )
    if len(keys):
        graph.add(keys, codes, threads=options.threads)
    return graph


def _write(folder: Path, generation: str, plan: _Plan) -> dict[str, FileEntry]:
    """The plan's files under ``generation``; their entries for the manifest."""
    encoded = [path.encode() for path in plan.paths]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    paths_file = folder / f"paths-{generation}.bin"
    paths_file.write_bytes(b"".join(encoded))
    files = {
        "keys": write_array(folder, f"keys-{generation}.npy", plan.keys.astype(np.uint64)),
        "paths": entry_of(paths_file),
        "offsets": write_array(folder, f"offsets-{generation}.npy", offsets),
        "labels": write_array(folder, f"labels-{generation}.npy", plan.labels.astype(np.int32)),
        "file_sizes": write_array(folder, f"file_sizes-{generation}.npy", plan.file_sizes),
        "file_mtimes": write_array(folder, f"file_mtimes-{generation}.npy", plan.file_mtimes),
    }
    if isinstance(plan.content, Index):
        index_file = folder / f"index-{generation}.usearch"
        plan.content.save(str(index_file))
        files["index"] = entry_of(index_file)
    else:
        files["codes"] = write_array(folder, f"codes-{generation}.npy", plan.content)
    return files
