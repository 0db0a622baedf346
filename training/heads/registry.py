"""The head registry: a name selects a pooling head (timm-style ``create_head``).

Each entry is a :class:`HeadSpec`: how to build the head and everything a caller needs to know
about it (does it take the number of classes, does it score them itself, which loss it was made
for, its forms, ...), so that no caller looks at a head's name or probes its attributes.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor

from training.heads.base import Head
from training.heads.bilinear import BilinearPooling
from training.heads.compact_bilinear import RandomMaclaurin, TensorSketch
from training.heads.deepo2p import DeepO2P
from training.heads.first_order import GlobalAvgPool
from training.heads.flatten import CovarianceFlatten
from training.heads.lrbp import LowRankBilinear
from training.heads.mpn import MPNCOV
from training.heads.smso import FORMS, SMSOPooling
from training.heads.vgg_fc import VGGClassifierHead

__all__ = [
    "HEADS",
    "LOSSES",
    "HeadOptionError",
    "HeadSpec",
    "UnknownHeadError",
    "create_head",
    "head_spec",
]

#: The losses a head can be designed for (``training.engine.make_criterion`` builds them).
LOSSES: tuple[str, ...] = ("cross_entropy", "hinge")


class UnknownHeadError(ValueError):
    """A head name that is not registered."""


class HeadOptionError(ValueError):
    """An option a head does not take, or a value it cannot use."""


@dataclass(frozen=True)
class HeadSpec:
    """How to build one head, the paper's setting for it, and what callers need to know about it."""

    factory: Callable[..., Head]  # called as factory(in_channels, **options)
    paper_channels: int | None  # c the paper feeds it (the 1x1 reduction); None: backbone's own
    summary: str  # one line for listings and --help
    needs_num_classes: bool = False  # the factory takes num_classes=K (the model passes it)
    scores_classes: bool = False  # its output is the K class scores: the model adds no classifier
    loss: str = "cross_entropy"  # the loss it was designed for (TrainConfig's loss="auto")
    forms: tuple[str, ...] = ()  # values of its `form` option: one function, other arithmetic
    size_symbol: str | None = None  # how tables name the size its `dim` option sets ("p", "d")
    # on the small CNN its `dim` defaults to the reduced width c (SMSO: p = c = 64), since its
    # own default suits ImageNet backbones (p = 2,048)
    small_cnn_dim_is_width: bool = False
    # copies its own layers from the backbone's pretrained state dict (VGG-D's fc6 and fc7)
    load_pretrained: Callable[[Any, Mapping[str, Tensor]], None] | None = None
    # when smso-train sets the head's state from statistics of its input over the training
    # images (Head.input_statistics): "before_training" (LRBP's projection from the Gram
    # matrix), "after_training" (SMSO's Sigma re-estimated)
    input_statistics: Literal["before_training", "after_training"] | None = None

    def __post_init__(self) -> None:
        if self.scores_classes and not self.needs_num_classes:
            raise ValueError("a head that scores classes must declare needs_num_classes")
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; valid losses: {', '.join(LOSSES)}")


