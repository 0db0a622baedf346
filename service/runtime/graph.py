"""What a model card says of its graph, checked against the graph: refused when the model is
loaded, never a failure at request time.

The card names the classes (one per value of the ``logits`` output), the embedding's size (the
``embedding`` output's values per image) and the input (the ``image`` input's channels, height
and width). :func:`check_graph` compares them with the shapes the graph declares
(onnxruntime's ``get_inputs()`` and ``get_outputs()``), where they are numbers; a dimension
left symbolic (``"classes"``) is checked on what the warm-up's batches answer
(:func:`check_outputs`). Each contradiction is a :class:`~service.core.card.CardError` of one
line naming the card's field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from service.core.card import CardError, ModelCard
from service.runtime.outputs import BackendOutputs

__all__ = ["INPUT", "OUTPUTS", "check_graph", "check_outputs"]

#: The graph's input, which every runner feeds (``(N, C, H, W)`` float32).
INPUT = "image"
#: The graph's outputs every model has, in the order a backend answers them.
OUTPUTS = ("logits", "embedding")


class _Arg(Protocol):
    """An input or output as onnxruntime describes it (``onnxruntime.NodeArg``)."""

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> Sequence[int | str | None]: ...


def _contradiction(field: str, says: str, graph: str) -> CardError:
    return CardError(f"the model card contradicts its graph: {field} {says}, {graph}")


def _expected(card: ModelCard) -> dict[str, tuple[str, int]]:
    """Each output's values per image as the card gives them, and the card's field."""
    return {
        "logits": ("classes", len(card.classes)),
        "embedding": ("model.embedding_dim", card.model.embedding_dim),
    }


def check_graph(card: ModelCard, inputs: Sequence[_Arg], outputs: Sequence[_Arg]) -> None:
    """:class:`CardError` where the card contradicts a dimension the graph declares as a
    number: the ``image`` input's channels, height and width, and the values per image of
    ``logits`` (the classes) and ``embedding``; symbolic dimensions are left to
    :func:`check_outputs`."""
    image = next((arg for arg in inputs if arg.name == INPUT), None)
    if image is None:
        names = [arg.name for arg in inputs]
        raise CardError(f"the graph has the inputs {names}; expected one named {INPUT!r}")
    shape = list(image.shape)
    if len(shape) != 4:
        raise CardError(
            f"the graph's {INPUT!r} input has the shape {shape}; expected (batch, channels, "
            "height, width)"
        )
    spec = card.input
    for field, value, dim in zip(
        ("input.channels", "input.height", "input.width"),
        (spec.channels, spec.height, spec.width),
        shape[1:],
        strict=True,
    ):
        if isinstance(dim, int) and dim != value:
            raise _contradiction(field, f"is {value}", f"the graph's {INPUT!r} input has {dim}")
    declared = {arg.name: list(arg.shape) for arg in outputs}
    for name, (field, value) in _expected(card).items():
        dims = declared.get(name)
        if dims is None:
            continue  # a missing output is the backend's refusal (it names every output)
        if len(dims) != 2:
            raise CardError(
                f"the graph's {name!r} output has the shape {dims}; expected (batch, values)"
            )
        if isinstance(dims[1], int) and dims[1] != value:
            raise _contradiction(
                field, f"says {value}", f"the graph's {name!r} output has {dims[1]} per image"
            )


def check_outputs(card: ModelCard, images: int, outputs: BackendOutputs) -> None:
    """:class:`CardError` where a batch of ``images`` answered ``logits`` or ``embedding`` of
    another shape than ``(images, values)`` with the card's values: what the warm-up checks,
    for graphs whose dimensions are symbolic."""
    answered = outputs.named()
    for name, (field, value) in _expected(card).items():
        output = answered[name]
        if output.shape != (images, value):
            raise _contradiction(
                field,
                f"says {value}",
                f"the graph's {name!r} output for {images} images has the shape "
                f"{tuple(output.shape)}",
            )
