"""``--resume`` on a collection that changed since: new images embedded, changed ones (another
size or modification time) embedded again, deleted ones taken out, the rest left where they are
and not read; ``--retry-errors`` for files fixed without a trace in their size or time;
``--dtype float16``; and rows taken out of a part by a job that crashes halfway, which the next
``--resume`` finishes with every image once. On the embedded engine (the plan and the parts are
the same code for both engines)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch import parts
from batch.outputs import EMBEDDINGS, ERRORS
from bench.embed import exactly_once
from bench.lib.payloads import pngs
from tests.batch.conftest import MODEL, embed, part_names, read, write_pngs


def part_states(out: Path) -> dict[str, int]:
    """Each embeddings part's inode: a part written again is another file."""
    return {name: (out / EMBEDDINGS / name).stat().st_ino for name in part_names(out)}


def bump_mtime(path: Path, seconds: int = 5) -> None:
    """``path``'s modification time moved on, its bytes as they were."""
    state = path.stat()
    os.utime(path, ns=(state.st_atime_ns, state.st_mtime_ns + seconds * 10**9))


def test_an_incremental_resume_embeds_only_what_changed(tmp_path, capsys):
    folder = tmp_path / "in"
    write_pngs(folder, 40)
    out = tmp_path / "out"
    flags = ("--rows-per-file", "8")  # chunks of 8: parts 0-4
    status, _, err = embed(MODEL, str(folder), "-o", str(out), *flags, capsys=capsys)
    assert status == 0, err
    before = {row["path"]: row for row in read(out)}
    parts_before = part_states(out)
    # 3 new images, 00005 rewritten with another image, 00012 touched, 00020 and 00021 deleted
    write_pngs(folder, 3, start=40)
    other = pngs(46)[45]
    assert len(other) != (folder / "00005.png").stat().st_size
    (folder / "00005.png").write_bytes(other)
    bump_mtime(folder / "00012.png")
    (folder / "00020.png").unlink()
    (folder / "00021.png").unlink()
    status, summary, err = embed(
        MODEL, str(folder), "-o", str(out), "--resume", *flags, capsys=capsys
    )
    assert status == 0, err
    counts = tuple(summary[key] for key in ("new", "changed", "deleted", "retried"))
    assert counts == (3, 2, 2, 0)
    assert (summary["skipped"], summary["todo"], summary["embedded"]) == (36, 5, 5)
    assert (summary["missing"], summary["duplicates"], summary["out_embedded"]) == (0, 0, 41)
    current = sorted(folder.iterdir())
    assert exactly_once(out, current)["exactly_once"]
    after = {row["path"]: row for row in read(out)}
    changed, touched = str(folder / "00005.png"), str(folder / "00012.png")
    assert not np.allclose(after[changed]["embedding"], before[changed]["embedding"])
    assert after[changed]["file_size"] == len(other)
    np.testing.assert_allclose(after[touched]["embedding"], before[touched]["embedding"], atol=1e-6)
    assert after[touched]["file_mtime_ns"] == (folder / "00012.png").stat().st_mtime_ns
    # the new content's rows are what a job over the folder as it is now writes
    status, _, err = embed(MODEL, str(folder), "-o", str(tmp_path / "fresh"), capsys=capsys)
    assert status == 0, err
    fresh = {row["path"]: row for row in read(tmp_path / "fresh")}
    assert sorted(fresh) == sorted(after)
    for path, row in fresh.items():
        np.testing.assert_allclose(after[path]["embedding"], row["embedding"], atol=1e-6)
        assert after[path]["top_k_labels"] == row["top_k_labels"]
    # parts 3 and 4 held none of them: the same files; 0 to 2 were rewritten with their other
    # rows (not embedded again: todo was the 5 images), and the 5 are one new part
    parts_after = part_states(out)
    survivors = set(parts_before) & set(parts_after)
    assert len(survivors) == 2
    assert all(parts_after[name] == parts_before[name] for name in survivors)
    firsts = {
        pq.read_table(out / EMBEDDINGS / name, columns=["path"]).column("path")[0].as_py()
        for name in survivors
    }
    assert firsts == {str(folder / "00024.png"), str(folder / "00032.png")}
    assert len(parts_after) == 6
    # and resumed again: nothing left to do
    status, summary, _ = embed(
        MODEL, str(folder), "-o", str(out), "--resume", *flags, capsys=capsys
    )
    assert (status, summary["todo"], summary["changed"], summary["engine"]) == (0, 0, 0, "")