HEADS: dict[str, HeadSpec] = {
    "gap": HeadSpec(GlobalAvgPool, None, "first-order global average pooling, c-d"),
    "vgg_fc": HeadSpec(
        VGGClassifierHead,
        None,
        "first-order VGG-D: pool5, fc6, fc7, 4,096-d",
        load_pretrained=VGGClassifierHead.load_torchvision_classifier,
    ),
    "bp": HeadSpec(
        BilinearPooling, 512, "bilinear pooling + signed sqrt + l2, c^2-d (triu: c(c+1)/2-d)"
    ),
    "deepo2p": HeadSpec(DeepO2P, 512, "matrix logarithm of the covariance, c^2-d"),
    "mpn": HeadSpec(MPNCOV, 256, "iSQRT-COV matrix square root, c(c+1)/2-d"),
    "cbp_ts": HeadSpec(
        TensorSketch, 512, "compact bilinear, Tensor Sketch, 8,192-d", size_symbol="d"
    ),
    "cbp_rm": HeadSpec(
        RandomMaclaurin, 512, "compact bilinear, Random Maclaurin, 8,192-d", size_symbol="d"
    ),
    "lrbp": HeadSpec(
        LowRankBilinear,
        None,  # Kong & Fowlkes project conv5_3 itself: P is LRBP's own reduction
        "low-rank bilinear classifier, K-d (scores the K classes)",
        needs_num_classes=True,
        scores_classes=True,
        loss="hinge",
        input_statistics="before_training",
    ),
    "flatten": HeadSpec(
        CovarianceFlatten, 256, "covariance flattened, no PV or normalisation (Table 3), c^2-d"
    ),
    "smso": HeadSpec(
        SMSOPooling,
        256,
        "SMSO pooling, p-d (option dim, default 2,048)",
        forms=FORMS,
        size_symbol="p",
        small_cnn_dim_is_width=True,
        input_statistics="after_training",
    ),
}


def head_spec(name: str) -> HeadSpec:
    """The registry entry for ``name``; ``UnknownHeadError`` lists the valid names."""
    try:
        return HEADS[name]
    except KeyError:
        raise UnknownHeadError(
            f"unknown head {name!r}; valid heads: {', '.join(sorted(HEADS))}"
        ) from None


def create_head(name: str, in_channels: int, **options: Any) -> Head:
    """Build the head ``name`` for ``in_channels`` input channels.

    Every head maps ``(B, in_channels, h, w)`` to ``(B, head.output_dim)``. Options are the head's
    own keyword arguments (``dim`` for ``smso``, ``cbp_ts`` and ``cbp_rm``; ``num_classes`` for
    the heads whose spec says ``needs_num_classes``; ...).

    Raises:
        UnknownHeadError: ``name`` is not registered; the message lists the valid names.
        HeadOptionError: an option the head does not take (the message lists those it takes),
            or a value of the wrong type.
    """
    factory = head_spec(name).factory
    # after in_channels; annotations as types (the heads' modules write them as strings)
    parameters = list(inspect.signature(factory, eval_str=True).parameters.values())[1:]
    accepted = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes_any = any(p.kind == p.VAR_KEYWORD for p in parameters)
    unknown = [] if takes_any else sorted(set(options) - set(accepted))
    if unknown:
        raise HeadOptionError(
            f"head {name!r} has no option {', '.join(map(repr, unknown))}; its options: "
            f"{', '.join(accepted) or 'none'}"
        )
    hints = {p.name: p.annotation for p in parameters if p.annotation is not p.empty}
    for option, value in options.items():
        if option in hints and not _fits(hints[option], value):
            raise HeadOptionError(
                f"head {name!r}: option {option} must be {_described(hints[option])}, got {value!r}"
            )
    try:
        return factory(in_channels, **options)
    except TypeError as error:  # e.g. a string where the head computes with a number
        if not options:
            raise
        raise HeadOptionError(
            f"head {name!r}: options {options} do not fit it ({error})"
        ) from error


def _fits(hint: Any, value: Any) -> bool:
    """Whether ``value`` (from JSON or TOML) is of the type ``hint`` annotates: an int is a
    float, a bool is neither; a hint this does not read (a callable, say) fits anything."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return any(type(value) is type(v) and value == v for v in typing.get_args(hint))
    if origin in (types.UnionType, typing.Union):
        return any(_fits(arg, value) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _described(hint: Any) -> str:
    """``hint`` in words, as a user writes the value: "a whole number", "one of 'conv', ..."."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(hint))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_described(arg) for arg in typing.get_args(hint))
    words = {
        type(None): "null",
        bool: "true or false",
        int: "a whole number",
        float: "a number",
        str: "a string",
    }
    return words.get(hint, f"a {getattr(hint, '__name__', hint)}")
