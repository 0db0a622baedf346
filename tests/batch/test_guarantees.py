"""What a careless or hostile INPUT or OUT cannot do to a job, end to end (on the embedded engine:
these are the job's rules, the same for every engine): make it hang, read outside INPUT, stop it
with a traceback, or mix two models in one OUT."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch.cli import main
from batch.outputs import EMBEDDINGS, ERRORS
from tests.batch.conftest import MODEL, embed, in_time, read, write_pngs


def test_a_file_name_that_is_not_utf8_is_embedded_and_resumed(tmp_path, capsys):
    folder = tmp_path / "in"
    write_pngs(folder, 3)
    os.rename(folder / "00000.png", os.fsencode(folder) + b"/caf\xe9.png")
    out = tmp_path / "out"
    status, summary, err = embed(MODEL, str(folder), "-o", str(out), capsys=capsys)
    assert status == 0, err
    assert [row["path"] for row in read(out)] == [
        f"{folder}/00001.png",
        f"{folder}/00002.png",
        f"file://{folder}/caf%E9.png",
    ]
    status, summary, err = embed(MODEL, str(folder), "-o", str(out), "--resume", capsys=capsys)
    assert (status, summary["todo"], summary["out_embedded"]) == (0, 0, 3), err


def test_a_fifo_named_in_a_list_is_an_error_row(tmp_path, capsys):
    write_pngs(tmp_path / "in", 2)
    fifo = tmp_path / "in" / "pipe.png"
    os.mkfifo(fifo)
    listing = tmp_path / "list.csv"
    listing.write_text("path\nin/00000.png\nin/pipe.png\nin/00001.png\n")
    out = tmp_path / "out"
    status, summary, err = in_time(
        lambda: embed(MODEL, str(listing), "-o", str(out), capsys=capsys), fifo, seconds=120
    )
    assert status == 0, err
    assert (summary["embedded"], summary["refused"]) == (2, {"unreadable": 1})
    (error,) = read(out, ERRORS)
    assert (error["path"], error["kind"]) == (str(fifo), "unreadable")
    assert "not a regular file (a FIFO)" in error["message"]
    # it cannot be read now either: resuming the finished job finds nothing to do
    status, summary, err = in_time(
        lambda: embed(MODEL, str(listing), "-o", str(out), "--resume", capsys=capsys), fifo
    )
    assert (status, summary["todo"], summary["changed"], summary["out_refused"]) == (0, 0, 0, 1)


def test_a_loop_and_a_link_outside_input_are_skipped_and_said(tmp_path, capsys):
    folder, outside = tmp_path / "in", tmp_path / "outside"
    write_pngs(folder, 5)
    write_pngs(outside, 3, start=5)
    (folder / "again").symlink_to(".")
    (folder / "elsewhere").symlink_to(outside)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main([MODEL, str(folder), "-o", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "  OUT        5 embeddings, 0 errors: every image of INPUT once" in text
    assert text.rstrip().endswith(
        "  skipped    links leading outside INPUT 1 (not followed: --follow-symlinks); "
        "folders already walked 1 (a loop, or a second link to one)"
    )
    assert len(read(out)) == 5
    status, summary, err = embed(
        MODEL, str(folder), "-o", str(out), "--resume", "--follow-symlinks", capsys=capsys
    )
    assert (status, summary["todo"], summary["out_embedded"]) == (0, 3, 8), err
    assert summary["input_skipped"] == {"folders_already_walked": 1}


def test_resume_with_another_model_file_carrying_the_same_card_is_refused(tmp_path, capsys):
    onnx = pytest.importorskip("onnx")
    numpy_helper = pytest.importorskip("onnx.numpy_helper")
    model = onnx.load(MODEL)
    weights = max(model.graph.initializer, key=lambda tensor: len(tensor.raw_data))
    changed = numpy_helper.to_array(weights) * 1.5
    weights.CopyFrom(numpy_helper.from_array(changed, weights.name))
    other = tmp_path / "other.onnx"
    onnx.save(model, other)  # another graph, the same card in its metadata
    write_pngs(tmp_path / "in", 2)
    out = tmp_path / "out"
    assert embed(MODEL, str(tmp_path / "in"), "-o", str(out), capsys=capsys)[0] == 0
    status, _, err = embed(
        str(other), str(tmp_path / "in"), "-o", str(out), "--resume", capsys=capsys
    )
    assert status == 2
    assert err.count("\n") == 1
    assert f"model file {MODEL} (sha256 " in err
    assert f"not {other} (sha256 " in err
    assert "card_sha256" not in err  # the card is the same: the file is what differs


def test_a_foreign_part_with_an_integer_path_column_is_one_line(tmp_path, capsys):
    write_pngs(tmp_path / "in", 1)
    out = tmp_path / "out"
    assert embed(MODEL, str(tmp_path / "in"), "-o", str(out), capsys=capsys)[0] == 0
    pq.write_table(pa.table({"path": [1, 2, 3]}), out / EMBEDDINGS / "part-foreign.parquet")
    status, _, err = embed(MODEL, str(tmp_path / "in"), "-o", str(out), "--resume", capsys=capsys)
    assert status == 2
    assert err == (
        f"smso-embed: {out}/embeddings/part-foreign.parquet has a path column of type int64, "
        "not string: it was not written by smso-embed: move it away\n"
    )
