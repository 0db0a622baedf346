"""A model whose card contradicts its graph, or cannot be parsed, is refused when it is loaded,
with one line naming the field: unavailable in a repository (the others serve), one line and
exit status 2 from smso-serve; never a 500 at request time."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.card import CARD_KEY, MAX_DEPTH, CardError, parse_card
from service.core.settings import Settings
from service.runtime.backend import read_card
from tests.service.conftest import FakeBackend
from tests.service.models.conftest import put
from tests.service.models.graphs import card, model_file
from tests.service.models.test_model_repository import image
from tests.service.test_server import ROOT


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def deep_card(depth: int) -> str:
    """The fake card with an extra field of lists nested ``depth`` deep."""
    return json.dumps(card())[:-1] + ', "notes": ' + "[" * depth + "]" * depth + "}"


#: name -> (the file, what its refusal says)
HOSTILE: dict[str, tuple[dict[str, Any], str]] = {
    "three-classes-of-ten": (
        {"model_card": card(classes=["a", "b", "c"]), "logits": 10},
        "classes says 3, the graph's 'logits' output has 10 per image",
    ),
    "std-zero": (
        {"model_card": card(preprocessing={"std": [0]})},
        "preprocessing.std.0: Input should be greater than 0",
    ),
    "embedding-3-of-64": (
        {"model_card": card(model={"embedding_dim": 3}), "embedding": 64},
        "model.embedding_dim says 3, the graph's 'embedding' output has 64 per image",
    ),
    "nested-900": (
        {"model_card": card(checkpoint=nested(900))},
        f"the model card is malformed: it nests lists and objects more than {MAX_DEPTH} levels",
    ),
    "nested-200000": (
        {"model_card": deep_card(200_000)},
        f"the model card is malformed: it nests lists and objects more than {MAX_DEPTH} levels",
    ),
}


def test_each_hostile_card_is_unavailable_naming_its_field_and_the_others_serve(
    tmp_path, shipped_model
):
    root = tmp_path / "models"
    put(root, "good", 1, shipped_model)
    for name, (file, _) in HOSTILE.items():
        model_file(root / name / "1" / "model.onnx", **file)
    settings = Settings(model_repository=root, default_model="good", max_batch_size=1)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        deadline_ok = _wait_settled(client)
        assert deadline_ok
        entries = {e["name"]: e for e in client.post("/v2/repository/index").json()}
        assert entries["good"]["state"] == "READY"
        for name, (_, says) in HOSTILE.items():
            assert entries[name]["state"] == "UNAVAILABLE", name
            assert says in entries[name]["reason"], (name, entries[name]["reason"])
            assert "\n" not in entries[name]["reason"]
            for route in ("classify", "embed"):
                answer = client.post(f"/models/{name}/{route}", files=image())
                assert answer.status_code == 503, (name, route, answer.text)
            assert client.get(f"/models/{name}/metadata").status_code == 503
        assert client.get("/readyz").json() == {"status": "ready"}
        assert client.post("/classify", files=image()).status_code == 200


class ThreeClassesOfTen(FakeBackend):
    """A backend whose card names 3 classes and whose graph answers 10 logits, in shapes it
    does not declare (as a graph with symbolic dimensions): found out by the warm-up."""

    def __init__(self) -> None:
        super().__init__()
        self.card, self.card_dict = parse_card(
            {CARD_KEY: json.dumps(card(classes=["a", "b", "c"]))}
        )


def test_outputs_that_contradict_the_card_are_found_by_the_warm_up(make_client):
    client = make_client(ThreeClassesOfTen(), wait=False)
    assert _wait_settled(client)
    assert client.get("/readyz").json() == {"status": "failed"}
    answer = client.post("/classify", files=image())
    assert answer.status_code == 503
    assert answer.json()["error"]["message"].endswith(
        "the model card contradicts its graph: classes says 3, the graph's 'logits' output "
        "for 1 images has the shape (1, 10)"
    )


def _wait_settled(client: TestClient, seconds: float = 60) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while client.get("/readyz").json()["status"] == "loading":
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_card_nested_200000_deep_is_a_card_error_naming_the_file(tmp_path):
    """What smso-embed reads too (``read_card``): a ValueError it reports on one line."""
    path = model_file(tmp_path / "deep.onnx", deep_card(200_000))
    with pytest.raises(CardError, match=rf"^{path}: the model card is malformed: it nests"):
        read_card(path)


@pytest.mark.parametrize("name", ["nested-200000", "three-classes-of-ten", "std-zero"])
def test_smso_serve_refuses_a_hostile_card_on_one_line_with_status_2(tmp_path, name):
    path = model_file(tmp_path / "model.onnx", **HOSTILE[name][0])
    done = subprocess.run(
        [
            *(sys.executable, "-m", "service.cli", "--model-path", str(path)),
            *("--port", "0", "--grpc-port", "0", "--workers", "1"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("smso-serve:")]
    assert line.startswith(f"smso-serve: error: {path}: the model card ")
    assert HOSTILE[name][1] in line
