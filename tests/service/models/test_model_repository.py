"""A model repository in Triton's layout: several models served at once, the highest version of
each, followed while the server runs (poll) or driven by the repository API (explicit), with no
request failing because of a load, a new version or an unload."""

from __future__ import annotations

import concurrent.futures
import shutil
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.core.settings import Settings
from service.models.repository import scan
from tests.service.conftest import grey
from tests.service.models.conftest import put
from tests.service.test_server import real_server

Files = list[tuple[str, tuple[str, bytes, str]]]


def image() -> Files:
    return [("file", ("a.png", grey(128), "image/png"))]


def index(client: TestClient) -> dict[str, tuple[str, str]]:
    entries = client.post("/v2/repository/index").json()
    return {e["name"]: (e["version"], e["state"]) for e in entries}


def until(check: Callable[[], bool], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.05)


def test_the_layout_is_read_as_triton_reads_it(tmp_path, shipped_model):
    root = tmp_path / "models"
    put(root, "a", 1, shipped_model)
    put(root, "a", 10, shipped_model)  # 10 > 9: numbers, not strings
    put(root, "a", 9, shipped_model)
    (root / "a" / "0").mkdir()  # not a positive version
    (root / "a" / "latest").mkdir()
    (root / "empty" / "1").mkdir(parents=True)  # no model.onnx
    (root / "bad name!").mkdir()
    (root / "notes.txt").write_text("a file, not a model")
    found = scan(root)
    assert list(found) == ["a"]
    assert found["a"].number == 10


def test_each_model_serves_under_its_folder_name_at_its_highest_version(serve, repository):
    client = serve(repository, default_model="boots")
    assert index(client) == {"boots": ("1", "READY"), "shirts": ("2", "READY")}
    answer = client.post("/models/shirts/classify", files=image())
    assert answer.status_code == 200
    assert answer.json()["model"] == {"name": "shirts", "version": "2"}
    assert client.post("/models/shirts/versions/2/embed", files=image()).json()["dim"] == 64
    assert client.post("/models/shirts/versions/1/embed", files=image()).status_code == 404
    assert client.post("/classify", files=image()).json()["model"]["name"] == "boots"
    assert client.get("/models/shirts/metadata").json()["model"]["version"] == "2"
    assert client.get("/v2/models/shirts/versions/2/ready").status_code == 200
    assert client.get("/v2/models/shirts/versions/1/ready").status_code == 404
    assert client.get("/v2").json()["extensions"][-1] == "model_repository"


def test_without_a_default_the_unnamed_routes_say_which_models_there_are(serve, repository):
    client = serve(repository)
    answer = client.post("/classify", files=image())
    assert answer.status_code == 404
    assert "['boots', 'shirts']" in answer.json()["error"]["message"]
    assert client.post("/models/boots/classify", files=image()).status_code == 200


def test_a_broken_model_is_unavailable_with_its_reason_and_the_others_serve(serve, repository):
    broken = repository / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"not an onnx file")
    client = serve(repository, default_model="boots")
    entries = {e["name"]: e for e in client.post("/v2/repository/index").json()}
    assert entries["broken"]["state"] == "UNAVAILABLE"
    assert "not a loadable ONNX model" in entries["broken"]["reason"]
    refused = client.post("/models/broken/classify", files=image())
    assert refused.status_code == 503
    assert "retry-after" not in refused.headers  # for good, until the file changes
    assert client.post("/models/boots/classify", files=image()).status_code == 200
    assert client.get("/readyz").status_code == 200  # the default model serves


def test_poll_follows_the_folder_and_no_request_fails_meanwhile(serve, repository, shipped_model):
    """A model moved in and out, a new version, a removed one, while two clients keep asking
    the models that stay: every one of their requests is answered."""
    client = serve(repository, default_model="boots")
    failures: list[str] = []
    answered = [0]
    stop = threading.Event()

    def ask(route: str) -> None:
        while not stop.is_set():
            response = client.post(route, files=image())
            if response.status_code != 200:
                failures.append(f"{route}: {response.status_code} {response.text[:100]}")
            answered[0] += 1

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pool.submit(ask, "/models/shirts/classify")
        pool.submit(ask, "/classify")
        put(repository, "coats", 1, shipped_model)  # a new model
        until(lambda: index(client).get("coats") == ("1", "READY"))
        assert client.post("/models/coats/classify", files=image()).status_code == 200
        put(repository, "shirts", 3, shipped_model)  # a new version, loaded beside the old
        until(lambda: index(client)["shirts"] == ("3", "READY"))
        shutil.rmtree(repository / "coats")  # moved out
        until(lambda: "coats" not in index(client))
        put(repository, "boots", 2, shipped_model)  # the default model's new version
        until(lambda: index(client)["boots"] == ("2", "READY"))
        time.sleep(0.3)
        stop.set()
    assert failures == []
    assert answered[0] > 10
    assert client.post("/models/coats/classify", files=image()).status_code == 404
    assert client.post("/models/shirts/classify", files=image()).json()["model"]["version"] == "3"


