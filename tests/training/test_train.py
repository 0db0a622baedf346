"""smso-train and smso-eval end to end on a tiny model and a tiny Fashion-MNIST."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from training.checkpoint import (
    CheckpointError,
    load_backbone,
    load_checkpoint,
    load_model,
    save_checkpoint,
)
from training.config import ConfigError, TrainConfig, parse_train_config
from training.evaluate import load_with_splits
from training.evaluate import main as eval_main
from training.head_statistics import accumulate_input_statistics
from training.heads.lrbp import LowRankBilinear
from training.heads.smso import SMSOPooling
from training.model import ModelConfig, build_model
from training.train import fit
from training.train import main as train_main

ROOT = Path(__file__).resolve().parents[2]


def tiny_config(data_root: Path, out: Path, **overrides: Any) -> TrainConfig:
    fields: dict[str, Any] = {
        "dataset": "fashion_mnist",
        "data_root": str(data_root),
        "val_size": 40,
        "backbone": "small_cnn",
        "head": "smso",
        "head_options": {"dim": 4},
        "reduce_dim": 8,
        "epochs": 2,
        "batch_size": 32,
        "lr": 0.05,
        "workers": 0,
        "out": str(out),
        "schedule": "cosine",
        "channels_last": False,
    }
    fields.update(overrides)
    return TrainConfig(**fields)


def test_a_run_writes_its_config_metrics_checkpoints_and_test_report(tiny_fashion_mnist, tmp_path):
    out = tmp_path / "run"
    result = fit(tiny_config(tiny_fashion_mnist, out))
    assert result.epochs_run == 2
    saved = json.loads((out / "config.json").read_text())
    assert saved["lr"] == 0.05
    assert saved["loss"] == "cross_entropy"  # resolved from the head
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["epoch"] for line in lines] == [1, 2]
    keys = {"train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr", "images_per_second"}
    assert keys <= set(lines[0])
    model, payload = load_model(out / "best.pt")
    assert payload["classes"][0] == "T-shirt/top"
    assert model.config.head_options == {"dim": 4}
    report = json.loads((out / "test.json").read_text())
    assert report["test_images"] == 60
    assert sum(map(sum, report["confusion"])) == 60
    assert result.test is not None
    assert report["test_accuracy"] == pytest.approx(result.test.accuracy)


def test_resumed_run_ends_with_the_same_weights(tiny_fashion_mnist, tmp_path):
    fit(tiny_config(tiny_fashion_mnist, tmp_path / "straight", epochs=3))
    stopped = tiny_config(tiny_fashion_mnist, tmp_path / "resumed", epochs=3, stop_after=1)
    assert fit(stopped).epochs_run == 1
    assert fit(dataclasses.replace(stopped, stop_after=None, resume=True)).epochs_run == 2
    a = load_checkpoint(tmp_path / "straight" / "last.pt")
    b = load_checkpoint(tmp_path / "resumed" / "last.pt")
    assert a["model_state"].keys() == b["model_state"].keys()
    for key, value in a["model_state"].items():
        assert torch.equal(value, b["model_state"][key]), key
    metrics = (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in metrics] == [1, 2, 3]


def test_an_existing_run_is_not_overwritten(tiny_fashion_mnist, tmp_path):
    cfg = tiny_config(tiny_fashion_mnist, tmp_path / "run", epochs=1)
    fit(cfg)
    with pytest.raises(ConfigError, match="already holds a run; pass --resume"):
        fit(cfg)


def test_resume_with_another_model_is_refused(tiny_fashion_mnist, tmp_path):
    fit(tiny_config(tiny_fashion_mnist, tmp_path / "run", epochs=1))
    other = tiny_config(tiny_fashion_mnist, tmp_path / "run", head_options={"dim": 5}, resume=True)
    with pytest.raises(CheckpointError, match="was written for another model"):
        fit(other)


def test_resume_from_a_corrupt_checkpoint_is_refused(tiny_fashion_mnist, tmp_path):
    fit(tiny_config(tiny_fashion_mnist, tmp_path / "run", epochs=1))
    (tmp_path / "run" / "last.pt").write_bytes(b"truncated")
    cfg = tiny_config(tiny_fashion_mnist, tmp_path / "run", resume=True)
    with pytest.raises(CheckpointError, match="not a PyTorch checkpoint file"):
        fit(cfg)


def test_resume_from_a_checkpoint_without_training_state_says_what_it_lacks(
    tiny_fashion_mnist, tmp_path
):
    fit(tiny_config(tiny_fashion_mnist, tmp_path / "run", epochs=1))
    run = tmp_path / "run"
    payload = torch.load(run / "last.pt", weights_only=True)
    for key in ("optimizer", "scheduler"):
        del payload[key]
    torch.save(payload, run / "last.pt")
    cfg = tiny_config(tiny_fashion_mnist, run, resume=True)
    with pytest.raises(CheckpointError, match="cannot be resumed: it has no optimizer, scheduler"):
        fit(cfg)


def test_config_file_then_flags(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('epochs = 4\nhead = "mpn"\nhead_options = { iterations = 3 }\nlr = 0.1\n')
    cfg = parse_train_config(["--config", str(path), "--lr", "0.2", "--no-channels-last"])
    assert (cfg.epochs, cfg.head, cfg.head_options, cfg.lr) == (4, "mpn", {"iterations": 3}, 0.2)
    assert cfg.channels_last is False
    assert cfg.resolve().lr == 0.2
    assert TrainConfig(backbone="vgg16").resolve().lr == 0.001  # the paper's recipe
    assert TrainConfig(backbone="resnet50").resolve().lr == 0.01
    assert TrainConfig(head="lrbp").resolve().loss == "hinge"  # the head's own


def test_a_flag_set_to_none_overrides_the_config_file(tmp_path):
    """``--reduce-dim none`` on a config with ``reduce_dim = 64`` trains without the conv."""
    path = tmp_path / "run.toml"
    path.write_text('head = "gap"\nreduce_dim = 64\nepochs = 4\n')
    assert parse_train_config(["--config", str(path), "--reduce-dim", "none"]).reduce_dim is None
    assert parse_train_config(["--config", str(path)]).reduce_dim == 64
    assert parse_train_config(["--config", str(path), "--epochs", "2"]).epochs == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("epochs = 'ten'\n", "setting epochs must be int"),
        ("colour = 'red'\n", "unknown setting.s.: colour; valid settings: amp, backbone"),
        ("epochs = 0\n", "epochs must be >= 1"),
        ("schedule = 'step'\n", "schedule must be one of plateau, cosine"),
        ("ema = 1.0\n", r"ema must be in \[0, 1\) or null"),
        ("epochs = [\n", "cannot parse config file"),
        ("image_size = 0\n", "image_size must be at least the small_cnn backbone's stride .4 px"),
        ("stop_after = 0\n", "stop_after must be >= 1"),
    ],
)
def test_bad_settings_are_named(tmp_path, content: str, message: str):
    path = tmp_path / "run.toml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        parse_train_config(["--config", str(path)])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data-root", "/nonexistent/fmnist"], "expected Fashion-MNIST file train-images"),
        (["--head", "fisher"], "unknown head 'fisher'; valid heads"),
        (["--config", "/nonexistent.toml"], "config file /nonexistent.toml does not exist"),
        (["--head-options", '{"dimm": 64}'], "head 'smso' has no option 'dimm'; its options: dim,"),
        (["--head-options", '{"dim": "64"}'], "head 'smso': option dim must be a whole number"),
        (["--partition", "3"], "fashion_mnist has a single partition: partition must be 1, got 3"),
        (["--device", "bogus"], "device must be auto (cuda when available, else cpu), cpu, cuda"),
        (["--device", "meta"], "or cuda:N, got 'meta'"),
    ],
)
def test_cli_reports_user_errors_in_one_line(tmp_path, capsys, args, message):
    assert train_main([*args, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("smso-train: error:")
    assert message in err
    assert "\n" not in err


@pytest.mark.parametrize(
    ("value", "message"),
    [("{bad", "not JSON (Expecting property name"), ("[1]", "must be a JSON object")],
)
def test_head_options_that_are_not_a_json_object_are_refused_by_the_parser(
    capsys, value: str, message: str
):
    with pytest.raises(SystemExit) as exit_:
        train_main(["--head-options", value])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_an_output_that_is_a_file_is_one_error_line(tiny_fashion_mnist, tmp_path, capsys):
    out = tmp_path / "run"
    out.write_text("not a folder")
    args = ["--data-root", str(tiny_fashion_mnist), "--val-size", "40", "--out", str(out)]
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("smso-train: error:")
    assert str(out) in err
    assert out.read_text() == "not a folder"


def test_smso_eval_reports_accuracy_and_confusion(tiny_fashion_mnist, tmp_path, capsys):
    out = tmp_path / "run"
    fit(tiny_config(tiny_fashion_mnist, out, epochs=1))
    report = tmp_path / "eval.json"
    assert eval_main([str(out / "best.pt"), "--split", "test", "--json", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "top-1 accuracy on test" in printed
    assert "Ankle boot" in printed
    data = json.loads(report.read_text())
    assert data["images"] == 60
    assert data["accuracy"] == pytest.approx(
        json.loads((out / "test.json").read_text())["test_accuracy"]
    )
    assert eval_main([str(tmp_path / "missing.pt")]) == 2


def test_two_cpu_processes_with_gloo_end_with_identical_weights(tiny_fashion_mnist, tmp_path):
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(ROOT / "tests" / "training" / "ddp_worker.py"),
        str(tiny_fashion_mnist),
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys()
    for key, value in ranks[0].items():
        assert torch.equal(value, ranks[1][key]), key
    initial = torch.load(out / "initial.pt", weights_only=True)
    assert any(not torch.equal(initial[k], ranks[0][k]) for k in initial)  # it did train
    metrics = (out / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 2
    # Sigma recalibrated over both ranks' shares of the 160 training images, not rank 0's
    assert load_checkpoint(out / "best.pt")["recalibration"]["images"] == 160
    model, _, splits = load_with_splits(out / "best.pt")
    head = model.head
    assert isinstance(head, SMSOPooling)
    sigma = head.running_cov.clone()
    assert torch.equal(ranks[0]["head.running_cov"], sigma)

    def estimate(indices: range) -> torch.Tensor:
        images = torch.stack([splits.train_eval[i][0] for i in indices])
        with torch.no_grad():
            accumulate_input_statistics(head, [model.forward_features(images)])
        return head.running_cov.clone()

    torch.testing.assert_close(estimate(range(160)), sigma, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(estimate(range(0, 160, 2)), sigma, rtol=1e-3, atol=1e-4)


def test_missing_pretrained_weights_are_a_user_error(tiny_fashion_mnist, tmp_path, capsys):
    args = ["--data-root", str(tiny_fashion_mnist), "--val-size", "40", "--backbone", "resnet18"]
    args += ["--pretrained", "/nonexistent/resnet18.pth", "--out", str(tmp_path / "run")]
    assert train_main(args) == 2
    assert "pretrained weights file /nonexistent/resnet18.pth does not exist" in (
        capsys.readouterr().err
    )


def test_lrbp_starts_from_the_gram_matrix_of_the_training_features(tiny_fashion_mnist, tmp_path):
    """Kong & Fowlkes' initialisation: P spans the top eigenvectors of the features' Gram matrix
    over the training images, computed before the first epoch (lr ~ 0 keeps it there)."""
    options = {"projection_dim": 3, "rank": 2}
    cfg = tiny_config(
        tiny_fashion_mnist,
        tmp_path / "run",
        epochs=1,
        lr=1e-12,
        head="lrbp",
        head_options=options,
        eval_test=False,
    )
    head = fit(cfg).model.head
    assert isinstance(head, LowRankBilinear)
    projection = head.projection.detach().double()  # (m, c)
    torch.manual_seed(cfg.seed)  # the model fit built, before its first epoch
    fresh = build_model(cfg.model_config(10, 1)).eval()
    _, _, splits = load_with_splits(tmp_path / "run" / "best.pt")
    train = splits.train_eval
    images = torch.stack([train[i][0] for i in range(len(train))])
    with torch.no_grad():
        x = fresh.forward_features(images).double().flatten(2)  # (N, c, n)
    gram = torch.einsum("bcn,bdn->cd", x, x)
    top = torch.linalg.eigh(gram).eigenvectors[:, -3:]  # (c, m)
    torch.testing.assert_close(projection @ projection.T, torch.eye(3, dtype=torch.float64))
    torch.testing.assert_close(projection.T @ projection, top @ top.T, atol=1e-4, rtol=0)


def test_init_from_starts_the_backbone_from_another_run(tmp_path):
    source = build_model(ModelConfig(10, backbone="small_cnn", head="bp", reduce_dim=8))
    path = save_checkpoint(tmp_path / "bp.pt", source)
    lrbp = ModelConfig(10, "small_cnn", "lrbp", {"projection_dim": 4}, reduce_dim=None)
    target = build_model(lrbp)
    head_before = copy.deepcopy(target.head.state_dict())
    load_backbone(target, path)
    for key, value in source.backbone.state_dict().items():
        assert torch.equal(target.backbone.state_dict()[key], value), key
    for key, value in head_before.items():
        assert torch.equal(target.head.state_dict()[key], value), key
    other = build_model(ModelConfig(10, backbone="resnet18", head="gap", reduce_dim=None))
    with pytest.raises(CheckpointError, match="holds a 'small_cnn' backbone, this model has"):
        load_backbone(other, path)


def test_a_run_with_init_from_trains_from_those_weights(tiny_fashion_mnist, tmp_path):
    """The run's backbone starts from the other run's: with a learning rate of 1e-12 its
    weights end where they started, BP's trained ones, not the seed's fresh ones."""
    fit(tiny_config(tiny_fashion_mnist, tmp_path / "bp", epochs=1, head="bp", head_options={}))
    bp_best = str(tmp_path / "bp" / "best.pt")
    cfg = tiny_config(
        tiny_fashion_mnist,
        tmp_path / "lrbp",
        epochs=1,
        lr=1e-12,
        head="lrbp",
        head_options={"projection_dim": 4},
        init_from=bp_best,
    )
    result = fit(cfg)
    assert json.loads((tmp_path / "lrbp" / "config.json").read_text())["init_from"].endswith(
        "bp/best.pt"
    )
    assert result.test is not None
    source = load_checkpoint(bp_best)["model_state"]
    trained = load_checkpoint(tmp_path / "lrbp" / "best.pt")["model_state"]
    torch.manual_seed(cfg.seed)
    fresh = build_model(cfg.resolve().model_config(10, 1)).state_dict()
    # the parameters (BatchNorm's running statistics move in training mode whatever the lr)
    weights = [k for k in source if k.startswith("backbone.") and "running_" not in k]
    weights = [k for k in weights if source[k].is_floating_point()]
    assert weights
    for key in weights:
        torch.testing.assert_close(trained[key], source[key], rtol=0, atol=1e-6)
    assert any(not torch.allclose(fresh[key], source[key]) for key in weights)


def test_ema_averages_the_weights_after_every_step_by_its_formula(tiny_fashion_mnist, tmp_path):
    """``--ema d``: the first step copies the weights, each later one moves the average to
    ``d avg + (1 - d) w`` (parameters and buffers); the scheduler still steps."""
    from training.runtime import setup_runtime
    from training.train import _Run

    cfg = tiny_config(tiny_fashion_mnist, tmp_path / "run", ema=0.75)
    run = _Run(cfg, setup_runtime("cpu", "off"))
    stepped: list[int] = []
    step = run.after_step(lambda: stepped.append(1))
    assert step is not None
    for value in (1.0, 5.0, 9.0):
        with torch.no_grad():
            for tensor in [*run.model.parameters(), *run.model.buffers()]:
                if tensor.is_floating_point():
                    tensor.fill_(value)
        step()
    expected = 0.75 * (0.75 * 1.0 + 0.25 * 5.0) + 0.25 * 9.0  # 4.0
    for name, tensor in run.evaluated.state_dict().items():
        if tensor.is_floating_point():
            assert torch.allclose(tensor, torch.full_like(tensor, expected)), name
    assert len(stepped) == 3
    assert run.evaluated is not run.model


def test_an_ema_run_validates_saves_and_resumes_the_average(tiny_fashion_mnist, tmp_path):
    """best.pt holds the average (with decay 0: the weights themselves), last.pt both, and a
    resumed run ends where a straight one does."""
    zero = fit(
        tiny_config(
            tiny_fashion_mnist,
            tmp_path / "zero",
            epochs=1,
            ema=0.0,
            recalibrate=False,
            eval_test=False,
        )
    )
    assert zero.epochs_run == 1
    best = load_checkpoint(tmp_path / "zero" / "best.pt")["model_state"]
    last = load_checkpoint(tmp_path / "zero" / "last.pt")
    for key, value in last["model_state"].items():
        assert torch.equal(value, best[key]), key
    assert "ema_state" in last
    straight = tiny_config(
        tiny_fashion_mnist,
        tmp_path / "straight",
        epochs=2,
        ema=0.9,
        recalibrate=False,
        eval_test=False,
    )
    fit(straight)
    stopped = dataclasses.replace(straight, out=str(tmp_path / "resumed"), stop_after=1)
    fit(stopped)
    fit(dataclasses.replace(stopped, stop_after=None, resume=True))
    a = load_checkpoint(tmp_path / "straight" / "last.pt")
    b = load_checkpoint(tmp_path / "resumed" / "last.pt")
    for key, value in a["ema_state"].items():
        assert torch.equal(value, b["ema_state"][key]), key
    averaged = {k.removeprefix("module."): v for k, v in a["ema_state"].items()}
    trained = a["model_state"]
    assert any(not torch.equal(trained[k], averaged[k]) for k in trained)  # d = 0.9 lags
    # best.pt holds the average of its epoch (saved beside it), not the trained weights
    best = load_checkpoint(tmp_path / "straight" / "best.pt")
    averaged = {k.removeprefix("module."): v for k, v in best["ema_state"].items()}
    for key, value in best["model_state"].items():
        assert torch.equal(value, averaged[key]), key
