"""Galleries built, searched, updated and refused, against numpy's exact cosine search."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from gallery.build import BuildOptions, Rows, build
from gallery.codes import Dtype
from gallery.lock import LOCK, GalleryInUseError
from gallery.search import hamming_scan, load
from gallery.stamp import Stamp, StampMismatchError
from gallery.store import MANIFEST, GalleryError
from tests.gallery.test_codes import embeddings

STAMP = Stamp("toy-smso", "0123456789ab", "a" * 64)
CLASSES = ("zero", "one", "two")


def rows(x: np.ndarray, start: int = 0, mtime: int = 1) -> Rows:
    n = len(x)
    return Rows(
        paths=[f"images/{i:06d}.png" for i in range(start, start + n)],
        embeddings=x,
        labels=(np.arange(start, start + n) % 3).astype(np.int32),
        file_sizes=np.full(n, 100, np.int64),
        file_mtimes=np.full(n, mtime, np.int64),
    )


def exact_top(gallery_x: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """numpy's k nearest by the cosine of the standardised embeddings: the reference."""
    mu, sigma = gallery_x.mean(axis=0), gallery_x.std(axis=0)
    g, q = (gallery_x - mu) / sigma, (queries - mu) / sigma
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return np.argsort(-(q @ g.T), axis=1, kind="stable")[:, :k]


def test_an_exact_gallery_answers_numpys_neighbours(tmp_path):
    x = embeddings(999, 16)  # below EXACT_BELOW
    summary = build(tmp_path / "g", rows(x), STAMP, CLASSES, BuildOptions())
    assert (summary.items, summary.added, summary.search, summary.rebuilt) == (
        999,
        999,
        "exact",
        True,
    )
    gallery = load(tmp_path / "g")
    queries = embeddings(20, 16, seed=1)
    found = gallery.search(queries, k=5)
    want = exact_top(x, queries, 5)
    for answer, expected in zip(found, want, strict=True):
        assert [n.path for n in answer] == [f"images/{i:06d}.png" for i in expected]
        assert [n.label for n in answer] == [CLASSES[i % 3] for i in expected]
        sims = [n.similarity for n in answer]
        assert sims == sorted(sims, reverse=True)


def test_an_item_finds_itself_first(tmp_path):
    x = embeddings(500, 16)
    build(tmp_path / "g", rows(x), STAMP, CLASSES, BuildOptions(exact_below=100))
    gallery = load(tmp_path / "g")
    assert gallery.manifest.search == "hnsw"
    for i, answer in enumerate(gallery.search(x[:50], k=3)):
        assert answer[0].path == f"images/{i:06d}.png"
        assert answer[0].similarity >= 0.999


@pytest.mark.parametrize("dtype", list(Dtype))
def test_the_graph_finds_what_a_scan_of_the_same_codes_finds(tmp_path, dtype):
    x = embeddings(5_000, 16)
    build(tmp_path / "g", rows(x), STAMP, CLASSES, BuildOptions(dtype, exact_below=1))
    gallery = load(tmp_path / "g")
    queries = embeddings(200, 16, seed=2)
    _, graph, _ = gallery.nearest(queries, 10)
    _, scan, _ = gallery.nearest(queries, 10, exact=True)
    # recall by similarity (the bits' Hamming distances tie): the graph's 10th is the scan's
    assert np.mean(graph[:, -1] >= scan[:, -1] - 1e-6) >= 0.95
    assert np.mean(graph >= scan[:, -1:] - 1e-6) >= 0.99


@pytest.mark.parametrize("dtype", list(Dtype))
def test_every_item_of_a_graph_is_found_by_its_own_embedding(tmp_path, dtype):
    x = embeddings(3_000, 16)
    build(tmp_path / "g", rows(x), STAMP, CLASSES, BuildOptions(dtype, exact_below=1))
    rows_found, similarities, _ = load(tmp_path / "g").nearest(x, 1)
    if dtype is not Dtype.B1:  # distinct bits are not guaranteed: a tie may come first
        assert (rows_found[:, 0] == np.arange(3_000)).all()
    np.testing.assert_allclose(similarities[:, 0], 1.0, atol=1e-3 if dtype is Dtype.I8 else 1e-6)


