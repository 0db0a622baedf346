"""INPUT as a folder, a glob or a Parquet/CSV list; each mistake said in one line."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch.inputs import InputError, resolve


def written(path, text):
    path.write_text(text)
    return path


def touch(*paths):
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")


def test_a_folder_is_read_recursively_images_only_hidden_skipped(tmp_path):
    touch(
        tmp_path / "b.png",
        tmp_path / "a.JPG",
        tmp_path / "sub" / "deeper" / "c.webp",
        tmp_path / "notes.txt",
        tmp_path / ".hidden.png",
        tmp_path / ".cache" / "d.png",
    )
    inputs = resolve(str(tmp_path))
    assert inputs.described == "folder"
    assert inputs.uris == [
        str(tmp_path / "a.JPG"),
        str(tmp_path / "b.png"),
        str(tmp_path / "sub" / "deeper" / "c.webp"),
    ]


def test_a_relative_folder_gives_absolute_paths(tmp_path, monkeypatch):
    touch(tmp_path / "x" / "a.png")
    monkeypatch.chdir(tmp_path)
    assert resolve("x").uris == [str(tmp_path / "x" / "a.png")]


def test_a_glob_matches_any_extension_and_double_star_recurses(tmp_path):
    touch(tmp_path / "a.jpg", tmp_path / "s" / "b.jpg", tmp_path / "c.png", tmp_path / "d.raw")
    assert resolve(str(tmp_path / "**" / "*.jpg")).uris == [
        str(tmp_path / "a.jpg"),
        str(tmp_path / "s" / "b.jpg"),
    ]
    assert resolve(str(tmp_path / "*.raw")).uris == [str(tmp_path / "d.raw")]


def test_a_csv_list_resolves_relative_paths_from_its_folder_and_drops_repeats(tmp_path):
    touch(tmp_path / "img" / "a.png", tmp_path / "img" / "b.png")
    listing = tmp_path / "list.csv"
    listing.write_text(f"id,path\n1,img/a.png\n2,{tmp_path}/img/b.png\n3,img/a.png\n4,\n")
    inputs = resolve(str(listing))
    assert inputs.uris == [str(tmp_path / "img" / "a.png"), str(tmp_path / "img" / "b.png")]
    assert inputs.duplicates == 1


def test_a_parquet_list_with_another_column_name(tmp_path):
    touch(tmp_path / "a.png")
    pq.write_table(pa.table({"file": [str(tmp_path / "a.png")]}), tmp_path / "list.parquet")
    assert resolve(str(tmp_path / "list.parquet"), column="file").uris == [str(tmp_path / "a.png")]


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda p: p / "missing", "no such file or folder"),
        (lambda p: p, "holds no image files"),
        (lambda p: p / "*.png", "matches no files"),
        (lambda p: written(p / "x.txt", ""), "not a folder, a glob"),
        (lambda p: written(p / "l.csv", "file\na.png\n"), "no column 'path'"),
        (lambda p: written(p / "l.parquet", "no"), "cannot be read"),
        (lambda p: written(p / "l.csv", "path\n\n"), "lists no paths"),
        (lambda p: written(p / "l.csv", "path,x\na,b\na,b,c\n"), "cannot be read"),
    ],
)
def test_mistakes_are_one_line(tmp_path, make, said):
    with pytest.raises(InputError, match=said) as raised:
        resolve(str(make(tmp_path)))
    assert "\n" not in str(raised.value)


def test_a_missing_parquet_column_is_named(tmp_path):
    pq.write_table(pa.table({"file": ["a.png"]}), tmp_path / "l.parquet")
    with pytest.raises(InputError, match=r"no column 'path'.*--column"):
        resolve(str(tmp_path / "l.parquet"))
