"""Small ONNX files with a model card, built by the tests: a linear map of the image to its
logits and embedding, whose shapes (and card) a test chooses, optionally behind an ONNX ``Loop``
that never ends."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.service.conftest import CARD, CARD_KEY

# the tests that build their models here are skipped where onnx is not installed (serving)
pytest.importorskip("onnx", reason="the test builds its ONNX file with onnx (dev extra)")
import onnx
from onnx import TensorProto, helper, numpy_helper

#: ``Loop``'s trip count in :func:`model_file`'s endless model: 2**62 iterations.
ENDLESS = 2**62


def card(**changes: Any) -> dict[str, Any]:
    """The fake backend's card (10 classes, a 4-value embedding, 1 x 28 x 28 images), each
    section of ``changes`` updated (a section given as a non-dict replaces it)."""
    result = copy.deepcopy(CARD)
    for section, values in changes.items():
        if isinstance(values, dict) and isinstance(result.get(section), dict):
            result[section].update(values)
        else:
            result[section] = values
    return result


def model_file(
    path: Path,
    model_card: dict[str, Any] | str | None = None,
    logits: int | str = 10,
    embedding: int | str = 4,
    image: tuple[int | str, ...] = ("batch", 1, 28, 28),
    loop: int | None = None,
) -> Path:
    """Write an ONNX file to ``path``: ``logits = flat(image) @ A`` (``(N, logits)``) and
    ``embedding = flat(image) @ B`` (``(N, embedding)``); a dimension given as a string is
    left symbolic in the graph's declared output (the values have the size of the card's
    classes and embedding then). With ``loop``, the flattened image goes through a ``Loop`` of
    that many iterations (each an identity) first. ``model_card``: the card (a dict, or the
    metadata's raw string); by default :func:`card`."""
    model_card = card() if model_card is None else model_card
    raw = model_card if isinstance(model_card, str) else json.dumps(model_card)
    parsed = json.loads(raw) if not isinstance(model_card, str) else {}
    dims = image[1:]
    fixed = [d for d in dims if isinstance(d, int)]
    pixels = int(np.prod(fixed)) if len(fixed) == len(dims) else 28 * 28
    k = logits if isinstance(logits, int) else len(parsed.get("classes", CARD["classes"]))
    p = embedding if isinstance(embedding, int) else parsed["model"]["embedding_dim"]
    rng = np.random.default_rng(0)
    a = numpy_helper.from_array(rng.standard_normal((pixels, k)).astype(np.float32) / 28, "A")
    b = numpy_helper.from_array(rng.standard_normal((pixels, p)).astype(np.float32) / 28, "B")
    nodes = [helper.make_node("Flatten", ["image"], ["flat"], axis=1)]
    initializers = [a, b]
    source = "flat"
    if loop is not None:
        body = helper.make_graph(
            [
                helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                helper.make_node("Identity", ["x_in"], ["x_out"]),
            ],
            "body",
            [
                helper.make_tensor_value_info("i", TensorProto.INT64, []),
                helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                helper.make_tensor_value_info("x_in", TensorProto.FLOAT, None),
            ],
            [
                helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                helper.make_tensor_value_info("x_out", TensorProto.FLOAT, None),
            ],
        )
        initializers += [
            numpy_helper.from_array(np.array(loop, np.int64), "trips"),
            numpy_helper.from_array(np.array(True), "keep_going"),
        ]
        nodes.append(
            helper.make_node("Loop", ["trips", "keep_going", "flat"], ["looped"], body=body)
        )
        source = "looped"
    nodes += [
        helper.make_node("MatMul", [source, "A"], ["logits"]),
        helper.make_node("MatMul", [source, "B"], ["embedding"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, list(image))],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", logits]),
            helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", embedding]),
        ],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {CARD_KEY: raw})
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
