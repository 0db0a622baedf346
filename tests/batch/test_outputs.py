"""The output folder without an engine: the images cut into chunks, each chunk's parts named by
its images and renamed into place whole, rows taken out of a part without ever being twice in
OUT, the manifest a resume must match (and the older formats it still reads), the scan a resume
starts from, the progress line."""

from __future__ import annotations

import io
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch.embedder import row_schema
from batch.inputs import locate
from batch.outputs import EMBEDDINGS, ERRORS, JobManifest, OutputError, prepare, scan
from batch.parts import PartCollector, PartWriter, WriteCounts, chunked, part_name, rewrite_part
from batch.progress import Progress, format_duration, format_rate
from batch.stages import StageTimes
from tests.batch.conftest import part_names

MANIFEST = JobManifest("m", "1", "c" * 64, 4, 2, False)


def rows(
    paths: list[str], failed: frozenset[str] = frozenset(), chunk: int | list[int] = 0
) -> pa.Table:
    """What an engine hands the collector: 4-d embeddings, top-2 of 3 classes, the file's size
    (its index + 100) and time, a millisecond for each stage."""
    n = len(paths)
    ok = np.array([path not in failed for path in paths])
    schema = row_schema(4, 2)

    def fixed(values: np.ndarray, kind: pa.DataType) -> pa.Array:
        flat = pa.array(values.reshape(-1), kind)
        return pa.FixedSizeListArray.from_arrays(flat, values.shape[1], mask=pa.array(~ok))

    chunks = [chunk] * n if isinstance(chunk, int) else chunk
    columns = [
        pa.array(paths, pa.string()),
        pa.array(chunks, pa.int64()),
        pa.array([100 + i for i in range(n)], pa.int64()),
        pa.array([10**18 + i for i in range(n)], pa.int64()),
        fixed(np.arange(n * 4, dtype=np.float32).reshape(n, 4) / 3, pa.float32()),
        fixed(np.tile([2, 0], (n, 1)).astype(np.int32), pa.int32()),
        fixed(np.tile([0.7, 0.2], (n, 1)).astype(np.float32), pa.float32()),
        pa.array([0.5] * n, pa.float64()),
        pa.array([0.25] * n, pa.float64()),
        pa.array([None if o else "invalid_image" for o in ok], pa.string()),
        pa.array([None if o else f"{p}: broken" for p, o in zip(paths, ok, strict=True)]),
        pa.array([0.001] * n, pa.float64()),
        pa.array([0.001] * n, pa.float64()),
        pa.array([0.001] * n, pa.float64()),
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def writer(out: Path, dtype: str = "float32") -> PartWriter:
    identity = {"model_name": "m", "model_version": "1", "card_sha256": "c" * 64}
    return PartWriter(locate(str(out)), ["a", "b", "c"], identity, 4, 2, dtype)


def test_the_images_to_do_are_cut_into_chunks_in_order():
    table = chunked([f"/x/{i}.png" for i in range(7)], 3)
    assert table.column("path").to_pylist() == [f"/x/{i}.png" for i in range(7)]
    assert table.column("chunk").to_pylist() == [0, 0, 0, 1, 1, 1, 2]
    assert chunked([], 3).num_rows == 0


def test_a_part_is_named_by_its_images_and_a_retry_rewrites_the_same_file(tmp_path):
    prepare(locate(str(tmp_path)), MANIFEST, resume=False)
    table = rows(["/x/3.png", "/x/1.png", "/x/2.png"], failed=frozenset({"/x/2.png"}))
    counts = writer(tmp_path).write(table)
    assert counts == WriteCounts(2, {"invalid_image": 1})
    first = part_names(tmp_path)
    (name,) = first
    assert name == part_name(pa.array(["/x/1.png", "/x/2.png", "/x/3.png"]))  # sorted paths
    writer(tmp_path).write(table.take([2, 0, 1]))  # the same rows, in another order
    assert part_names(tmp_path) == first
    assert part_names(tmp_path, ERRORS) == first  # the same name in both tables
    written = pq.read_table(tmp_path / EMBEDDINGS / name).to_pylist()
    assert [r["path"] for r in written] == ["/x/1.png", "/x/3.png"]  # sorted by path
    assert written[0]["top_k_labels"] == ["c", "a"]
    assert written[0]["embedding"] == pytest.approx([4 / 3, 5 / 3, 2.0, 7 / 3])
    assert (written[0]["file_size"], written[0]["file_mtime_ns"]) == (101, 10**18 + 1)
    error = pq.read_table(tmp_path / ERRORS / name).to_pylist()[0]
    assert (error["kind"], error["message"]) == ("invalid_image", "/x/2.png: broken")
    assert error["file_size"] == 102


def test_a_file_that_could_not_be_read_has_a_null_size(tmp_path):
    prepare(locate(str(tmp_path)), MANIFEST, resume=False)
    table = rows(["/x/1.png"], failed=frozenset({"/x/1.png"}))
    unread = pa.array([-1], pa.int64())
    table = table.set_column(2, "file_size", unread).set_column(3, "file_mtime_ns", unread)
    writer(tmp_path).write(table)
    (error,) = pq.read_table(tmp_path / ERRORS / part_names(tmp_path, ERRORS)[0]).to_pylist()
    assert (error["file_size"], error["file_mtime_ns"]) == (None, None)
    assert scan(locate(str(tmp_path))).held["/x/1.png"].size == -1


def test_float16_halves_the_embedding_and_keeps_it_within_rounding(tmp_path):
    prepare(locate(str(tmp_path)), replace(MANIFEST, dtype="float16"), resume=False)
    table = rows([f"/x/{i}.png" for i in range(5)])
    writer(tmp_path, "float16").write(table)
    (name,) = part_names(tmp_path)
    stored = pq.read_table(tmp_path / EMBEDDINGS / name)
    assert stored.schema.field("embedding").type == pa.list_(pa.float16(), 4)
    halves = np.array(stored.column("embedding").to_pylist(), np.float32)
    full = np.arange(20, dtype=np.float32).reshape(5, 4) / 3
    np.testing.assert_allclose(halves, full, rtol=1e-3)
    assert not np.array_equal(halves, full)  # rounded, not float32 labelled float16


def test_the_collector_writes_each_chunk_once_it_is_complete(tmp_path):
    prepare(locate(str(tmp_path)), MANIFEST, resume=False)
    paths = [f"/x/{i}.png" for i in range(5)]
    chunks = chunked(paths, 2)  # [0, 0, 1, 1, 2]
    collector = PartCollector(writer(tmp_path), chunks)
    assert collector.missing() == 5
    collector.add(rows([paths[4], paths[0]], chunk=[2, 0]))  # any order, mixed chunks
    assert part_names(tmp_path) == [part_name(pa.array([paths[4]]))]  # chunk 2 is complete
    assert (collector.written, collector.missing()) == (1, 4)
    first = collector.first_part_s
    assert first > 0
    collector.add(rows([paths[2]], chunk=1))
    collector.add(rows([paths[3], paths[1]], chunk=[1, 0]))
    assert collector.missing() == 0
    assert collector.first_part_s == first
    assert part_names(tmp_path) == sorted(
        part_name(pa.array(group)) for group in (paths[:2], paths[2:4], paths[4:])
    )
    assert collector.counts == WriteCounts(5, {})
    times = collector.times()
    assert (times.read_s, times.decode_s, times.infer_s) == pytest.approx((0.005,) * 3)
    assert times.write_s > 0
    with pytest.raises(RuntimeError, match="more rows than images"):
        collector.add(rows([paths[4]], chunk=2))  # a chunk's rows twice: never written twice


def test_rows_are_taken_out_of_a_part_under_the_name_of_the_rest(tmp_path):
    out = locate(str(tmp_path))
    prepare(out, MANIFEST, resume=False)
    paths = [f"/x/{i}.png" for i in range(4)]
    writer(tmp_path).write(rows(paths, failed=frozenset({paths[3]})))
    (name,) = part_names(tmp_path)
    taken = rewrite_part(out, f"{tmp_path}/{EMBEDDINGS}/{name}", frozenset({paths[1], "/y.png"}))
    assert taken == 1
    kept = [paths[0], paths[2]]
    (rewritten,) = part_names(tmp_path)
    assert rewritten == part_name(pa.array(kept))
    assert pq.read_table(tmp_path / EMBEDDINGS / rewritten).column("path").to_pylist() == kept
    assert part_names(tmp_path, ERRORS) == [name]  # the other table's part: left as it was
    # the last row of a part taken out: the part is gone
    assert rewrite_part(out, f"{tmp_path}/{ERRORS}/{name}", frozenset({paths[3]})) == 1
    assert part_names(tmp_path, ERRORS) == []
    assert not list((tmp_path / EMBEDDINGS).glob(".*"))


def test_scan_counts_both_tables_and_drops_temporary_parts(tmp_path):
    prepare(locate(str(tmp_path)), MANIFEST, resume=False)
    writer(tmp_path).write(rows(["/x/1.png", "/x/2.png"], failed=frozenset({"/x/2.png"})))
    (tmp_path / EMBEDDINGS / ".part-1.parquet.abc.tmp").write_bytes(b"half")
    found = scan(locate(str(tmp_path)))
    assert found.done == {"/x/1.png", "/x/2.png"}
    assert (found.embedded, found.refused, found.duplicates) == (1, 1, 0)
    assert found.removed_temporary == 1
    (name,) = part_names(tmp_path)
    one, two = found.held["/x/1.png"], found.held["/x/2.png"]
    assert (one.table, one.part, one.size, one.mtime_ns) == (
        EMBEDDINGS,
        f"{tmp_path}/{EMBEDDINGS}/{name}",
        100,
        10**18,
    )
    assert (two.table, two.size) == (ERRORS, 101)
    assert not list((tmp_path / EMBEDDINGS).glob(".*"))


def test_a_part_without_the_files_state_is_read_as_unknown(tmp_path):
    """A part written by format /2 has no file_size and file_mtime_ns: held, state unknown."""
    prepare(locate(str(tmp_path)), MANIFEST, resume=False)
    pq.write_table(pa.table({"path": ["/x/1.png"]}), tmp_path / EMBEDDINGS / "part-old.parquet")
    held = scan(locate(str(tmp_path))).held["/x/1.png"]
    assert (held.size, held.mtime_ns) == (-1, -1)


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
    old = {
        k: v
        for k, v in asdict(MANIFEST).items()
        if k not in {"model_sha256", "model_file", "dtype"}
    }
    (out / "_smso_embed.json").write_text(json.dumps(old | {"format": "smso-embed/1"}))
    now = replace(MANIFEST, model_sha256="a" * 64, model_file="/models/a.onnx")
    prepare(locate(str(out)), now, resume=True)
    assert JobManifest.from_json((out / "_smso_embed.json").read_bytes()) == now
    with pytest.raises(OutputError, match=r"not /models/b\.onnx"):
        prepare(
            locate(str(out)), replace(now, model_sha256="b" * 64, model_file="/models/b.onnx"), True
        )


def test_a_manifest_of_format_2_is_float32_and_resumed_as_format_3(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    now = replace(MANIFEST, model_sha256="a" * 64, model_file="/models/a.onnx")
    old = {k: v for k, v in asdict(now).items() if k != "dtype"}
    (out / "_smso_embed.json").write_text(json.dumps(old | {"format": "smso-embed/2"}))
    with pytest.raises(OutputError, match=r"dtype 'float32' \(now 'float16'\)"):
        prepare(locate(str(out)), replace(now, dtype="float16"), resume=True)
    prepare(locate(str(out)), now, resume=True)
    written = json.loads((out / "_smso_embed.json").read_text())
    assert (written["format"], written["dtype"]) == ("smso-embed/3", "float32")


def test_prepare_accepts_its_own_job_and_refuses_another(tmp_path):
    out = locate(str(tmp_path / "o"))
    prepare(out, MANIFEST, resume=True)  # resume may start a job
    prepare(out, MANIFEST, resume=True)
    other = JobManifest("m", "1", "c" * 64, 4, 3, False)
    with pytest.raises(OutputError, match="top_k 2 \\(now 3\\)"):
        prepare(out, other, resume=True)
    with pytest.raises(OutputError, match="exists; pass --resume"):
        prepare(out, MANIFEST, resume=False)


class Written:
    """What the progress line reads (a collector's count and stage times)."""

    def __init__(self, written: int = 0, times: StageTimes | None = None) -> None:
        self.written = written
        self._times = times or StageTimes()

    def times(self) -> StageTimes:
        return self._times


def test_the_progress_line():
    progress = Progress(10_000, Written(), stream=io.StringIO())
    assert progress.line(0, 7.0) == "smso-embed: 0 / 10,000 images (0%), starting (7 s)"
    assert progress.line(1_000, 9.0, (1_000, 9.0)) == "smso-embed: 1,000 / 10,000 images (10%)"
    line = progress.line(2_500, 12.0, (1_000, 9.0))  # 1,500 images in 3 s since the first part
    assert line == "smso-embed: 2,500 / 10,000 images (25%), 500 images/s, 15 s left"
    times = StageTimes(read_s=0.4, decode_s=2.1, infer_s=1.3, write_s=0.2)
    assert progress.line(2_500, 12.0, (1_000, 9.0), times) == (
        f"{line}; read 0.4 s, decode 2.1 s, infer 1.3 s, write 0.2 s"
    )
    assert format_duration(3_725) == "1:02:05"
    assert format_duration(65) == "1:05"


def test_the_progress_thread_reads_the_collector():
    stream = io.StringIO()
    source = Written(0)
    with Progress(4, source, stream=stream, interval_s=0.01, log_interval_s=0.0):
        source.written = 4
        for _ in range(200):  # a line is logged every interval (stream not a terminal)
            if "4 / 4 images (100%)" in stream.getvalue():
                break
            time.sleep(0.01)
    assert "smso-embed: 4 / 4 images (100%)" in stream.getvalue()


def test_a_rate_keeps_two_significant_digits() -> None:
    # a job of 3 images in 8 s runs at 0.38 images/s, not "0 images/s"
    assert [format_rate(r) for r in (3 / 8, 2.5, 57.25, 2_656.4)] == [
        "0.38",
        "2.5",
        "57.2",
        "2,656",
    ]