def test_retry_errors_embeds_a_file_fixed_without_changing_its_size_or_time(tmp_path, capsys):
    folder = tmp_path / "in"
    write_pngs(folder, 10)
    fixed = folder / "00003.png"
    good = fixed.read_bytes()
    fixed.write_bytes(b"\0" * len(good))  # a broken copy, of the same size
    state = fixed.stat()
    out = tmp_path / "out"
    status, summary, err = embed(MODEL, str(folder), "-o", str(out), capsys=capsys)
    assert (status, summary["embedded"], summary["refused"]) == (0, 9, {"invalid_image": 1}), err
    fixed.write_bytes(good)
    os.utime(fixed, ns=(state.st_atime_ns, state.st_mtime_ns))  # as if never touched
    # the file's size and time are as they were: a plain --resume sees nothing to do
    status, summary, err = embed(MODEL, str(folder), "-o", str(out), "--resume", capsys=capsys)
    assert (status, summary["todo"], summary["changed"]) == (0, 0, 0), err
    assert [row["path"] for row in read(out, ERRORS)] == [str(fixed)]
    status, summary, err = embed(
        MODEL, str(folder), "-o", str(out), "--resume", "--retry-errors", capsys=capsys
    )
    assert status == 0, err
    assert (summary["retried"], summary["todo"], summary["embedded"]) == (1, 1, 1)
    assert (summary["out_embedded"], summary["out_refused"]) == (10, 0)
    assert part_names(out, ERRORS) == []  # the error's part is gone: it held no other row
    assert str(fixed) in {row["path"] for row in read(out)}
    assert exactly_once(out, sorted(folder.iterdir()))["exactly_once"]


def test_float16_embeddings_are_float32_s_within_their_rounding(png_folder, tmp_path, capsys):
    runs = {}
    for dtype in ("float32", "float16"):
        out = runs[dtype] = tmp_path / dtype
        status, _, err = embed(
            MODEL, str(png_folder), "-o", str(out), "--dtype", dtype, capsys=capsys
        )
        assert status == 0, err
        schema = pq.read_schema(next((out / EMBEDDINGS).glob("part-*.parquet")))
        assert schema.field("embedding").type == pa.list_(getattr(pa, dtype)(), 64)
    full, half = read(runs["float32"]), read(runs["float16"])
    assert [r["path"] for r in full] == [r["path"] for r in half]
    assert [r["top_k_labels"] for r in full] == [r["top_k_labels"] for r in half]
    vectors = np.array([r["embedding"] for r in full])
    halves = np.array([r["embedding"] for r in half])
    np.testing.assert_allclose(halves, vectors, rtol=1e-3, atol=1e-7)
    np.testing.assert_array_equal(halves, vectors.astype(np.float16))  # rounded, nothing else
    # a float32 job is not resumed as float16: its rows would mix two types
    again = (MODEL, str(png_folder), "-o", str(runs["float32"]), "--resume")
    status, _, err = embed(*again, "--dtype", "float16", capsys=capsys)
    assert status == 2
    assert err.count("\n") == 1
    assert "dtype 'float32' (now 'float16')" in err


def test_a_float16_job_resumes_as_float16(tmp_path, capsys):
    folder = tmp_path / "in"
    write_pngs(folder, 6)
    out = tmp_path / "out"
    assert embed(MODEL, str(folder), "-o", str(out), "--dtype", "float16", capsys=capsys)[0] == 0
    write_pngs(folder, 4, start=6)
    status, summary, err = embed(
        MODEL, str(folder), "-o", str(out), "--resume", "--dtype", "float16", capsys=capsys
    )
    assert (status, summary["new"], summary["out_embedded"]) == (0, 4, 10), err
    for part in (out / EMBEDDINGS).glob("part-*.parquet"):
        assert pq.read_schema(part).field("embedding").type.value_type == pa.float16()


@pytest.mark.parametrize("crash", ["before", "after"])
def test_a_crash_while_rows_are_taken_out_of_a_part_is_finished_by_the_next_resume(
    tmp_path, capsys, monkeypatch, crash
):
    """The part is moved aside, its other rows written under their own name, then it is
    deleted: a job that dies before the rows are written leaves them out of OUT (the next
    resume embeds them), one that dies after leaves the hidden copy (the next resume deletes
    it); never a row twice."""
    folder = tmp_path / "in"
    write_pngs(folder, 24)
    out = tmp_path / "out"
    flags = ("--rows-per-file", "8")
    assert embed(MODEL, str(folder), "-o", str(out), *flags, capsys=capsys)[0] == 0
    (folder / "00003.png").unlink()  # part 0 loses a row
    bump_mtime(folder / "00010.png")  # part 1 too, to embed again: its part is rewritten first
    write_whole = parts._write_whole

    def crashing(*args, **kwargs) -> None:
        if crash == "after":
            write_whole(*args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(parts, "_write_whole", crashing)
    status, _, err = embed(MODEL, str(folder), "-o", str(out), "--resume", *flags, capsys=capsys)
    assert status == 1
    assert "the job failed (OSError: [Errno 28] No space left on device)" in err
    current = sorted(folder.iterdir())
    found = exactly_once(out, current)
    assert found["repeated"] == 0  # never twice
    # before: part 1's 8 rows are out of OUT; after: its 7 others are back, 00010 is not
    assert found["missing"] == (8 if crash == "before" else 1)
    assert len(list((out / EMBEDDINGS).glob(".part-*.tmp"))) == 1  # part 1, moved aside
    monkeypatch.undo()
    status, summary, err = embed(
        MODEL, str(folder), "-o", str(out), "--resume", *flags, capsys=capsys
    )
    assert status == 0, err
    # what OUT lost is new now; part 0 was not reached: 00003 is taken out now
    assert (summary["new"], summary["changed"], summary["deleted"]) == (found["missing"], 0, 1)
    assert exactly_once(out, current)["exactly_once"]
    assert not list((out / EMBEDDINGS).glob(".*"))
    assert summary["out_embedded"] == 23
