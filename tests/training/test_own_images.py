"""Training on one's own image folder: the defaults train on a few hundred small images, the
example config runs, and a piped run's output is plain lines a person can read."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.training.conftest import FOLDER_CLASSES
from training.config import TrainConfig, parse_train_config
from training.train import fit

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "image-folder-example.toml"


def test_the_defaults_train_a_small_image_folder_well_above_chance(tiny_image_folder, tmp_path):
    # everything else is a default: small CNN, SMSO, its lr, batch 32, the plateau schedule
    cfg = TrainConfig(
        dataset="image_folder",
        data_root=str(tiny_image_folder),
        image_size=32,
        epochs=5,
        workers=0,
        out=str(tmp_path / "run"),
    )
    result = fit(cfg)
    assert result.test is not None
    assert result.test.accuracy >= 0.8  # chance is 0.25; about 1.0 in 5 epochs
    metrics = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    losses = [m["train_loss"] for m in metrics]
    assert max(losses) < 3 * losses[0]  # 0.05 and the paper's widths went 4 -> 35


def test_the_saved_config_and_splits_say_what_was_held_out(tiny_image_folder, tmp_path):
    out = tmp_path / "run"
    fit(
        TrainConfig(
            dataset="image_folder",
            data_root=str(tiny_image_folder),
            image_size=32,
            epochs=1,
            workers=0,
            out=str(out),
            eval_test=False,
        )
    )
    config = json.loads((out / "config.json").read_text())
    assert config["val_size"] is None  # image_folder does not read it
    assert (config["lr"], config["reduce_dim"], config["head_options"]) == (0.01, 64, {"dim": 64})
    splits = json.loads((out / "splits.json").read_text())
    assert splits["classes"] == sorted(FOLDER_CLASSES)  # label order: sorted folder names
    assert (splits["train"], splits["val"], splits["test"]) == (268, 32, 60)  # 8 of 75 per class
    assert splits["validation"].startswith("10% of each class of ")


def test_the_example_config_loads_with_the_data_root_overridden(tiny_image_folder, tmp_path):
    cfg = parse_train_config(
        [
            "--config",
            str(EXAMPLE),
            "--data-root",
            str(tiny_image_folder),
            "--out",
            str(tmp_path / "run"),
        ]
    )
    assert (cfg.dataset, cfg.backbone, cfg.head, cfg.image_size) == (
        "image_folder",
        "small_cnn",
        "smso",
        32,
    )
    assert cfg.pretrained is None  # the local weights file is shown commented out


def test_a_piped_run_of_the_example_prints_plain_lines_and_trains(tiny_image_folder, tmp_path):
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "training.train",
        "--config",
        str(EXAMPLE),
        "--data-root",
        str(tiny_image_folder),
        "--epochs",
        "2",
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert "\r" not in output
    assert "\x1b" not in output
    assert f"4 classes ({', '.join(sorted(FOLDER_CLASSES))})" in output
    assert "268 train, 32 val (10% of each class of" in output
    assert "device: cpu, fp32; output: " + str(out) in output
    assert "parameters; lr 0.01, batch 32" in output
    epochs = [line for line in output.splitlines() if line.startswith("epoch ")]
    assert [line.split()[1] for line in epochs] == ["1/2", "2/2"]
    for word in ("train loss", "val loss", "acc", "lr 0.01", "images/s", "left"):
        assert word in epochs[0], word
    assert json.loads((out / "test.json").read_text())["test_accuracy"] > 0.5  # chance 0.25


def test_the_small_cnn_defaults_leave_the_shipped_recipe_and_the_first_order_head_alone():
    shipped = parse_train_config(["--config", str(ROOT / "configs" / "fashion-mnist-smso.toml")])
    resolved = shipped.resolve()
    assert resolved == dataclasses.replace(shipped, loss="cross_entropy")  # all set explicitly
    assert TrainConfig(head="gap").resolve().reduce_dim is None  # the backbone's 128 channels
    assert TrainConfig(head="bp").resolve().head_options == {}  # SMSO's p only for SMSO
    assert TrainConfig(head="smso").resolve().head_options == {"dim": 64}  # p = c on small_cnn
    assert TrainConfig(head="smso", head_options={"dim": 16}).resolve().head_options == {"dim": 16}
