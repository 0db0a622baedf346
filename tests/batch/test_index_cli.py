"""smso-index over smso-embed's output: built, updated after a resumed job, refused where the
command is wrong, and the near-duplicate pairs."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from batch.index_cli import main as index_main
from gallery.search import load
from tests.batch.conftest import MODEL, embed, read, write_pngs


def index(*args: str, capsys) -> tuple[int, dict, str]:
    capsys.readouterr()
    status = index_main([*args, "--json"])
    out, err = capsys.readouterr()
    return status, (json.loads(out) if out.strip() else {}), err


@pytest.fixture
def embedded(tmp_path, capsys):
    images = tmp_path / "images"
    write_pngs(images, 60)
    status, _, _ = embed(MODEL, str(images), "-o", str(tmp_path / "out"), capsys=capsys)
    assert status == 0
    return images, tmp_path / "out"


def test_a_gallery_of_an_out_folder_finds_each_image_first(embedded, tmp_path, capsys):
    _images, out = embedded
    status, summary, _ = index(str(out), "-o", str(tmp_path / "g"), capsys=capsys)
    assert status == 0
    assert (summary["items"], summary["added"], summary["search"]) == (60, 60, "exact")
    gallery = load(tmp_path / "g")
    rows = read(out)
    assert gallery.stamp.card_sha256 == rows[0]["card_sha256"]
    assert gallery.stamp.model_version == rows[0]["model_version"]
    embeddings = np.array([row["embedding"] for row in rows], np.float32)
    for row, answer in zip(rows, gallery.search(embeddings, k=3), strict=True):
        assert answer[0].path == row["path"]
        assert answer[0].similarity >= 0.999
        assert answer[0].label == row["top_k_labels"][0]


def test_after_a_resumed_job_the_gallery_is_updated_not_rebuilt(embedded, tmp_path, capsys):
    images, out = embedded
    assert index(str(out), "-o", str(tmp_path / "g"), capsys=capsys)[0] == 0
    for name in ("00000.png", "00001.png"):
        (images / name).unlink()
    (images / "00002.png").write_bytes((images / "00010.png").read_bytes())
    os.utime(images / "00002.png", ns=(1, 10**18))  # a changed file: another mtime
    write_pngs(images, 3, start=100)
    status, _, _ = embed(MODEL, str(images), "-o", str(out), "--resume", capsys=capsys)
    assert status == 0
    status, summary, _ = index(str(out), "-o", str(tmp_path / "g"), capsys=capsys)
    assert status == 0
    assert summary["rebuilt"] is False
    assert (summary["added"], summary["changed"], summary["removed"]) == (3, 1, 2)
    assert summary["items"] == 61
    gallery = load(tmp_path / "g")
    assert sorted(gallery.items.paths()) == sorted(row["path"] for row in read(out))


def test_two_out_folders_make_one_gallery(tmp_path, capsys):
    for name, start in (("a", 0), ("b", 30)):
        write_pngs(tmp_path / name, 30, start=start)
        assert (
            embed(MODEL, str(tmp_path / name), "-o", str(tmp_path / f"out-{name}"), capsys=capsys)[
                0
            ]
            == 0
        )
    status, summary, _ = index(
        str(tmp_path / "out-a"), str(tmp_path / "out-b"), "-o", str(tmp_path / "g"), capsys=capsys
    )
    assert status == 0
    assert summary["items"] == 60


def test_the_same_out_twice_is_refused_in_one_line(embedded, tmp_path, capsys):
    _, out = embedded
    status, _, err = index(str(out), str(out), "-o", str(tmp_path / "g"), capsys=capsys)
    assert status == 2
    assert "is in more than one OUT folder" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "g").exists()


def test_a_folder_that_is_not_smso_embeds_output_is_refused(tmp_path, capsys):
    (tmp_path / "nothing").mkdir()
    status, _, err = index(str(tmp_path / "nothing"), "-o", str(tmp_path / "g"), capsys=capsys)
    assert status == 2
    assert err.startswith("smso-index: ")
    assert "holds no smso-embed output" in err


def test_near_duplicates_are_written_as_pairs(embedded, tmp_path, capsys):
    images, out = embedded
    copy = tmp_path / "images-copy"
    shutil.copytree(images, copy)
    for path in list(copy.iterdir())[5:]:
        path.unlink()  # 5 exact copies of 5 images
    assert embed(MODEL, str(copy), "-o", str(tmp_path / "out-copy"), capsys=capsys)[0] == 0
    status, summary, _ = index(
        str(out),
        str(tmp_path / "out-copy"),
        "-o",
        str(tmp_path / "g"),
        "--duplicates",
        "0.999",
        capsys=capsys,
    )
    assert status == 0
    pairs = pq.read_table(tmp_path / "g" / "duplicates.parquet").to_pylist()
    copied = {p.name for p in copy.iterdir()}
    found = {(row["path_a"], row["path_b"]) for row in pairs}
    want = {tuple(sorted((str(images / n), str(copy / n)))) for n in copied}
    assert want <= found
    assert all(row["similarity"] >= 0.999 for row in pairs)
    assert summary["duplicates"]["pairs"] == len(pairs)


@pytest.mark.parametrize("dtype", ["f16", "i8", "b1"])
def test_each_dtype_builds_and_finds_the_image_itself(embedded, tmp_path, capsys, dtype):
    _, out = embedded
    status, _summary, _ = index(
        str(out), "-o", str(tmp_path / "g"), "--dtype", dtype, capsys=capsys
    )
    assert status == 0
    gallery = load(tmp_path / "g")
    rows = read(out)
    embeddings = np.array([row["embedding"] for row in rows], np.float32)
    hits = [
        a[0].path == r["path"] for r, a in zip(rows, gallery.search(embeddings, k=1), strict=True)
    ]
    assert np.mean(hits) >= 0.9
