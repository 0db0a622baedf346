"""``/search`` on a gallery of real images through the shipped model: an image finds itself,
the neighbours are numpy's exact ones, ``k`` and ``min_similarity`` bound them, a JSON vector
answers what its image answers; a gallery of another model, or a damaged one, is refused and the
model serves on; a new generation replaces the gallery under traffic and no request is lost."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gallery.search import MAX_K
from gallery.stamp import Stamp
from gallery.store import MANIFEST
from service.app import create_app
from service.core.settings import Settings

from .conftest import wait_ready
from .galleries import Embedded, build_gallery, embedded, exact_neighbours, files, path_of
from .models.conftest import put

#: the gallery holds images 0..39; images 40..47 are queries it does not hold
GALLERY_ROWS = range(40)
OTHERS = range(40, 48)


@pytest.fixture(scope="module")
def images(shipped_model: str) -> Embedded:
    with TestClient(create_app(Settings(model_path=shipped_model, max_batch_size=8))) as client:
        wait_ready(client)
        return embedded(client, 48)


@pytest.fixture(scope="module")
def gallery_dir(images: Embedded, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("galleries") / "fashion"
    build_gallery(folder, images, GALLERY_ROWS)
    return folder


@pytest.fixture
def serve(shipped_model: str) -> Iterator[Callable[..., TestClient]]:
    """``serve(**settings)``: a ready app on the shipped model (closed after the test)."""
    clients: list[TestClient] = []

    def start(**settings: Any) -> TestClient:
        settings = {"model_path": shipped_model, "max_batch_size": 8, **settings}
        client = TestClient(create_app(Settings(**settings)))
        client.__enter__()
        clients.append(client)
        wait_ready(client)
        return client

    yield start
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture(scope="module")
def client(shipped_model: str, gallery_dir: Path) -> Iterator[TestClient]:
    """One server with the gallery, for the tests that only ask."""
    settings = Settings(model_path=shipped_model, max_batch_size=8, gallery_path=gallery_dir)
    with TestClient(create_app(settings)) as served:
        wait_ready(served)
        yield served


def search(client: TestClient, images: list[bytes], **params: Any) -> dict[str, Any]:
    response = client.post("/search", files=files(images), params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_gallery_image_finds_itself_first(client, images):
    body = search(client, images.pngs[:8], k=3)
    assert [r["neighbours"][0]["path"] for r in body["results"]] == [path_of(i) for i in range(8)]
    assert all(r["neighbours"][0]["similarity"] >= 0.999 for r in body["results"])
    assert [r["filename"] for r in body["results"]] == [f"{i}.png" for i in range(8)]
    metadata = client.get("/metadata").json()
    assert body["model"] == metadata["model"]
    gallery = metadata["gallery"]
    assert body["gallery"] == {k: gallery[k] for k in ("generation", "items", "dtype")}
    assert body["gallery"]["items"] == 40


def test_each_result_gives_the_images_own_top_class_as_classify_does(client, images):
    body = search(client, images.pngs[:4])
    top = client.post("/classify", files=files(images.pngs[:4]), params={"top_k": 1}).json()
    for result, classified in zip(body["results"], top["results"], strict=True):
        assert result["prediction"] == classified["predictions"][0]
        assert result["typicality"] == classified["typicality"]  # the shipped model scores it


def test_the_neighbours_are_numpys_exact_cosine_neighbours(client, images):
    """Images the gallery does not hold, against the exact search of the standardised
    embeddings in numpy (the gallery is an exact f32 one below 20,000 items)."""
    queries = list(OTHERS)
    body = search(client, [images.pngs[i] for i in queries], k=5)
    gallery_x = images.embeddings[list(GALLERY_ROWS)]
    want = exact_neighbours(gallery_x, images.embeddings[queries], 5)
    for result, rows in zip(body["results"], want, strict=True):
        assert [n["path"] for n in result["neighbours"]] == [path_of(int(i)) for i in rows]
        assert [n["label"] for n in result["neighbours"]] == [
            images.card.classes[images.labels[i]] for i in rows
        ]
        similarities = [n["similarity"] for n in result["neighbours"]]
        assert similarities == sorted(similarities, reverse=True)


def test_k_bounds_the_neighbours_and_min_similarity_keeps_the_close_ones(client, images):
    query = [images.pngs[3]]
    assert len(search(client, query, k=1)["results"][0]["neighbours"]) == 1
    assert len(search(client, query)["results"][0]["neighbours"]) == 10  # the default
    assert len(search(client, query, k=MAX_K)["results"][0]["neighbours"]) == 40  # all it holds
    close = search(client, query, k=40, min_similarity=0.999)["results"][0]["neighbours"]
    assert [n["path"] for n in close] == [path_of(3)]
    some = search(client, query, k=40, min_similarity=0.5)["results"][0]["neighbours"]
    everything = search(client, query, k=40)["results"][0]["neighbours"]
    assert some == [n for n in everything if n["similarity"] >= 0.5]
    assert 1 <= len(some) < 40


def test_an_embedding_sent_as_json_answers_what_its_image_answers(client, images):
    uploaded = search(client, images.pngs[40:43], k=4)
    vector = images.embeddings[40].tolist()
    one = client.post("/search", params={"k": 4}, json={"embedding": vector})
    assert one.status_code == 200, one.text
    several = client.post(
        "/search", params={"k": 4}, json={"embeddings": images.embeddings[40:43].tolist()}
    )
    assert several.status_code == 200, several.text
    # /embed's vectors, searched: the same neighbours and similarities, to the last bit
    by_image = [r["neighbours"] for r in uploaded["results"]]
    assert [r["neighbours"] for r in several.json()["results"]] == by_image
    assert one.json()["results"][0]["neighbours"] == by_image[0]
    assert one.json()["results"][0]["filename"] is None
    assert one.json()["results"][0]["prediction"] is None
    assert one.json()["gallery"] == uploaded["gallery"]


def test_a_raw_image_body_is_searched_as_a_file_part(client, images):
    raw = client.post(
        "/search", content=images.pngs[5], headers={"content-type": "image/png"}, params={"k": 2}
    )
    assert raw.status_code == 200
    assert raw.json()["results"][0]["filename"] == "body"
    assert raw.json()["results"][0]["neighbours"][0]["path"] == path_of(5)


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"k": 0}, "invalid_request"),
        ({"k": MAX_K + 1}, "invalid_request"),
        ({"k": "ten"}, "invalid_request"),
        ({"min_similarity": 1.5}, "invalid_request"),
        ({"min_similarity": "nan"}, "invalid_request"),
        ({"top_k": 3}, "unknown_query_parameter"),
    ],
)
def test_a_bad_query_is_422(client, images, params, code):
    response = client.post("/search", files=files(images.pngs[:1]), params=params)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == code


@pytest.mark.parametrize(
    ("body", "status", "code", "says"),
    [
        ({"embedding": [0.5] * 63}, 400, "invalid_embedding", "has 63 values; the gallery"),
        ({"embeddings": [[0.5] * 64, [0.5] * 65]}, 400, "invalid_embedding", "embedding 1 has 65"),
        ({"embedding": [1e39] * 64}, 400, "invalid_embedding", "float32"),
        ({"embedding": ["a"] * 64}, 400, "invalid_json", "embedding[0]: Input should be a valid"),
        ({}, 400, "invalid_json", 'give either "embedding"'),
        ({"embedding": [0.5] * 64, "k": 3}, 400, "invalid_json", "k: Extra inputs"),
        ({"embeddings": [[0.5] * 64] * 65}, 413, "too_many_files", "at most 64 queries"),
    ],
)
def test_a_bad_json_body_is_refused_and_says_why(client, body, status, code, says):
    response = client.post("/search", json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code
    assert says in error["message"]


def test_json_that_does_not_parse_is_400(client):
    response = client.post(
        "/search", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


def test_without_a_gallery_search_is_404_and_says_how_to_give_one(serve, images):
    client = serve()
    response = client.post("/search", files=files(images.pngs[:1]))
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "no_gallery"
    assert "--gallery GALLERY" in error["message"]
    metadata = client.get("/metadata").json()
    assert metadata["gallery"] is None
    assert metadata["gallery_refused"] is None


def test_a_gallery_of_another_model_is_refused_and_the_model_serves(
    serve, images, tmp_path, caplog
):
    other = Stamp("fashion_mnist-small_cnn-gap", "ffffffffffff", "b" * 64)
    build_gallery(tmp_path / "other", images, GALLERY_ROWS, stamp=other)
    caplog.set_level(logging.ERROR, logger="service")
    client = serve(gallery_path=tmp_path / "other")
    card = images.card
    ours = f"{card.name} version {card.model_version}"
    (line,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "fashion_mnist-small_cnn-gap version ffffffffffff" in line  # the gallery's model
    assert ours in line  # and the one served
    assert "embeddings of two models cannot be compared" in line
    assert "serves without a gallery" in line
    classify = client.post("/classify", files=files(images.pngs[:1]))
    assert classify.status_code == 200
    metadata = client.get("/metadata").json()
    assert metadata["gallery"] is None
    assert "fashion_mnist-small_cnn-gap" in metadata["gallery_refused"]
    assert str(tmp_path) not in metadata["gallery_refused"]  # the folder by its name only
    refused = client.post("/search", files=files(images.pngs[:1]))
    assert refused.status_code == 404
    assert "the gallery was refused" in refused.json()["error"]["message"]


def _truncate_codes(folder: Path) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    codes = folder / manifest["files"]["codes"]["name"]
    codes.write_bytes(codes.read_bytes()[:100])


def _garbage_manifest(folder: Path) -> None:
    (folder / MANIFEST).write_bytes(b"\x00\xff not a manifest")


def _mistyped_manifest(folder: Path) -> None:
    """A field of the wrong type, which the checksums do not cover
    (tests/gallery/test_damaged_manifests.py)."""
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["standardisation"] = 5
    (folder / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (_truncate_codes, "the file is truncated"),
        (_garbage_manifest, "is not a gallery manifest"),
        (_mistyped_manifest, "a field is missing or of the wrong type"),
    ],
)
def test_a_damaged_gallery_is_refused_and_the_model_serves(
    serve, images, tmp_path, caplog, damage, says
):
    build_gallery(tmp_path / "g", images, range(10))
    damage(tmp_path / "g")
    caplog.set_level(logging.ERROR, logger="service")
    client = serve(gallery_path=tmp_path / "g")
    assert client.post("/classify", files=files(images.pngs[:1])).status_code == 200
    metadata = client.get("/metadata").json()
    assert metadata["gallery"] is None
    assert says in metadata["gallery_refused"]
    assert any(says in r.getMessage() for r in caplog.records)
    assert not any(r.exc_info for r in caplog.records)  # one line, no traceback
    assert client.post("/search", files=files(images.pngs[:1])).status_code == 404


def test_a_new_generation_replaces_the_gallery_and_no_request_is_lost(serve, images, tmp_path):
    """Two clients search while smso-index's build replaces the gallery twice: every request is
    answered, each by one whole generation (its neighbours are that generation's items)."""
    folder = tmp_path / "g"
    subsets = {build_gallery(folder, images, range(0, 30)).items: set(range(0, 30))}
    client = serve(gallery_path=folder, repository_poll_s=0.05)
    first = client.get("/metadata").json()["gallery"]["generation"]
    answers: list[dict[str, Any]] = []
    failures: list[str] = []
    stop = threading.Event()
    query = files([images.pngs[20]])  # in every generation

    def ask() -> None:
        while not stop.is_set():
            response = client.post("/search", files=query, params={"k": MAX_K})
            if response.status_code != 200:
                failures.append(f"{response.status_code} {response.text[:200]}")
            else:
                answers.append(response.json())

    def serving() -> str:
        return client.get("/metadata").json()["gallery"]["generation"]

    def more_than(count: int) -> Callable[[], bool]:
        return lambda: len(answers) > count

    generations = [first]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(ask), pool.submit(ask)]
        until(more_than(4))  # answered by the first generation
        for rows in (range(10, 34), range(16, 34)):  # 24 items, then 18
            summary = build_gallery(folder, images, rows)  # an update: a new generation
            subsets[summary.items] = set(rows)
            until(lambda: serving() not in generations)
            generations.append(serving())
            until(more_than(len(answers) + 4))  # answered by the new one, meanwhile
        stop.set()
        for future in futures:
            future.result()
    assert failures == []
    assert len(set(generations)) == 3
    by_generation: dict[str, int] = {}
    for answer in answers:
        gallery = answer["gallery"]
        assert gallery["generation"] in generations
        paths = {n["path"] for n in answer["results"][0]["neighbours"]}
        assert paths == {path_of(i) for i in subsets[gallery["items"]]}  # one generation whole
        by_generation[gallery["generation"]] = by_generation.get(gallery["generation"], 0) + 1
    assert set(by_generation) == set(generations)


