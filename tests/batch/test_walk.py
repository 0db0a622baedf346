"""INPUT read without leaving it and without waiting: symbolic links leading outside a folder are
not followed (unless asked), loops end, FIFOs are never opened, and any file name the
filesystem gives is accepted and named one to one in the output."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch.decoding import UNKNOWN, UNREADABLE, DecodeOptions, decode
from batch.inputs import InputError, locate, resolve
from service.runtime.backend import read_card
from tests.batch.conftest import MODEL, in_time, write_pngs

LATIN1 = b"caf\xe9.png"  # a name in Latin-1: not valid UTF-8


def names(paths: list[str], root: Path) -> list[str]:
    return [os.path.relpath(path, root) for path in paths]


@pytest.fixture
def looped(tmp_path: Path) -> Path:
    """5 images, a link back to their own folder, and a second name for a sub-folder."""
    root = tmp_path / "in"
    write_pngs(root, 3)
    write_pngs(root / "sub", 2, start=3)
    (root / "again").symlink_to(".")
    (root / "alias").symlink_to("sub")
    return root


def test_a_loop_of_links_is_walked_once(looped):
    inputs = resolve(str(looped))
    assert names(inputs.uris, looped) == [
        "00000.png",
        "00001.png",
        "00002.png",
        "sub/00003.png",
        "sub/00004.png",
    ]
    assert inputs.skipped == {"folders_already_walked": 2}
    pattern = resolve(str(looped / "**" / "*.png"))
    assert pattern.uris == inputs.uris
    # with --follow-symlinks too: each folder once, the tree's own names first
    assert resolve(str(looped), follow_symlinks=True).uris == inputs.uris


def test_links_leading_outside_input_are_skipped_unless_followed(tmp_path):
    root, outside = tmp_path / "in", tmp_path / "outside"
    write_pngs(root, 2)
    write_pngs(outside, 3)
    (root / "elsewhere").symlink_to(outside)
    (root / "one.png").symlink_to(outside / "00000.png")
    (outside / "back").symlink_to(outside)  # a loop outside INPUT
    inside = resolve(str(root))
    assert names(inside.uris, root) == ["00000.png", "00001.png"]
    assert inside.skipped == {"links_outside_input": 2}
    assert resolve(str(root / "*")).skipped == {"links_outside_input": 1}  # the file link
    followed = resolve(str(root), follow_symlinks=True)
    assert names(followed.uris, root) == [
        "00000.png",
        "00001.png",
        "elsewhere/00000.png",
        "elsewhere/00001.png",
        "elsewhere/00002.png",
        "one.png",
    ]
    assert followed.skipped == {"folders_already_walked": 1}


def test_a_link_inside_input_to_a_file_is_kept_and_a_broken_one_counted(tmp_path):
    root = tmp_path / "in"
    write_pngs(root, 1)
    (root / "same.png").symlink_to("00000.png")
    (root / "gone.png").symlink_to("missing.png")
    inputs = resolve(str(root))
    assert names(inputs.uris, root) == ["00000.png", "same.png"]
    assert inputs.skipped == {"broken_or_unlistable": 1}


def test_a_folder_or_glob_skips_fifos_and_says_so(tmp_path):
    write_pngs(tmp_path, 1)
    os.mkfifo(tmp_path / "pipe.png")
    os.mkfifo(tmp_path / "pipe")  # not an image's name: not counted
    assert resolve(str(tmp_path)).skipped == {"not_regular_files": 1}
    assert names(resolve(str(tmp_path / "*")).uris, tmp_path) == ["00000.png"]


@pytest.mark.parametrize(
    "pattern",
    [
        "**/*.jpg",
        "*.jpg",
        "*/*.jpg",
        "**",
        "a/**/*",
        "**/b/*",
        "a/.*",
        ".h/*",
        "[ax]/*",
        "a/b/?.*",
        "**/c/**/*.png",
        "*/",
    ],
)
def test_a_glob_matches_what_the_shell_matches(tmp_path, pattern):
    """Without links, the same files as Python's glob.glob (hidden names, ** and classes)."""
    for name in (
        "1.jpg",
        "a/2.jpg",
        "a/b/3.jpg",
        "a/b/c/4.png",
        ".h/5.jpg",
        "a/.hid/6.jpg",
        "a/.7.jpg",
        "x/8.JPG",
        "a/b/9.txt",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    target = f"{tmp_path}/{pattern}"
    expected = sorted(p for p in glob.glob(target, recursive=True) if os.path.isfile(p))
    if not expected:
        with pytest.raises(InputError, match="matches no files"):
            resolve(target)
    else:
        assert resolve(target).uris == expected


def test_a_name_that_is_not_utf8_is_named_by_a_percent_encoded_file_uri(tmp_path):
    write_pngs(tmp_path, 1)
    os.rename(tmp_path / "00000.png", os.fsencode(tmp_path) + b"/" + LATIN1)
    (uri,) = resolve(str(tmp_path)).uris
    assert uri == f"file://{tmp_path}/caf%E9.png"
    local = locate(str(tmp_path))
    assert os.fsencode(local.path_of(uri)) == os.fsencode(tmp_path) + b"/" + LATIN1
    assert local.uri(local.path_of(uri)) == uri  # one to one
    assert local.uri(f"{tmp_path}/plain.png") == f"{tmp_path}/plain.png"  # UTF-8: as it is
    assert resolve(str(tmp_path / "*.png")).uris == [uri]


def test_a_list_names_such_a_file_by_its_uri_or_its_bytes(tmp_path):
    (tmp_path / "x.png").write_bytes(b"x")
    raw = os.fsencode(tmp_path) + b"/" + LATIN1
    Path(os.fsdecode(raw)).write_bytes(b"x")
    uri = f"file://{tmp_path}/caf%E9.png"
    listing = tmp_path / "list.csv"
    listing.write_text(f"path\n{uri}\nx.png\n")
    assert resolve(str(listing)).uris == [str(tmp_path / "x.png"), uri]
    binary = tmp_path / "list.parquet"
    pq.write_table(pa.table({"path": pa.array([raw, b"x.png"], pa.binary())}), binary)
    assert resolve(str(binary)).uris == [str(tmp_path / "x.png"), uri]


def test_a_fifo_given_as_the_list_is_refused_without_being_opened(tmp_path):
    fifo = tmp_path / "list.csv"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        in_time(lambda: resolve(str(fifo)), fifo)


def test_a_fifo_named_in_a_list_is_an_error_row_not_a_hang(tmp_path):
    (image,) = write_pngs(tmp_path, 1)
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    preprocessing = read_card(MODEL).preprocessing
    options = DecodeOptions(locate(str(tmp_path)), preprocessing, 50_000_000, 2**20)
    batch = {"path": np.array([str(fifo), str(image)]), "chunk": np.array([0, 0])}
    rows = in_time(lambda: decode(batch, options), fifo)
    assert list(rows["error_kind"]) == [UNREADABLE, ""]
    assert list(rows["file_size"]) == [UNKNOWN, image.stat().st_size]  # the FIFO: never read
    assert rows["error"][0] == (
        f"{fifo}: cannot be read (not a regular file (a FIFO); only regular files are read)"
    )