def test_explicit_control_loads_and_unloads_on_request(serve, repository, shipped_model):
    client = serve(repository, model_control="explicit", default_model="boots")
    put(repository, "coats", 1, shipped_model)
    time.sleep(0.3)
    assert "coats" not in index(client)  # not followed
    assert client.post("/v2/repository/models/coats/load").status_code == 200
    assert index(client)["coats"] == ("1", "READY")
    assert client.post("/models/coats/classify", files=image()).status_code == 200
    assert client.post("/v2/repository/models/coats/unload").status_code == 200
    assert client.post("/models/coats/classify", files=image()).status_code == 404
    assert client.post("/v2/repository/models/nothing/load").status_code == 404
    assert client.post("/v2/repository/models/nothing/unload").status_code == 404


def test_poll_control_refuses_an_unload_that_the_next_scan_would_undo(serve, repository):
    client = serve(repository, default_model="boots")  # model_control "poll", the default
    answer = client.post("/v2/repository/models/boots/unload")
    assert answer.status_code == 400
    assert answer.json()["error"] == (
        "the server follows its repository folder (model control 'poll'): remove "
        f"{repository / 'boots'} to unload 'boots', or start the server with --model-control "
        "explicit to load and unload through this API"
    )
    assert index(client)["boots"] == ("1", "READY")
    assert client.post("/v2/repository/models/boots/load").status_code == 200  # the folder's


def test_a_single_model_server_has_no_repository_routes(make_client):
    client = make_client()
    assert client.post("/v2/repository/index").status_code == 404
    assert "model_repository" not in client.get("/v2").json()["extensions"]


def test_a_repository_that_is_not_a_folder_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        Settings(model_repository=tmp_path / "nowhere")


@pytest.mark.slow
def test_smso_serve_serves_a_repository(repository, tmp_path):
    # the images set SMSO_MODEL_PATH; a repository wins over it, existing or not
    with real_server(
        str(tmp_path / "absent.onnx"),
        "--model-repository",
        str(repository),
        "--default-model",
        "shirts",
    ) as (base, _):
        answer = httpx.post(f"{base}/classify", files=image())
        assert answer.json()["model"] == {"name": "shirts", "version": "2"}
        assert httpx.post(f"{base}/models/boots/classify", files=image()).status_code == 200


def test_metrics_carry_each_models_name_and_version(serve, repository):
    client = serve(repository, model_control="explicit", default_model="boots")
    for name in ("boots", "shirts", "shirts"):
        assert client.post(f"/models/{name}/classify", files=image()).status_code == 200
    text = client.get("/metrics").text
    assert 'smso_images_total{model="boots",route="/classify",version="1"} 1.0' in text
    assert 'smso_images_total{model="shirts",route="/classify",version="2"} 2.0' in text
    assert 'smso_inference_seconds_count{model="shirts",version="2"}' in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    stages = {
        sample.labels["stage"]
        for sample in families["smso_inference_stage_seconds"].samples
        if sample.name.endswith("_count") and sample.labels["model"] == "shirts"
    }
    # the CPU's runner (no padding, no device copies), then the typicality score (the shipped
    # file's reference)
    assert stages == {"stack", "run", "score"}
    assert client.post("/v2/repository/models/shirts/unload").status_code == 200
    text = client.get("/metrics").text
    assert 'model="shirts"' not in text  # a retired model's series go, every one of them
    assert 'smso_images_total{model="boots",route="/classify",version="1"} 1.0' in text


def series(client: TestClient) -> int:
    return sum(1 for line in client.get("/metrics").text.splitlines() if line[:1] not in "#")


def test_metrics_are_bounded_by_the_versions_served_not_by_history(serve, tmp_path, shipped_model):
    """Each version served replaces the last: the page has as many series after the fifth as
    after the second (a repository that publishes nightly does not grow /metrics)."""
    root = tmp_path / "models"
    put(root, "m", 1, shipped_model)
    client = serve(root)
    counts = []
    for version in range(1, 6):
        if version > 1:
            put(root, "m", version, shipped_model)
            until(lambda: index(client)["m"] == (str(version), "READY"))  # noqa: B023
            shutil.rmtree(root / "m" / str(version - 1))
            # the one it replaced retires once no request holds it
            gone = f'version="{version - 1}"'
            until(lambda: gone not in client.get("/metrics").text)  # noqa: B023
        for route in ("classify", "embed"):
            assert client.post(f"/models/m/{route}", files=image()).status_code == 200
        counts.append(series(client))
    # (the first count has not yet the index route's own series)
    assert len(set(counts[1:])) == 1, counts
    assert 'version="5"' in client.get("/metrics").text


def test_an_empty_repository_is_not_ready_until_a_model_serves_the_default_route(
    serve, tmp_path, shipped_model, caplog
):
    """Readiness is "this replica answers /classify": an empty repository (or one whose only
    model went) says "missing" once scanned, without Retry-After (a probe must not wait for
    ever on "loading"); models come and go."""
    root = tmp_path / "empty"
    root.mkdir()
    client = serve(root, wait=False)
    answer = client.get("/readyz")
    assert (answer.status_code, answer.json()) == (503, {"status": "missing"})
    assert "retry-after" not in answer.headers
    assert f"repository: {root} holds no models yet" in caplog.text
    assert "they are loaded as they appear" in caplog.text
    assert client.post("/classify", files=image()).status_code == 404
    put(root, "boots", 1, shipped_model)
    until(lambda: index(client).get("boots") == ("1", "READY"))
    assert client.get("/readyz").json() == {"status": "ready"}
    shutil.rmtree(root / "boots")
    until(lambda: "boots" not in index(client))
    assert client.get("/readyz").json() == {"status": "missing"}
