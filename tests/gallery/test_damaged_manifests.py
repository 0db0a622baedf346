"""Damage that the checksums do not catch (a manifest edited by hand, files written again with
their checksums): :func:`gallery.search.load` refuses each with a
:class:`~gallery.store.GalleryError` naming the file, never another exception and never a
gallery whose search then fails."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gallery.build import BuildOptions, build
from gallery.search import load
from gallery.store import MANIFEST, GalleryError
from tests.gallery.test_codes import embeddings
from tests.gallery.test_gallery import CLASSES, STAMP, rows


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    build(tmp_path / "g", rows(embeddings(50, 8)), STAMP, CLASSES, BuildOptions())
    return tmp_path / "g"


def _edit(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def _set(*keys: str, value: object) -> Callable[[dict[str, Any]], None]:
    def change(manifest: dict[str, Any]) -> None:
        for key in keys[:-1]:
            manifest = manifest[key]
        manifest[keys[-1]] = value

    return change


@pytest.mark.parametrize(
    "change",
    [
        _set("standardisation", value=5),
        _set("standardisation", "check", "unknown", value=1),
        _set("standardisation", "check", "beyond_i8_range", value=[1]),
        _set("standardisation", "center", value={"a": 1}),
        _set("next_key", value=None),
        _set("extra", value=5),
        _set("normalized", value="no"),
    ],
    ids=[
        "standardisation",
        "check-key",
        "check-value",
        "center",
        "next_key",
        "extra",
        "normalized",
    ],
)
def test_a_field_of_the_wrong_type_is_a_gallery_error(folder, change):
    _edit(folder, change)
    with pytest.raises(GalleryError, match=MANIFEST):
        load(folder)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _replace_signed(folder: Path, kind: str, data: bytes) -> None:
    """A file replaced and the manifest's size and sha256 updated to match (a build with a
    defect, or a hand-made gallery: the checksums pass)."""

    def change(manifest: dict[str, Any]) -> None:
        entry = manifest["files"][kind]
        (folder / entry["name"]).write_bytes(data)
        entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()

    _edit(folder, change)


def test_an_array_without_rows_is_a_gallery_error(folder):
    _replace_signed(folder, "keys", _npy(np.array(3, np.uint64)))
    with pytest.raises(GalleryError):
        load(folder)


def test_labels_of_two_columns_are_a_gallery_error(folder):
    _replace_signed(folder, "labels", _npy(np.zeros((50, 2), np.int32)))
    with pytest.raises(GalleryError):
        load(folder)  # loads; Gallery.search then fails with a TypeError on int(row)


def test_paths_that_are_not_utf8_are_a_gallery_error(folder):
    size = json.loads((folder / MANIFEST).read_text())["files"]["paths"]["bytes"]
    _replace_signed(folder, "paths", b"\xff" * size)
    with pytest.raises(GalleryError):
        load(folder).search(embeddings(1, 8), k=50)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_a_file_that_cannot_be_read_is_a_gallery_error(folder):
    codes = folder / json.loads((folder / MANIFEST).read_text())["files"]["codes"]["name"]
    codes.chmod(0)
    with pytest.raises(GalleryError):
        load(folder)
