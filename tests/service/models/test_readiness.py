"""Readiness means "this replica answers its default route", and the log and the index say
what is actually served."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys

from service.app import create_app
from service.core.settings import Settings
from tests.service.conftest import FakeBackend
from tests.service.models.conftest import put
from tests.service.models.test_model_repository import image, index, until


def test_a_default_model_that_names_no_served_model_is_missing_not_loading(make_client, caplog):
    with caplog.at_level(logging.INFO, logger="service"):
        client = make_client(FakeBackend(), wait=False, default_model="onlyy")
        until(lambda: client.get("/readyz").json()["status"] != "loading")
    answer = client.get("/readyz")
    assert (answer.status_code, answer.json()) == (503, {"status": "missing"})
    assert client.post("/classify", files=image()).status_code == 404
    (ready,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready: ")]
    assert "not the default model ('onlyy')" in ready
    assert "/readyz answers 200 once that one serves" in ready


def test_smso_serve_refuses_a_default_model_that_names_another_model(shipped_model):
    done = subprocess.run(
        [
            *(sys.executable, "-m", "service.cli", "--model-path", shipped_model),
            *("--default-model", "onlyy", "--port", "0", "--grpc-port", "0"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--default-model 'onlyy' names no model served here" in done.stderr
    assert "'fashion_mnist-small_cnn-smso'" in done.stderr
    assert "Traceback" not in done.stderr


def test_unloading_the_only_model_makes_the_server_unready(serve, tmp_path, shipped_model):
    root = tmp_path / "R"
    put(root, "boots", 1, shipped_model)
    client = serve(root, model_control="explicit")
    assert client.get("/readyz").json() == {"status": "ready"}
    assert client.post("/v2/repository/models/boots/unload").status_code == 200
    assert client.get("/readyz").json() == {"status": "missing"}
    assert client.post("/classify", files=image()).status_code == 404


def test_the_index_names_the_version_served_when_a_new_one_fails(serve, tmp_path, shipped_model):
    root = tmp_path / "R"
    put(root, "boots", 1, shipped_model)
    client = serve(root, default_model="boots")
    broken = root / "boots" / "2"
    broken.mkdir()
    (broken / "model.onnx").write_bytes(b"not an onnx file")
    until(lambda: "version 2 failed to load" in _entry(client, "boots")["reason"])
    entry = _entry(client, "boots")
    assert (entry["version"], entry["state"]) == ("1", "READY")
    assert entry["reason"].endswith("version 1 serves")
    assert str(root) not in entry["reason"]  # the model is named, not the server's paths
    answer = client.post("/classify", files=image())
    assert answer.json()["model"] == {"name": "boots", "version": "1"}
    assert client.get("/readyz").json() == {"status": "ready"}


def test_deleting_the_served_version_serves_the_next_highest(serve, tmp_path, shipped_model):
    root = tmp_path / "R"
    put(root, "boots", 2, shipped_model)
    put(root, "boots", 3, shipped_model)
    client = serve(root, default_model="boots")
    assert index(client)["boots"] == ("3", "READY")
    shutil.rmtree(root / "boots" / "3")
    until(lambda: index(client)["boots"] == ("2", "READY"))
    assert client.post("/classify", files=image()).json()["model"]["version"] == "2"
    shutil.rmtree(root / "boots")
    until(lambda: "boots" not in index(client))
    assert client.post("/classify", files=image()).status_code == 404


def _entry(client, name: str) -> dict[str, str]:
    (entry,) = [e for e in client.post("/v2/repository/index").json() if e["name"] == name]
    return entry


def test_create_app_alone_settles_after_its_model_loads(shipped_model):
    """Without smso-serve's start-up check, the app itself still never says "loading" for ever."""
    from fastapi.testclient import TestClient

    settings = Settings(model_path=shipped_model, default_model="elsewhere", max_batch_size=2)
    with TestClient(create_app(settings)) as client:
        until(lambda: client.get("/readyz").json()["status"] == "missing")


def test_a_server_of_several_models_is_not_ready_until_each_has_been_tried():
    """The repository marks every model it is about to load first: one served while the next
    loads is not yet "ready" (a probe would send traffic the other model then 404s)."""
    from service.models.registry import ModelStatus, Registry

    registry = Registry()
    registry.mark("a", "1", ModelStatus.LOADING)
    registry.mark("b", "1", ModelStatus.LOADING)
    assert registry.readiness() == "loading"
    registry.mark("a", "1", ModelStatus.UNAVAILABLE, "broken")
    assert registry.readiness() == "loading"  # b may still serve: not "missing"
    registry.settled = True
    registry.mark("b", "1", ModelStatus.UNAVAILABLE, "broken")
    assert registry.readiness() == "missing"


def test_a_model_appearing_after_the_first_scan_loads_while_the_replica_stays_ready():
    """The long soak found it: each model copied into the repository made /readyz 503
    "loading" while it loaded, on every replica reading the folder at once, although the
    default route kept answering."""
    from service.models.registry import ModelStatus, Registry

    registry = Registry(default="a")
    registry.mark("a", "1", ModelStatus.LOADING)
    assert registry.readiness() == "loading"
    registry.serve(_loaded("a", "1"))
    registry.settled = True
    assert registry.readiness() == "ready"
    registry.mark("new", "1", ModelStatus.LOADING)  # appears in a later scan
    assert registry.readiness() == "ready"
    registry.mark("a", "2", ModelStatus.LOADING)  # a new version of the default, v1 serves
    assert registry.readiness() == "ready"
    registry.withdraw("a")  # the default itself gone: not ready
    assert registry.readiness() == "missing"


def _loaded(name: str, version: str):
    from types import SimpleNamespace

    return SimpleNamespace(name=name, version=version, source=None)


def test_a_file_replaced_by_a_broken_one_under_its_number_is_logged_as_still_serving(
    serve, tmp_path, shipped_model, caplog
):
    root = tmp_path / "R"
    put(root, "boots", 1, shipped_model)
    client = serve(root, default_model="boots")
    replaced = root / "boots" / "1" / "model.onnx.tmp"
    replaced.write_bytes(b"not an onnx file")
    replaced.rename(root / "boots" / "1" / "model.onnx")
    until(lambda: "version 1 failed to load" in _entry(client, "boots")["reason"])
    (line,) = [r.getMessage() for r in caplog.records if "could not be loaded" in r.getMessage()]
    assert line.startswith(
        "model boots version 1 could not be loaded or warmed up, and version 1 as loaded "
        "before goes on serving: "
    )
    assert "unavailable (503)" not in line
    assert client.post("/classify", files=image()).status_code == 200