def test_exact_f32_answers_numpys_neighbours_under_the_graph_too(tmp_path):
    x = embeddings(2_000, 16)
    build(tmp_path / "g", rows(x), STAMP, CLASSES, BuildOptions(exact_below=1))
    queries = embeddings(50, 16, seed=3)
    got, _, _ = load(tmp_path / "g").nearest(queries, 10, exact=True)
    np.testing.assert_array_equal(np.sort(got, axis=1), np.sort(exact_top(x, queries, 10), axis=1))


def test_min_similarity_keeps_only_the_close_matches(tmp_path):
    x = embeddings(300, 16)
    build(tmp_path / "g", rows(x), STAMP, CLASSES, BuildOptions())
    gallery = load(tmp_path / "g")
    answer = gallery.search(x[:1], k=10, min_similarity=0.999)[0]
    assert [n.path for n in answer] == ["images/000000.png"]
    assert gallery.search(x[:1], k=10, min_similarity=1.5) == [[]]


def test_k_beyond_the_gallery_gives_every_item(tmp_path):
    x = embeddings(5, 16)
    build(tmp_path / "g", rows(x), STAMP, CLASSES, BuildOptions())
    assert len(load(tmp_path / "g").search(x[:2], k=50)[1]) == 5


@pytest.mark.parametrize("exact_below", [1, 10_000])
def test_an_update_adds_changes_and_removes_in_place(tmp_path, exact_below):
    x = embeddings(1_000, 16)
    options = BuildOptions(exact_below=exact_below)
    build(tmp_path / "g", rows(x), STAMP, CLASSES, options)
    first = load(tmp_path / "g")
    # 100 deleted (0..99), 100 changed (100..199, new mtime and embedding), 100 added (1000..1099)
    current = rows(x[100:1000], start=100)
    changed_x = embeddings(100, 16, seed=5)
    mtimes = current.file_mtimes.copy()
    mtimes[:100] = 2
    new_x = x[100:1000].copy()
    new_x[:100] = changed_x
    added = embeddings(100, 16, seed=6)
    both = Rows(
        paths=[*current.paths, *rows(added, start=1000).paths],
        embeddings=np.concatenate([new_x, added]),
        labels=np.concatenate([current.labels, rows(added, start=1000).labels]),
        file_sizes=np.full(1000, 100, np.int64),
        file_mtimes=np.concatenate([mtimes, np.ones(100, np.int64)]),
    )
    summary = build(tmp_path / "g", both, STAMP, CLASSES, options)
    assert (summary.added, summary.changed, summary.removed, summary.kept) == (100, 100, 100, 800)
    assert not summary.rebuilt
    assert summary.items == 1000
    gallery = load(tmp_path / "g")
    assert sorted(gallery.items.paths()) == sorted(both.paths)
    # unchanged items keep their keys; every item finds itself
    kept = {p: k for p, k in zip(first.items.paths(), first.items.keys, strict=True)}
    now = {p: k for p, k in zip(gallery.items.paths(), gallery.items.keys, strict=True)}
    assert all(now[p] == kept[p] for p in both.paths[100:900])
    assert all(now[p] != kept[p] for p in both.paths[:100])
    for path, answer in zip(both.paths, gallery.search(both.embeddings, k=1), strict=True):
        assert answer[0].path == path
    # the folder holds only the new generation's files
    names = {p.name for p in (tmp_path / "g").iterdir()}
    assert names == {e.name for e in gallery.manifest.files.values()} | {MANIFEST, LOCK}


def test_a_growing_exact_gallery_becomes_a_graph(tmp_path):
    x = embeddings(300, 16)
    options = BuildOptions(exact_below=250)
    assert build(tmp_path / "g", rows(x[:200]), STAMP, CLASSES, options).search == "exact"
    summary = build(tmp_path / "g", rows(x), STAMP, CLASSES, options)
    assert (summary.search, summary.added, summary.kept) == ("hnsw", 100, 200)
    assert load(tmp_path / "g").search(x[250:251], k=1)[0][0].path == "images/000250.png"


def test_another_model_rebuilds_and_says_why(tmp_path):
    x = embeddings(100, 16)
    build(tmp_path / "g", rows(x), STAMP, CLASSES, BuildOptions())
    other = Stamp("toy-smso", "ba9876543210", "b" * 64)
    summary = build(tmp_path / "g", rows(x), other, CLASSES, BuildOptions())
    assert summary.rebuilt
    assert "another model" in summary.reason
    assert load(tmp_path / "g").stamp == other
    summary = build(tmp_path / "g", rows(x), other, CLASSES, BuildOptions(Dtype.I8))
    assert summary.rebuilt
    assert "another dtype" in summary.reason