def test_a_removed_gallery_stops_serving_and_a_new_one_is_picked_up(serve, images, tmp_path):
    folder = tmp_path / "g"
    build_gallery(folder, images, range(10))
    client = serve(gallery_path=folder, repository_poll_s=0.05)
    assert client.post("/search", files=files(images.pngs[:1])).status_code == 200
    for path in folder.iterdir():
        path.unlink()
    until(lambda: client.get("/metadata").json()["gallery"] is None)
    assert "has no gallery.json" in client.get("/metadata").json()["gallery_refused"]
    assert client.post("/search", files=files(images.pngs[:1])).status_code == 404
    build_gallery(folder, images, range(20))
    until(lambda: client.get("/metadata").json()["gallery"] is not None)
    assert client.get("/metadata").json()["gallery_refused"] is None
    assert search(client, images.pngs[:1])["gallery"]["items"] == 20


def test_metrics_give_the_search_latency_and_the_gallery_size(client, images):
    search(client, images.pngs[:2])
    client.post("/search", json={"embedding": images.embeddings[0].tolist()})
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    model = client.get("/metadata").json()["model"]
    labels = {"model": model["name"], "version": model["version"]}
    (items,) = [s for s in families["smso_gallery_items"].samples if s.labels == labels]
    assert items.value == 40
    (count,) = [
        s
        for s in families["smso_search_seconds"].samples
        if s.name == "smso_search_seconds_count" and s.labels == labels
    ]
    assert count.value >= 2
    images_total = families["smso_images"].samples
    assert any(s.labels.get("route") == "/search" for s in images_total)


