"""Backbone registry: truncation points, output shapes, pretrained weights without a network."""

from __future__ import annotations

import urllib.error
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

from training.backbones import (
    BACKBONES,
    PretrainedWeightsError,
    UnknownBackboneError,
    create_backbone,
)

# name -> (out_channels, stride, image channels, test input size)
EXPECTED = {
    "vgg16": (512, 16, 3, 64),
    "resnet50": (2048, 32, 3, 64),
    "resnet18": (512, 32, 3, 64),
    "small_cnn": (128, 4, 1, 28),
}


def test_every_registered_backbone_is_covered() -> None:
    assert set(EXPECTED) == set(BACKBONES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_output_shape_and_attributes(name: str) -> None:
    channels, stride, in_channels, size = EXPECTED[name]
    backbone = create_backbone(name).eval()
    assert (backbone.out_channels, backbone.stride, backbone.in_channels) == (
        channels,
        stride,
        in_channels,
    )
    with torch.no_grad():
        out = backbone(torch.randn(2, in_channels, size, size))
    assert out.shape == (2, channels, size // stride, size // stride)


def test_vgg16_stops_after_conv5_3_relu() -> None:
    body = create_backbone("vgg16").body
    assert isinstance(body, nn.Sequential)
    convs = [m for m in body if isinstance(m, nn.Conv2d)]
    assert len(convs) == 13  # conv1_1 .. conv5_3
    assert isinstance(body[-1], nn.ReLU)
    assert body[-2] is convs[-1]
    assert sum(isinstance(m, nn.MaxPool2d) for m in body) == 4  # the fifth pool is dropped


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_resnet_has_no_pooling_or_fc(name: str) -> None:
    modules = list(create_backbone(name).modules())
    assert not any(isinstance(m, nn.AdaptiveAvgPool2d | nn.Linear) for m in modules)


def test_unknown_backbone_lists_the_valid_names() -> None:
    with pytest.raises(
        UnknownBackboneError, match="valid backbones: resnet18, resnet50, small_cnn"
    ):
        create_backbone("vgg19")


@pytest.fixture
def resnet18_weights(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A torchvision resnet18 state dict (random, seeded) saved as a local weights file."""
    state = torchvision.models.resnet18(weights=None).state_dict()
    path = tmp_path / "resnet18.pth"
    torch.save(state, path)
    return path, state


def test_local_weights_file_of_the_full_model(resnet18_weights) -> None:
    path, state = resnet18_weights
    backbone = create_backbone("resnet18", pretrained=path)
    loaded = backbone.body.state_dict()
    assert torch.equal(loaded["0.weight"], state["conv1.weight"])
    assert torch.equal(loaded["7.1.bn2.running_var"], state["layer4.1.bn2.running_var"])


def test_local_weights_file_of_the_backbone_alone(tmp_path: Path) -> None:
    source = create_backbone("small_cnn")
    path = tmp_path / "small.pt"
    torch.save({"state_dict": source.body.state_dict()}, path)
    loaded = create_backbone("small_cnn", pretrained=path)
    for key, value in source.body.state_dict().items():
        assert torch.equal(loaded.body.state_dict()[key], value)


def test_grey_input_sums_the_pretrained_rgb_filters(resnet18_weights) -> None:
    path, state = resnet18_weights
    backbone = create_backbone("resnet18", pretrained=path, in_channels=1)
    expected = state["conv1.weight"].sum(dim=1, keepdim=True)
    assert isinstance(backbone.body, nn.Sequential)
    stem = backbone.body[0]
    assert isinstance(stem, nn.Conv2d)
    assert torch.allclose(stem.weight, expected)
    assert backbone(torch.randn(1, 1, 64, 64)).shape == (1, 512, 2, 2)


def test_imagenet_weights_come_from_the_torch_hub_cache(monkeypatch, tmp_path, resnet18_weights):
    _, state = resnet18_weights
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    url = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.url
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(url).name
    cached.parent.mkdir(parents=True)
    torch.save(state, cached)
    backbone = create_backbone("resnet18", pretrained="imagenet")
    assert torch.equal(backbone.body.state_dict()["0.weight"], state["conv1.weight"])


def test_imagenet_weights_unavailable_is_a_clear_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", offline)
    with pytest.raises(PretrainedWeightsError, match="cannot get torchvision's ImageNet weights"):
        create_backbone("resnet50", pretrained="imagenet")


@pytest.mark.parametrize(
    ("make_file", "message"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.write_bytes(b"not a checkpoint"), "is not a PyTorch file: it starts with"),
        (lambda p: p.write_bytes(b"PK\x03\x04 cut short"), "cannot read pretrained weights"),
        (lambda p: torch.save([1, 2, 3], p), "holds a list, not a state dict"),
        (lambda p: torch.save({"conv1.weight": torch.zeros(1)}, p), "do not fit backbone"),
    ],
)
def test_bad_weights_files_are_named(tmp_path: Path, make_file, message: str) -> None:
    path = tmp_path / "weights.pth"
    make_file(path)
    with pytest.raises(PretrainedWeightsError, match=message):
        create_backbone("resnet18", pretrained=path)


def test_small_cnn_has_no_imagenet_weights() -> None:
    with pytest.raises(PretrainedWeightsError, match="has no ImageNet weights"):
        create_backbone("small_cnn", pretrained="imagenet")