def test_a_stamp_of_another_card_is_refused_by_name():
    other = Stamp("toy-smso", "0123456789ab", "c" * 64)
    with pytest.raises(StampMismatchError, match=r"toy-smso version 0123456789ab \(card aaaa"):
        STAMP.require(other, "the gallery", "the model")
    STAMP.require(Stamp("renamed", "v2", "a" * 64), "the gallery", "the model")


def test_a_folder_of_other_files_is_not_overwritten(tmp_path):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "notes.txt").write_text("mine")
    with pytest.raises(GalleryError, match="not a gallery"):
        build(tmp_path / "g", rows(embeddings(10, 4)), STAMP, CLASSES, BuildOptions())
    assert (tmp_path / "g" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("exact_below", [1, 10_000])
@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete", "manifest"])
def test_a_damaged_gallery_is_refused_with_the_file_named(tmp_path, exact_below, damage):
    build(
        tmp_path / "g",
        rows(embeddings(300, 16)),
        STAMP,
        CLASSES,
        BuildOptions(exact_below=exact_below),
    )
    manifest = json.loads((tmp_path / "g" / MANIFEST).read_text())
    kind = "index" if exact_below == 1 else "codes"
    victim = tmp_path / "g" / manifest["files"][kind]["name"]
    if damage == "truncate":
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
        match = "truncated"
    elif damage == "garbage":
        victim.write_bytes(bytes(reversed(victim.read_bytes())))
        match = "altered"
    elif damage == "delete":
        victim.unlink()
        match = "missing"
    else:
        victim = tmp_path / "g" / MANIFEST
        victim.write_text("{not json")
        match = "not a gallery manifest"
    with pytest.raises(GalleryError, match=match) as error:
        load(tmp_path / "g")
    assert victim.name in str(error.value)


def test_a_folder_without_a_manifest_is_not_a_gallery(tmp_path):
    with pytest.raises(GalleryError, match="is not a folder"):
        load(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(GalleryError, match=r"has no gallery\.json"):
        load(tmp_path / "empty")


def test_a_query_of_another_dimension_is_refused(tmp_path):
    build(tmp_path / "g", rows(embeddings(10, 16)), STAMP, CLASSES, BuildOptions())
    with pytest.raises(ValueError, match="8 values, the gallery's 16"):
        load(tmp_path / "g").search(np.zeros((1, 8), np.float32))


def test_the_binary_scan_is_the_hamming_distance_of_every_bit():
    """usearch's exact search reads a packed row of B bytes as B bits: the scan must not."""
    rng = np.random.default_rng(3)
    for bits in (64, 24):
        codes = np.packbits(rng.standard_normal((300, bits)) > 0, axis=1)
        found = hamming_scan(codes, codes[:40], 5)
        unpacked = np.unpackbits(codes, axis=1)[:, :bits].astype(np.int64)
        distances = (unpacked[:40, None, :] != unpacked[None, :, :]).sum(axis=2)
        assert np.array_equal(found.distances, np.sort(distances, axis=1)[:, :5])
        assert np.array_equal(found.keys[:, 0], np.arange(40))


def test_the_gallery_imported_first_leaves_onnxruntime_importable():
    """usearch 2.26.3 to 2.26.6 crashed onnxruntime's import (SIGSEGV) when imported before it."""
    pytest.importorskip("onnxruntime")
    code = "import gallery.search, gallery.build; import onnxruntime; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_second_build_on_the_same_gallery_is_refused_while_the_first_runs(tmp_path):
    """Two builds would delete each other's files; the lock goes with the holder's process."""
    x = embeddings(50, 8)
    build(tmp_path / "g", rows(x), STAMP, CLASSES, BuildOptions())
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_LOCK, str(tmp_path / "g")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            GalleryInUseError, match=rf"another smso-index \(process {holder.pid}\)"
        ):
            build(tmp_path / "g", rows(x, mtime=2), STAMP, CLASSES, BuildOptions())
    finally:
        holder.kill()
        holder.communicate()
    summary = build(tmp_path / "g", rows(x, mtime=2), STAMP, CLASSES, BuildOptions())
    assert summary.changed == 50
    assert load(tmp_path / "g").size == 50


HOLD_THE_LOCK = """
import sys, time
from pathlib import Path
from gallery.lock import hold
with hold(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""