def test_with_an_api_key_search_needs_it(serve, images, gallery_dir):
    client = serve(gallery_path=gallery_dir, api_key="s3cret")
    assert client.post("/search", files=files(images.pngs[:1])).status_code == 401
    assert client.post("/search", json={"embedding": [0.0] * 64}).status_code == 401
    key = {"x-api-key": "s3cret"}
    assert client.post("/search", files=files(images.pngs[:1]), headers=key).status_code == 200


def test_the_openapi_documents_search(client):
    operation = client.get("/openapi.json").json()["paths"]["/search"]["post"]
    content = operation["requestBody"]["content"]
    assert {"multipart/form-data", "image/*", "application/json"} <= set(content)
    params = {p["name"]: p["schema"] for p in operation["parameters"]}
    assert params["k"]["maximum"] == MAX_K
    assert "404" in operation["responses"]


def until(check: Callable[[], bool], seconds: float = 60) -> None:
    """Until ``check()`` holds; failing after ``seconds`` (a bound, not a timing asserted)."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.02)


def test_searches_under_the_named_model_routes_too(client, images):
    model = client.get("/metadata").json()["model"]
    for path in (
        f"/models/{model['name']}/search",
        f"/models/{model['name']}/versions/{model['version']}/search",
    ):
        response = client.post(path, files=files(images.pngs[:1]), params={"k": 1})
        assert response.status_code == 200
        assert response.json()["results"][0]["neighbours"][0]["path"] == path_of(0)
    missing = client.post("/models/nope/search", files=files(images.pngs[:1]))
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


def test_a_repository_versions_gallery_folder_is_its_gallery(shipped_model, images, tmp_path):
    """``<name>/<version>/gallery`` beside the model file: that version's gallery, in
    /metadata and the repository index; a version without one searches nothing."""
    root = tmp_path / "models"
    boots = put(root, "boots", 1, shipped_model)
    put(root, "shirts", 1, shipped_model)
    build_gallery(boots / "gallery", images, range(12))
    settings = Settings(model_repository=root, max_batch_size=8, repository_poll_s=0.05)
    with TestClient(create_app(settings)) as client:
        wait_ready(client)
        found = client.post("/models/boots/search", files=files(images.pngs[:1]), params={"k": 1})
        assert found.status_code == 200
        assert found.json()["model"] == {"name": "boots", "version": "1"}
        assert found.json()["results"][0]["neighbours"][0]["path"] == path_of(0)
        assert client.post("/models/shirts/search", json={"embedding": [0.0]}).status_code == 404
        metadata = client.get("/models/boots/metadata").json()
        assert metadata["gallery"]["path"] == "boots/1/gallery"  # by its place, not the path
        assert metadata["gallery"]["items"] == 12
        index = {e["name"]: e for e in client.post("/v2/repository/index").json()}
        assert index["boots"]["gallery"]["items"] == 12
        assert index["shirts"]["gallery"] is None
        assert index["shirts"]["gallery_refused"] is None  # none there: nothing refused
        # the next version, with a gallery of its own, replaces both
        build_gallery(tmp_path / "staged", images, range(20))
        two = root / "boots" / "2"
        two.mkdir()
        (tmp_path / "staged").rename(two / "gallery")
        put(root, "boots", 2, shipped_model)
        until(lambda: client.get("/models/boots/metadata").json()["model"]["version"] == "2")
        answer = client.post("/models/boots/search", json={"embedding": [0.5] * 64}).json()
        assert answer["gallery"]["items"] == 20
