"""SecondOrderNet: composition, the features/head split, init, and checkpoints that rebuild it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.training.test_heads import SMALL
from training.backbones import UnknownBackboneError
from training.checkpoint import CheckpointError, load_checkpoint, load_model, save_checkpoint
from training.heads import HEADS, UnknownHeadError
from training.heads.smso import SMSOPooling
from training.model import ModelConfig, SecondOrderNet, build_model


def small_config(head: str = "smso", **overrides) -> ModelConfig:
    _, options = SMALL[head]
    fields = {"reduce_dim": 8, "head_options": options, **overrides}
    return ModelConfig(num_classes=3, backbone="small_cnn", head=head, **fields)


@pytest.mark.parametrize("head", sorted(HEADS))
def test_every_head_builds_a_model(head: str) -> None:
    model = build_model(small_config(head)).eval()
    images = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        logits, embedding = model(images)
        features = model.forward_features(images)
        split = model.forward_head(features)
    assert features.shape == (2, 8, 7, 7)
    assert logits.shape == (2, 3)
    assert embedding.shape == (2, model.embedding_dim)
    assert torch.equal(split.logits, logits)
    assert torch.equal(split.embedding, embedding)


def test_lrbp_has_no_classifier_of_its_own() -> None:
    model = build_model(small_config("lrbp")).eval()
    assert isinstance(model.classifier, nn.Identity)
    logits, embedding = model(torch.randn(2, 1, 28, 28))
    assert torch.equal(logits, embedding)


def test_structure_is_backbone_conv_bn_head_classifier() -> None:
    model = build_model(small_config("smso", head_options={"dim": 5}))
    assert isinstance(model.reduce, nn.Sequential)
    conv, bn = model.reduce
    assert isinstance(conv, nn.Conv2d)
    assert conv.kernel_size == (1, 1)
    assert conv.bias is None
    assert isinstance(bn, nn.BatchNorm2d)
    assert bn.num_features == 8
    assert isinstance(model.classifier, nn.Linear)
    assert model.classifier.in_features == 5
    assert model.classifier.out_features == 3


def test_smso_state_dict_keys_are_those_of_earlier_checkpoints() -> None:
    """The SMSO head moved into training.heads; checkpoints written before must still load."""
    model = build_model(small_config("smso"))
    head_keys = [k for k in model.state_dict() if k.startswith("head.")]
    assert head_keys == [
        "head.weight",
        "head.log_gamma",
        "head.beta",
        "head.running_cov",
        "head.num_batches_tracked",
    ]


def test_new_layers_are_glorot_normal() -> None:
    model = build_model(ModelConfig(num_classes=200, backbone="resnet18", head="smso"))
    assert isinstance(model.reduce, nn.Sequential)
    conv = model.reduce[0]
    assert isinstance(conv, nn.Conv2d)
    conv_w = conv.weight  # (256, 512, 1, 1)
    assert conv_w.std().item() == pytest.approx((2 / (512 + 256)) ** 0.5, rel=0.02)
    assert isinstance(model.head, SMSOPooling)
    pv = model.head.weight  # (2048, 256)
    assert pv.std().item() == pytest.approx((2 / (2048 + 256)) ** 0.5, rel=0.02)
    assert isinstance(model.classifier, nn.Linear)
    fc = model.classifier.weight  # (200, 2048)
    assert fc.std().item() == pytest.approx((2 / (2048 + 200)) ** 0.5, rel=0.02)
    assert torch.count_nonzero(model.classifier.bias) == 0


def test_no_reduction_feeds_the_backbone_channels() -> None:
    model = build_model(small_config("gap", reduce_dim=None))
    assert isinstance(model.reduce, nn.Identity)
    assert model.embedding_dim == 128


def test_paper_settings() -> None:
    assert ModelConfig.for_paper("vgg16", "bp", 47).reduce_dim == 512
    assert ModelConfig.for_paper("vgg16", "deepo2p", 47).reduce_dim == 512
    assert ModelConfig.for_paper("resnet50", "mpn", 47).reduce_dim == 256
    assert ModelConfig.for_paper("resnet50", "smso", 47, head_options={"dim": 64}).reduce_dim == 256
    assert ModelConfig.for_paper("resnet50", "gap", 47).reduce_dim is None


def test_channels_last_and_autocast() -> None:
    model = build_model(small_config()).eval()
    images = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        ref = model(images)
        model = model.to(memory_format=torch.channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(images.to(memory_format=torch.channels_last))
    assert out.logits.dtype == torch.float32
    assert out.embedding.dtype == torch.float32
    assert torch.allclose(out.embedding, ref.embedding, atol=0.1)


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"backbone": "vgg19"}, UnknownBackboneError, "valid backbones"),
        ({"head": "fisher"}, UnknownHeadError, "valid heads"),
        ({"num_classes": 0}, ValueError, "num_classes must be >= 1"),
        ({"reduce_dim": 0}, ValueError, "reduce_dim must be >= 1"),
    ],
)
def test_bad_configs_are_named(overrides: dict, error: type, message: str) -> None:
    fields = {"num_classes": 3, "backbone": "small_cnn", **overrides}
    with pytest.raises(error, match=message):
        ModelConfig(**fields)


def test_config_is_frozen_and_round_trips_as_plain_data() -> None:
    config = small_config(head_options={"dim": 7, "transform": "log"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.head = "bp"  # type: ignore[misc]
    assert ModelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(TypeError, match="unknown model config keys: colour"):
        ModelConfig.from_dict({**config.to_dict(), "colour": "red"})


# --- checkpoints -------------------------------------------------------------------------------


@pytest.fixture
def trained(tmp_path: Path) -> tuple[SecondOrderNet, Path]:
    """A model with non-initial weights and running statistics, saved to a checkpoint."""
    model = build_model(small_config(head_options={"dim": 6, "form": "conv"}))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        logits, _ = model(torch.randn(4, 1, 28, 28))
        logits.sum().backward()
        optimizer.step()
    path = save_checkpoint(tmp_path / "run" / "model.pt", model, epoch=3)
    return model.eval(), path


def test_a_checkpoint_alone_rebuilds_its_model(trained) -> None:
    model, path = trained
    rebuilt, payload = load_model(path)
    assert rebuilt.config == model.config
    assert payload["epoch"] == 3
    assert not rebuilt.training
    images = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        for a, b in zip(model(images), rebuilt(images), strict=True):
            assert torch.equal(a, b)


def test_checkpoint_does_not_reload_pretrained_weights(tmp_path: Path) -> None:
    weights = tmp_path / "backbone.pt"
    torch.save(build_model(small_config()).backbone.body.state_dict(), weights)
    model = build_model(small_config(pretrained=str(weights)))
    path = save_checkpoint(tmp_path / "model.pt", model)
    weights.unlink()  # the checkpoint must not need it any more
    rebuilt, _ = load_model(path)
    assert rebuilt.config.pretrained == str(weights)


def test_save_leaves_no_temporary_files(trained) -> None:
    _, path = trained
    assert [p.name for p in path.parent.iterdir()] == ["model.pt"]


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda p: p.unlink(), "does not exist"),
        (lambda p: p.write_bytes(b"\x00garbage"), r"not a PyTorch checkpoint file: it starts"),
        (lambda p: p.write_bytes(b""), "not a PyTorch checkpoint file: it is empty"),
        (lambda p: p.write_bytes(b"\x80\x04garbage"), "not a readable checkpoint"),
        (lambda p: p.write_bytes(p.read_bytes()[:1000]), "not a readable checkpoint .* zip"),
        (lambda p: torch.save({"weights": 1}, p), "not an SMSO checkpoint"),
        (lambda p: _edit(p, version=99), "checkpoint version 99"),
        (lambda p: _edit(p, model_state=None), "lacks its 'model_state' entry"),
    ],
)
def test_corrupt_checkpoints_are_named(trained, corrupt, message: str) -> None:
    _, path = trained
    corrupt(path)
    with pytest.raises(CheckpointError, match=message):
        load_model(path)


def test_mismatched_checkpoint_is_named(trained) -> None:
    _, path = trained
    payload = load_checkpoint(path)
    payload["model_config"]["head_options"] = {"dim": 9}
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="weights do not match the model its config"):
        load_model(path)


def test_invalid_config_in_checkpoint_is_named(trained) -> None:
    _, path = trained
    _edit_config(path, head="nope")
    with pytest.raises(CheckpointError, match="invalid model config: unknown head 'nope'"):
        load_model(path)


def _edit(path: Path, **changes) -> None:
    payload = load_checkpoint(path)
    payload.update(changes)
    torch.save(payload, path)


def _edit_config(path: Path, **changes) -> None:
    payload = load_checkpoint(path)
    payload["model_config"].update(changes)
    torch.save(payload, path)
