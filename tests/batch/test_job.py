"""smso-embed end to end: the outputs, parity with the service's /embed and /classify for the
same files on both engines (the embedded one, the default, and Ray's on the session's Ray), the
same rows however the embedded engine spreads its stages, refused files in the errors table,
resume exactly once, the input forms, and where the job's time went (the summary's stages).
Each job is small (tens of images)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from batch.cli import main
from batch.local_engine import default_local_options
from batch.outputs import EMBEDDINGS, ERRORS, MANIFEST
from service.app import create_app
from service.core.settings import Settings
from tests.batch.conftest import MODEL, embed, read, write_pngs
from tests.service.conftest import wait_ready

STAGES = ("read_s", "decode_s", "infer_s", "write_s")


def service_answers(files: list[Path], normalize: bool) -> dict[str, dict[str, Any]]:
    """What the service answers for each file: /embed's embedding and typicality, /classify's
    top classes, by file name."""
    settings = Settings(model_path=MODEL, max_batch_size=16)
    answers: dict[str, dict[str, Any]] = {}
    with TestClient(create_app(settings)) as client:
        wait_ready(client)
        for start in range(0, len(files), 32):
            chunk = files[start : start + 32]
            uploads = [("file", (str(f), f.read_bytes(), "image/png")) for f in chunk]
            params = {"normalize": "true"} if normalize else {}
            embedded = client.post("/embed", files=uploads, params=params)
            classified = client.post("/classify", files=uploads, params={"top_k": 3})
            assert embedded.status_code == 200, embedded.text
            for e, c in zip(embedded.json()["results"], classified.json()["results"], strict=True):
                answers[e["filename"]] = e | {"predictions": c["predictions"]}
    return answers


@pytest.fixture(scope="module")
def answers(png_folder: Path) -> dict[bool, dict[str, dict[str, Any]]]:
    """The service's answers for ``png_folder``, without and with ``normalize``."""
    files = sorted(png_folder.rglob("*.png"))
    return {normalize: service_answers(files, normalize) for normalize in (False, True)}


def engine_flags(engine: str, request: pytest.FixtureRequest) -> list[str]:
    """The flags that run on ``engine``: nothing for the default, the session's Ray for Ray."""
    if engine == "local":
        return []
    request.getfixturevalue("ray_cluster")
    return ["--engine", "ray"]


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("engine", ["local", "ray"])
def test_a_folder_gives_the_service_answers_for_every_image(
    png_folder, answers, tmp_path, capsys, request, engine, normalize
):
    out = tmp_path / "out"
    flags = ["--top-k", "3", *(["--normalize"] if normalize else [])]
    flags += engine_flags(engine, request)
    status, summary, err = embed(MODEL, str(png_folder), "-o", str(out), *flags, capsys=capsys)
    assert status == 0, err
    assert summary["engine"] == engine
    assert summary["embedded"] == 50
    assert summary["refused"] == {}
    assert not summary["faults"]
    rows = read(out)
    files = sorted(png_folder.rglob("*.png"))
    assert [row["path"] for row in rows] == [str(f) for f in files]
    for row in rows:
        answer = answers[normalize][row["path"]]
        np.testing.assert_allclose(row["embedding"], answer["embedding"], rtol=0, atol=1e-5)
        labels = [p["label"] for p in answer["predictions"]]
        assert row["top_k_labels"] == labels
        np.testing.assert_allclose(
            row["top_k_scores"], [p["score"] for p in answer["predictions"]], atol=1e-6
        )
        assert row["typicality_score"] == pytest.approx(answer["typicality"]["score"], abs=1e-4)
        assert row["typicality_p_value"] == pytest.approx(answer["typicality"]["p_value"], abs=1e-6)
    if normalize:
        norms = np.linalg.norm([row["embedding"] for row in rows], axis=1)
        np.testing.assert_allclose(norms, 1, atol=1e-6)


