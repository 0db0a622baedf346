"""Your own images end to end: train on a generated folder with the example config, evaluate,
export with --name and --version, classify one of its images through the server."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from fastapi.testclient import TestClient

from export.card import card_from_proto
from export.cli import main as export_main
from service.app import create_app
from service.core.settings import Settings
from tests.service.conftest import wait_ready
from tests.training.conftest import FOLDER_CLASSES, write_image_folder
from training.evaluate import main as eval_main
from training.train import main as train_main

ROOT = Path(__file__).resolve().parents[2]
NAME, VERSION = "my-images.v1", "3"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The generated folder and the model exported from a 3-epoch run of the example config."""
    root = tmp_path_factory.mktemp("own-images")
    data, run = write_image_folder(root / "images", 75, 15), root / "run"
    example = str(ROOT / "configs" / "image-folder-example.toml")
    args = ["--config", example, "--data-root", str(data), "--epochs", "3", "--out", str(run)]
    assert train_main(args) == 0
    assert eval_main([str(run / "best.pt"), "--split", "test"]) == 0
    args = [str(run / "best.pt"), "--name", NAME, "--version", VERSION]
    assert export_main(args) == 0
    return data, run / "model.onnx"


def test_the_card_holds_the_served_name_and_version(exported):
    _, model = exported
    card = card_from_proto(onnx.load(str(model)))
    assert card["served"] == {"name": NAME, "version": VERSION}
    assert card["classes"] == sorted(FOLDER_CLASSES)


def test_the_server_classifies_an_image_of_the_folder(exported):
    data, model = exported
    image = data / "test" / "red_horizontal" / "000.png"
    with TestClient(create_app(Settings(model_path=str(model)))) as client:
        wait_ready(client)
        body = client.post(
            "/classify", files=[("file", ("a.png", image.read_bytes(), "image/png"))]
        )
    assert body.status_code == 200, body.text
    assert body.json()["results"][0]["predictions"][0]["label"] == "red_horizontal"


def test_the_server_serves_the_model_under_its_exported_name(exported):
    _, model = exported
    with TestClient(create_app(Settings(model_path=str(model)))) as client:
        wait_ready(client)
        assert client.get(f"/v2/models/{NAME}").json()["name"] == NAME
        assert client.get(f"/v2/models/{NAME}/versions/{VERSION}/ready").status_code == 200
