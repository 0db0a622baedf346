"""The shipped model's files tell one story: ``test.json``, ``model.pt`` and the card inside
``model.onnx`` agree on what the checkpoint holds and how well it does."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from export.card import card_from_proto, file_sha256
from training.checkpoint import held_val_accuracy, load_checkpoint

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "fashion-mnist-smso"


def test_the_test_report_gives_the_validation_accuracy_of_what_the_checkpoint_holds() -> None:
    payload = load_checkpoint(SHIPPED / "model.pt")
    report = json.loads((SHIPPED / "test.json").read_text())
    assert report["epoch"] == payload["epoch"]
    assert report["recalibration"] == payload.get("recalibration")
    assert report["val_accuracy"] == held_val_accuracy(payload)


def test_the_onnx_card_names_the_shipped_checkpoint_and_its_measured_metrics() -> None:
    model = onnx.load(str(SHIPPED / "model.onnx"), load_external_data=False)
    card = card_from_proto(model)
    assert card["checkpoint"] == {"file": "model.pt", "sha256": file_sha256(SHIPPED / "model.pt")}
    report = json.loads((SHIPPED / "test.json").read_text())
    metrics = {k: report[k] for k in ("epoch", "test_accuracy", "test_images", "val_accuracy")}
    assert card["metrics"] == metrics
