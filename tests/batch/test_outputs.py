"""The output folder without Ray: parts named by their images and renamed into place whole, the
manifest a resume must match, the scan a resume starts from, the progress line."""

from __future__ import annotations

import io
import json
from dataclasses import asdict, replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch.embedder import row_schema
from batch.inputs import locate
from batch.outputs import (
    EMBEDDINGS,
    ERRORS,
    JobManifest,
    OutputError,
    PartsSink,
    WriteCounts,
    prepare,
    scan,
)
from batch.progress import Progress, format_duration, format_rate

MANIFEST = JobManifest("m", "1", "c" * 64, 4, 2, False)


def rows(paths: list[str], failed: frozenset[str] = frozenset()) -> pa.Table:
    """What the actors hand the sink: 4-d embeddings, top-2 of 3 classes."""
    n = len(paths)
    ok = np.array([path not in failed for path in paths])
    schema = row_schema(4, 2)

    def fixed(values: np.ndarray, kind: pa.DataType) -> pa.Array:
        flat = pa.array(values.reshape(-1), kind)
        return pa.FixedSizeListArray.from_arrays(flat, values.shape[1], mask=pa.array(~ok))

    columns = [
        pa.array(paths, pa.string()),
        fixed(np.arange(n * 4, dtype=np.float32).reshape(n, 4), pa.float32()),
        fixed(np.tile([2, 0], (n, 1)).astype(np.int32), pa.int32()),
        fixed(np.tile([0.7, 0.2], (n, 1)).astype(np.float32), pa.float32()),
        pa.array([0.5] * n, pa.float64()),
        pa.array([0.25] * n, pa.float64()),
        pa.array([None if o else "invalid_image" for o in ok], pa.string()),
        pa.array([None if o else f"{p}: broken" for p, o in zip(paths, ok, strict=True)]),
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def sink(out) -> PartsSink:
    identity = {"model_name": "m", "model_version": "1", "card_sha256": "c" * 64}
    return PartsSink(locate(str(out)), ["a", "b", "c"], identity, 4, 2, 100)


def test_a_part_is_named_by_its_images_and_a_retry_rewrites_the_same_file(tmp_path):
    prepare(locate(str(tmp_path)), MANIFEST, resume=False)
    table = rows(["/x/1.png", "/x/2.png", "/x/3.png"], failed=frozenset({"/x/2.png"}))
    counts = sink(tmp_path).write([table], None)
    assert counts == WriteCounts(2, (("invalid_image", 1),))
    first = sorted(p.name for p in (tmp_path / EMBEDDINGS).iterdir())
    sink(tmp_path).write([table.slice(0, 2), table.slice(2)], None)  # the same rows, retried
    assert sorted(p.name for p in (tmp_path / EMBEDDINGS).iterdir()) == first
    (name,) = first
    assert (tmp_path / ERRORS / name).is_file()  # the same name in both tables
    written = pq.read_table(tmp_path / EMBEDDINGS / name).to_pylist()
    assert [r["path"] for r in written] == ["/x/1.png", "/x/3.png"]
    assert written[0]["top_k_labels"] == ["c", "a"]
    assert written[0]["embedding"] == [0.0, 1.0, 2.0, 3.0]
    error = pq.read_table(tmp_path / ERRORS / name).to_pylist()[0]
    assert (error["kind"], error["message"]) == ("invalid_image", "/x/2.png: broken")


def test_scan_counts_both_tables_and_drops_temporary_parts(tmp_path):
    prepare(locate(str(tmp_path)), MANIFEST, resume=False)
    sink(tmp_path).write([rows(["/x/1.png", "/x/2.png"], failed=frozenset({"/x/2.png"}))], None)
    (tmp_path / EMBEDDINGS / ".part-1.parquet.abc.tmp").write_bytes(b"half")
    found = scan(locate(str(tmp_path)))
    assert found.done == {"/x/1.png", "/x/2.png"}
    assert (found.embedded, found.refused, found.duplicates) == (1, 1, 0)
    assert found.removed_temporary == 1
    assert not list((tmp_path / EMBEDDINGS).glob(".*"))


def test_a_part_that_is_not_parquet_is_named(tmp_path):
    prepare(locate(str(tmp_path)), MANIFEST, resume=False)
    (tmp_path / EMBEDDINGS / "part-x.parquet").write_bytes(b"nope")
    with pytest.raises(OutputError, match=r"part-x\.parquet is not a readable Parquet file"):
        scan(locate(str(tmp_path)))


def test_a_foreign_part_with_an_integer_path_column_is_named_in_one_line(tmp_path):
    prepare(locate(str(tmp_path)), MANIFEST, resume=False)
    pq.write_table(pa.table({"path": [1, 2, 3]}), tmp_path / ERRORS / "part-foreign.parquet")
    with pytest.raises(OutputError) as raised:
        scan(locate(str(tmp_path)))
    assert str(raised.value) == (
        f"{tmp_path}/errors/part-foreign.parquet has a path column of type int64, not string: "
        "it was not written by smso-embed: move it away"
    )


def test_resume_with_another_model_file_is_refused_naming_both(tmp_path):
    """Two files with the same card (another graph, the same card copied in) are two models."""
    out = locate(str(tmp_path / "o"))
    first = replace(MANIFEST, model_sha256="a" * 64, model_file="/models/a.onnx")
    prepare(out, first, resume=False)
    # the same file moved: the same model (the manifest says where it was last)
    prepare(out, replace(first, model_file="/elsewhere/copy-of-a.onnx"), resume=True)
    other = replace(first, model_sha256="b" * 64, model_file="/models/b.onnx")
    with pytest.raises(OutputError) as raised:
        prepare(out, other, resume=True)
    assert str(raised.value) == (
        f"{tmp_path}/o holds another job's output (model file /elsewhere/copy-of-a.onnx (sha256 "
        "aaaaaaaaaaaaaaaa), not /models/b.onnx (sha256 bbbbbbbbbbbbbbbb)); resume it with the "
        "same model file and flags, or give a new folder"
    )


def test_a_manifest_of_format_1_is_resumed_and_records_the_model_file(tmp_path):
    """smso-embed/1 recorded the card only: its first resume (same card and flags) writes the
    file's sha256, which every later resume checks."""
    out = tmp_path / "o"
    out.mkdir()
    old = {k: v for k, v in asdict(MANIFEST).items() if k not in {"model_sha256", "model_file"}}
    (out / "_smso_embed.json").write_text(json.dumps(old | {"format": "smso-embed/1"}))
    now = replace(MANIFEST, model_sha256="a" * 64, model_file="/models/a.onnx")
    prepare(locate(str(out)), now, resume=True)
    assert JobManifest.from_json((out / "_smso_embed.json").read_bytes()) == now
    with pytest.raises(OutputError, match=r"not /models/b\.onnx"):
        prepare(
            locate(str(out)), replace(now, model_sha256="b" * 64, model_file="/models/b.onnx"), True
        )


def test_prepare_accepts_its_own_job_and_refuses_another(tmp_path):
    out = locate(str(tmp_path / "o"))
    prepare(out, MANIFEST, resume=True)  # resume may start a job
    prepare(out, MANIFEST, resume=True)
    other = JobManifest("m", "1", "c" * 64, 4, 3, False)
    with pytest.raises(OutputError, match="top_k 2 \\(now 3\\)"):
        prepare(out, other, resume=True)
    with pytest.raises(OutputError, match="exists; pass --resume"):
        prepare(out, MANIFEST, resume=False)


def test_the_progress_line(tmp_path):
    progress = Progress(locate(str(tmp_path)), 10_000, stream=io.StringIO())
    assert progress.line(0, 7.0) == "smso-embed: 0 / 10,000 images (0%), starting (7 s)"
    assert progress.line(1_000, 9.0, (1_000, 9.0)) == "smso-embed: 1,000 / 10,000 images (10%)"
    line = progress.line(2_500, 12.0, (1_000, 9.0))  # 1,500 images in 3 s since the first part
    assert line == "smso-embed: 2,500 / 10,000 images (25%), 500 images/s, 15 s left"
    assert format_duration(3_725) == "1:02:05"
    assert format_duration(65) == "1:05"


def test_a_rate_keeps_two_significant_digits() -> None:
    # a job of 3 images in 8 s runs at 0.38 images/s, not "0 images/s"
    assert [format_rate(r) for r in (3 / 8, 2.5, 57.25, 2_656.4)] == [
        "0.38",
        "2.5",
        "57.2",
        "2,656",
    ]