def test_the_tables_schema_and_the_model_named_in_every_row(png_folder, tmp_path, capsys):
    out = tmp_path / "out"
    assert embed(MODEL, str(png_folder), "-o", str(out), capsys=capsys)[0] == 0
    schema = pq.read_schema(next((out / EMBEDDINGS).glob("part-*.parquet")))
    assert schema.field("embedding").type == pa.list_(pa.float32(), 64)
    assert schema.field("top_k_labels").type == pa.list_(pa.string(), 5)
    assert schema.field("file_size").type == pa.int64()
    assert schema.field("file_mtime_ns").type == pa.int64()
    rows = read(out)
    assert {(r["model_name"], r["model_version"]) for r in rows} == {
        ("fashion_mnist-small_cnn-smso", rows[0]["model_version"])
    }
    assert len({r["card_sha256"] for r in rows}) == 1
    assert len(rows[0]["card_sha256"]) == 64
    for row in rows:  # the file as it was read: what a resume compares
        state = Path(row["path"]).stat()
        assert (row["file_size"], row["file_mtime_ns"]) == (state.st_size, state.st_mtime_ns)
    assert (out / MANIFEST).is_file()
    # what readers see: no temporary or hidden files, one row group per part
    assert not [p for p in (out / EMBEDDINGS).iterdir() if not p.name.startswith("part-")]
    assert all(pq.ParquetFile(p).num_row_groups == 1 for p in (out / EMBEDDINGS).iterdir())


@pytest.mark.parametrize(
    ("flags", "sessions"),
    [
        (["--decoders", "0"], None),
        (["--sessions", "2", "--decoders", "2", "--decode-batch", "7", "--batch-size", "16"], 2),
        (["--sessions", "1", "--threads", "2"], 1),
    ],
    ids=["sessions-decode", "two-sessions", "one-session"],
)
def test_however_the_embedded_engine_spreads_its_stages_the_rows_are_the_same(
    png_folder, tmp_path, capsys, flags, sessions
):
    status, _, err = embed(MODEL, str(png_folder), "-o", str(tmp_path / "default"), capsys=capsys)
    assert status == 0, err
    status, summary, err = embed(
        MODEL, str(png_folder), "-o", str(tmp_path / "spread"), *flags, capsys=capsys
    )
    assert status == 0, err
    infer = sessions or default_local_options().sessions
    decode = infer if flags[:2] == ["--decoders", "0"] else summary["workers"]["decode"]
    assert summary["workers"] == {"decode": decode, "infer": infer, "write": 1}
    default, spread = read(tmp_path / "default"), read(tmp_path / "spread")
    assert [r["path"] for r in default] == [r["path"] for r in spread]
    assert [r["top_k_labels"] for r in default] == [r["top_k_labels"] for r in spread]
    np.testing.assert_allclose(
        [r["embedding"] for r in default], [r["embedding"] for r in spread], rtol=0, atol=1e-6
    )


def test_refused_files_go_to_the_errors_table_and_the_rest_complete(tmp_path, capsys):
    folder = tmp_path / "in"
    good = write_pngs(folder, 20)
    (folder / "truncated.png").write_bytes(good[0].read_bytes()[:60])
    (folder / "text.png").write_text("not an image")
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "big.png").write_bytes(good[1].read_bytes() + b"\0" * 2048)  # over --max-bytes
    out = tmp_path / "out"
    args = (MODEL, str(folder), "-o", str(out), "--max-bytes", "2000")
    status, summary, err = embed(*args, capsys=capsys)
    assert status == 0, err  # refused images are not the job's fault
    assert summary["embedded"] == 20
    assert summary["refused"] == {"file_too_large": 1, "invalid_image": 3}
    errors = {row["path"].rsplit("/", 1)[1]: row for row in read(out, ERRORS)}
    assert set(errors) == {"truncated.png", "text.png", "empty.jpg", "big.png"}
    assert errors["empty.jpg"]["message"].endswith("the file is empty")
    assert errors["big.png"]["kind"] == "file_too_large"
    assert errors["big.png"]["file_size"] == (folder / "big.png").stat().st_size
    assert len(read(out)) == 20


