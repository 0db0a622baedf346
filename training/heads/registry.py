"""The head registry: a name selects a pooling head (timm-style ``create_head``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from training.heads.bilinear import BilinearPooling
from training.heads.compact_bilinear import RandomMaclaurin, TensorSketch
from training.heads.deepo2p import DeepO2P
from training.heads.first_order import GlobalAvgPool
from training.heads.lrbp import LowRankBilinear
from training.heads.mpn import MPNCOV
from training.heads.vgg_fc import VGGClassifierHead
from training.smso import SMSOPooling

__all__ = ["HEADS", "HeadSpec", "UnknownHeadError", "create_head", "head_spec"]


class UnknownHeadError(ValueError):
    """A head name that is not registered."""


@dataclass(frozen=True)
class HeadSpec:
    """How to build one head and the paper's setting for it."""

    factory: Callable[..., nn.Module]  # called as factory(in_channels, **options)
    paper_channels: int | None  # c the paper feeds it (the 1x1 reduction); None: backbone's own
    summary: str  # one line for listings and --help


def _smso(in_channels: int, dim: int = 2048, **options: Any) -> SMSOPooling:
    return SMSOPooling(in_channels, dim, **options)


HEADS: dict[str, HeadSpec] = {
    "gap": HeadSpec(GlobalAvgPool, None, "first-order global average pooling, c-d"),
    "vgg_fc": HeadSpec(VGGClassifierHead, None, "first-order VGG-D: pool5, fc6, fc7, 4,096-d"),
    "bp": HeadSpec(BilinearPooling, 512, "bilinear pooling + signed sqrt + l2, c^2-d"),
    "deepo2p": HeadSpec(DeepO2P, 512, "matrix logarithm of the covariance, c^2-d"),
    "mpn": HeadSpec(MPNCOV, 256, "iSQRT-COV matrix square root, c(c+1)/2-d"),
    "cbp_ts": HeadSpec(TensorSketch, 512, "compact bilinear, Tensor Sketch, 8,192-d"),
    "cbp_rm": HeadSpec(RandomMaclaurin, 512, "compact bilinear, Random Maclaurin, 8,192-d"),
    "lrbp": HeadSpec(LowRankBilinear, 256, "low-rank bilinear classifier (needs num_classes)"),
    "smso": HeadSpec(_smso, 256, "SMSO pooling, p-d (option dim, default 2,048)"),
}


def head_spec(name: str) -> HeadSpec:
    """The registry entry for ``name``; ``UnknownHeadError`` lists the valid names."""
    try:
        return HEADS[name]
    except KeyError:
        raise UnknownHeadError(
            f"unknown head {name!r}; valid heads: {', '.join(sorted(HEADS))}"
        ) from None


def create_head(name: str, in_channels: int, **options: Any) -> nn.Module:
    """Build the head ``name`` for ``in_channels`` input channels.

    Every head maps ``(B, in_channels, h, w)`` to ``(B, head.output_dim)``. Options are the head's
    own keyword arguments (``dim`` for ``smso``, ``cbp_ts`` and ``cbp_rm``; ``num_classes`` for
    ``lrbp``; ...).

    Raises:
        UnknownHeadError: ``name`` is not registered; the message lists the valid names.
        TypeError: an option the head does not take.
    """
    return head_spec(name).factory(in_channels, **options)
