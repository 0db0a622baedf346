"""smso-embed end to end on a local Ray: the outputs, parity with the service's /embed and
/classify for the same files, refused files in the errors table, resume exactly once, the input
forms. Each job is small (tens of images): a Ray start is shared by the whole session."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from batch.outputs import EMBEDDINGS, ERRORS, MANIFEST
from service.app import create_app
from service.core.settings import Settings
from tests.batch.conftest import MODEL, embed, read, write_pngs
from tests.service.conftest import wait_ready

pytestmark = pytest.mark.usefixtures("ray_cluster")


def service_answers(files, normalize: bool) -> dict[str, dict]:
    """What the service answers for each file: /embed's embedding and typicality, /classify's
    top classes, by file name."""
    settings = Settings(model_path=MODEL, max_batch_size=16)
    answers: dict[str, dict] = {}
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


@pytest.mark.parametrize("normalize", [False, True])
def test_a_folder_gives_the_service_answers_for_every_image(
    png_folder, tmp_path, capsys, normalize
):
    out = tmp_path / "out"
    flags = ["--top-k", "3", *(["--normalize"] if normalize else [])]
    status, summary, err = embed(MODEL, str(png_folder), "-o", str(out), *flags, capsys=capsys)
    assert status == 0, err
    assert summary["embedded"] == 50
    assert summary["refused"] == {}
    assert not summary["faults"]
    rows = read(out)
    files = sorted(png_folder.rglob("*.png"))
    assert [row["path"] for row in rows] == [str(f) for f in files]
    answers = service_answers(files, normalize)
    for row in rows:
        answer = answers[row["path"]]
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
    rows = read(out)
    assert {(r["model_name"], r["model_version"]) for r in rows} == {
        ("fashion_mnist-small_cnn-smso", rows[0]["model_version"])
    }
    assert len({r["card_sha256"] for r in rows}) == 1
    assert len(rows[0]["card_sha256"]) == 64
    assert (out / MANIFEST).is_file()
    # what readers see: no temporary or hidden files, one row group per part
    assert not [p for p in (out / EMBEDDINGS).iterdir() if not p.name.startswith("part-")]
    assert all(pq.ParquetFile(p).num_row_groups == 1 for p in (out / EMBEDDINGS).iterdir())


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
    paths = [row["path"] for row in read(out)]
    assert sorted(paths) == sorted(str(p) for p in folder.glob("*.png"))  # each once
    assert not list((out / EMBEDDINGS).glob(".*"))
    # resuming a finished job does nothing, and starts no Ray
    status, summary, _ = embed(MODEL, str(folder), "-o", str(out), "--resume", capsys=capsys)
    assert (status, summary["todo"], summary["out_embedded"]) == (0, 0, 30)


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


def test_decoding_in_the_actors_gives_the_same_rows(png_folder, tmp_path, capsys):
    for name, flags in (
        ("tasks", []),
        ("actors", ["--decode-in-actors", "--actors", "2", "--batch-size", "16"]),
    ):
        status, _, err = embed(
            MODEL, str(png_folder), "-o", str(tmp_path / name), *flags, capsys=capsys
        )
        assert status == 0, err
    tasks, actors = read(tmp_path / "tasks"), read(tmp_path / "actors")
    assert [r["path"] for r in tasks] == [r["path"] for r in actors]
    np.testing.assert_array_equal([r["embedding"] for r in tasks], [r["embedding"] for r in actors])