def test_resume_writes_every_image_exactly_once(tmp_path, capsys):
    folder = tmp_path / "in"
    write_pngs(folder, 30)
    out = tmp_path / "out"
    listing = tmp_path / "first.csv"  # a first run that stopped after 12 images
    listing.write_text("path\n" + "".join(f"in/{i:05d}.png\n" for i in range(12)))
    assert embed(MODEL, str(listing), "-o", str(out), capsys=capsys)[0] == 0
    # a stopped run's half-written part is a hidden temporary file: deleted, never read
    (out / EMBEDDINGS / ".part-x.parquet.0.tmp").write_bytes(b"PAR1 half")
    status, summary, err = embed(MODEL, str(folder), "-o", str(out), "--resume", capsys=capsys)
    assert status == 0, err
    assert (summary["skipped"], summary["todo"], summary["embedded"]) == (12, 18, 18)
    assert (summary["new"], summary["changed"], summary["deleted"]) == (18, 0, 0)
    paths = [row["path"] for row in read(out)]
    assert sorted(paths) == sorted(str(p) for p in folder.glob("*.png"))  # each once
    assert not list((out / EMBEDDINGS).glob(".*"))
    # resuming a finished job does nothing, and starts no engine
    status, summary, _ = embed(MODEL, str(folder), "-o", str(out), "--resume", capsys=capsys)
    assert (status, summary["todo"], summary["out_embedded"]) == (0, 0, 30)
    assert (summary["engine"], summary["stages"]) == ("", {})


def test_a_parquet_list_and_a_glob(png_folder, tmp_path, capsys):
    files = sorted(png_folder.rglob("*.png"))[:7]
    listing = tmp_path / "list.parquet"
    pq.write_table(pa.table({"image": [str(f) for f in files]}), listing)
    out = tmp_path / "a"
    status, summary, err = embed(
        MODEL, str(listing), "-o", str(out), "--column", "image", capsys=capsys
    )
    assert status == 0, err
    assert [row["path"] for row in read(out)] == [str(f) for f in files]
    pattern = str(png_folder / "more" / "*.png")
    status, summary, err = embed(MODEL, pattern, "-o", str(tmp_path / "b"), capsys=capsys)
    assert (status, summary["embedded"]) == (0, 10)


@pytest.mark.parametrize("engine", ["local", "ray"])
def test_the_summary_says_where_the_time_went(png_folder, tmp_path, capsys, request, engine):
    """Every stage of a real job took time, and the stage bounding it is one of the four."""
    flags = engine_flags(engine, request)
    out = tmp_path / "out"
    status, summary, err = embed(MODEL, str(png_folder), "-o", str(out), *flags, capsys=capsys)
    assert status == 0, err
    assert set(summary["stages"]) == set(STAGES)
    assert all(summary["stages"][stage] > 0 for stage in STAGES), summary["stages"]
    assert summary["bound"] in {"read", "decode", "infer", "write"}
    assert set(summary["workers"]) == {"decode", "infer", "write"}
    assert summary["first_part_seconds"] > 0
    assert summary["first_part_seconds"] <= summary["seconds"] + 0.001  # rounded to 1 ms
    if engine == "ray":
        return
    assert summary["start_seconds"] == 0
    # and in words, in the text summary
    capsys.readouterr()
    args = [MODEL, str(png_folder), "-o", str(tmp_path / "text"), "--no-progress", *flags]
    assert main(args) == 0
    text = capsys.readouterr().out
    (stages,) = [line for line in text.splitlines() if line.startswith("  stages     ")]
    assert stages.endswith(" bounds the job")
    assert f"{engine} engine" in text


@pytest.mark.usefixtures("ray_cluster")
def test_decoding_in_the_actors_gives_the_same_rows(png_folder, tmp_path, capsys):
    for name, flags in (
        ("tasks", []),
        ("actors", ["--decode-in-actors", "--actors", "2", "--batch-size", "16"]),
    ):
        status, _, err = embed(
            MODEL,
            str(png_folder),
            "-o",
            str(tmp_path / name),
            "--engine",
            "ray",
            *flags,
            capsys=capsys,
        )
        assert status == 0, err
    tasks, actors = read(tmp_path / "tasks"), read(tmp_path / "actors")
    assert [r["path"] for r in tasks] == [r["path"] for r in actors]
    np.testing.assert_array_equal([r["embedding"] for r in tasks], [r["embedding"] for r in actors])
