"""The typicality score as part of the exported graph: an output ``typicality`` (float32, ``(N,)``).

:class:`modelcard.typicality.Typicality` computes the score in numpy, in the service's inference
thread, while holding Python's lock: on a small model that costs a stream of single images a
measurable share of its requests per second. Folded into the graph, onnxruntime computes it in the
same run as the logits, and the service only looks up the p-value.

Each Mahalanobis term, for ``x`` (N, d) and centres ``c`` (M, d), with ``P = alpha I + U diag(w)
U^T``, is written as products with constants, after a shift ``s`` (the mean of the centres) that
keeps the numbers small in float32. With ``v = alpha + w`` (the precisions along ``U``: for the
exact inverse, ``alpha = 0``; for probabilistic PCA, ``1 / top`` eigenvalue, while ``w`` itself is
negative) and the part of a vector off ``U``, ``R(y) = y - y U U^T``::

    x~ = x - s,  c~ = c - s
    d(x, c_j) = ((x~ U - c~_j U)^2) v + alpha |R(x~) - R(c~_j)|^2                (N, M)
    m(x)      = log max(min_j d(x, c_j), tiny)                                   (N, 1)

Both parts are sums of squares with positive weights. The part along ``U``, which carries the
large precisions, takes its differences in the projected space, ``(N, 1, r) - (M, r) -> (N, M,
r)``. Expanded instead (``(x~ U)^2 w - 2 x~ U diag(w) (c~ U)^T + ...``) its terms can be the
condition number of ``P`` times larger than a small distance, and float32 lost it: on a briefly
trained model (precisions spanning 1e3) the graph's score was 3e-4 of the reference scores'
spread off numpy's, 1e-5 now; on the shipped model 4.1e-6, now 1.4e-6 (2,000 validation
images). The part off ``U`` (probabilistic PCA only: ``d`` > 256) has one precision, ``alpha``
(the largest of ``P``'s: the inverse of the mean of the smaller variances), expanded as
``|R(x~)|^2 - 2 R(x~) R(c~)^T + |R(c~)|^2`` to keep the intermediate at ``(N, M, r)`` (``r`` <=
256; 51,200 numbers per image for 200 classes), not ``(N, M, d)``. Its residual ``R(x~)`` is a
difference of nearly equal vectors where ``x~`` lies mostly along ``U``, and float32 loses it
there: 5e-4 of the spread on a synthetic reference whose variances span 1e6
(tests/export/test_typicality_graph.py, marked as this known limit). The export's parity check
catches it, and such a file is scored by the service, in float64.

The energy is ``-ReduceLogSumExp(logits)``, and the score ``sum_t (term_t - a_t) / b_t`` over the
terms concatenated ``(N, T)``. The graph computes in float32 (the service's numpy in float64), and
:func:`score_parity` measures the difference on the CPU, where the export checks it.
Reduced-precision products (CUDA's TF32 matrix products, TensorRT in float16) widen it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from modelcard import CARD_KEY
from modelcard.card import ModelCard
from modelcard.typicality import Precision, Typicality

__all__ = ["OUTPUT", "SCORE_TOLERANCE", "append_score", "score_parity", "strip_score"]

#: The output's name: what the service reads, and the name the Open Inference Protocol answers.
OUTPUT = "typicality"
#: The largest difference from numpy's float64 score an export accepts, as a share of the
#: reference scores' standard deviation (float32 on the CPU gives about 1e-6 to 1e-5).
SCORE_TOLERANCE = 1e-4
_PREFIX = "typicality/"


class _Builder:
    """Nodes and float32 constants appended to a graph, each named under ``typicality/``."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{_PREFIX}{stem}_{self.count}"

    def constant(self, stem: str, value: np.ndarray) -> str:
        name = self.name(stem)
        array = np.ascontiguousarray(value, np.float32)
        self.graph.initializer.append(numpy_helper.from_array(array, name))
        return name

    def axes(self, *axes: int) -> str:
        name = self.name("axes")
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(axes, np.int64), name))
        return name

    def node(self, op: str, inputs: Sequence[str], output: str | None = None, **attrs: Any) -> str:
        output = output or self.name(op.lower())
        self.graph.node.append(helper.make_node(op, list(inputs), [output], **attrs))
        return output

    def float32(self, name: str) -> str:
        """Output ``name`` as float32: cast where the graph gives another type."""
        output = next(o for o in self.graph.output if o.name == name)
        if output.type.tensor_type.elem_type == TensorProto.FLOAT:
            return name
        return self.node("Cast", [name], to=TensorProto.FLOAT)

    def log_min_distance(self, x: str, precision: Precision, centres: np.ndarray) -> str:
        """``log max(min_j d(x, c_j), tiny)``: ``(N, 1)``."""
        shift = centres.mean(axis=0)
        c = centres - shift  # (M, d)
        centred = self.node("Sub", [x, self.constant("shift", shift)])  # (N, d)
        basis = self.constant("basis", precision.basis)
        projected = self.node("MatMul", [centred, basis])  # (N, r)
        c_basis = c @ precision.basis  # (M, r)
        apart = self.node(  # (N, 1, r) - (M, r): (N, M, r)
            "Sub",
            [self.node("Unsqueeze", [projected, self.axes(1)]), self.constant("centres", c_basis)],
        )
        squared = self.node("Mul", [apart, apart])
        along = precision.weights + precision.alpha  # v > 0: the precisions along U
        weighted = self.node("MatMul", [squared, self.constant("weights", along[:, None])])
        distances = self.node("Squeeze", [weighted, self.axes(2)])  # (N, M)
        if precision.alpha:  # + alpha |R(x~) - R(c~)|^2, R(y) = y - y U U^T
            back = self.node("Gemm", [projected, basis], transB=1)  # x~ U U^T: (N, d)
            off = self.node("Sub", [centred, back])
            c_off = c - c_basis @ precision.basis.T  # (M, d)
            own = self.node("ReduceSum", [self.node("Mul", [off, off]), self.axes(1)], keepdims=1)
            cross = self.node("MatMul", [off, self.constant("cross", -2.0 * c_off.T)])  # (N, M)
            squares = self.constant("squares", (c_off**2).sum(axis=1)[None, :])  # (1, M)
            isotropic = self.node("Add", [self.node("Add", [cross, own]), squares])
            scaled = self.node(
                "Mul", [isotropic, self.constant("alpha", np.asarray(precision.alpha))]
            )
            distances = self.node("Add", [distances, scaled])
        zero = self.constant("zero", np.asarray(0.0))
        distances = self.node("Max", [distances, zero])  # as numpy: rounding can leave -1e-6
        nearest = self.node("ReduceMin", [distances, self.axes(1)], keepdims=1)  # (N, 1)
        floor = self.constant("tiny", np.asarray(np.finfo(np.float32).tiny))
        return self.node("Log", [self.node("Max", [nearest, floor])])


def append_score(proto: onnx.ModelProto, typicality: Typicality) -> None:
    """Add the output ``typicality`` (float32 ``(N,)``) computed from the graph's outputs
    ``logits``, ``embedding`` (and ``features`` where the reference scores them), in place."""
    graph = proto.graph
    if any(o.name == OUTPUT for o in graph.output):
        raise ValueError(f"the graph already has an output {OUTPUT!r}")
    build = _Builder(graph)
    embedding = build.float32("embedding")
    logits = build.float32("logits")
    terms = [
        build.log_min_distance(embedding, typicality.within, typicality.class_means),
        build.log_min_distance(embedding, typicality.precision, typicality.mean[None, :]),
        build.node("Neg", [build.node("ReduceLogSumExp", [logits, build.axes(1)], keepdims=1)]),
    ]
    if typicality.feature_means is not None and typicality.feature_within is not None:
        features = build.float32("features")
        terms.append(
            build.log_min_distance(features, typicality.feature_within, typicality.feature_means)
        )
    stacked = build.node("Concat", terms, axis=1)  # (N, T)
    a, b = typicality.standardise[:, 0], typicality.standardise[:, 1]
    standardised = build.node(
        "Mul",
        [
            build.node("Sub", [stacked, build.constant("a", a)]),
            build.constant("inverse_b", 1.0 / b),
        ],
    )
    build.node("ReduceSum", [standardised, build.axes(1)], OUTPUT, keepdims=0)  # (N,)
    batch = graph.output[0].type.tensor_type.shape.dim[0]
    dim = batch.dim_param or batch.dim_value
    graph.output.append(helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, [dim]))


def score_parity(session: object, typicality: Typicality, images: np.ndarray) -> float:
    """The largest difference between the graph's score and numpy's (float64) on ``images``,
    relative to the reference scores' standard deviation."""
    names = [o.name for o in session.get_outputs()]  # type: ignore[attr-defined]
    wanted = ["logits", "embedding", OUTPUT] + (["features"] if "features" in names else [])
    logits, embedding, graph_score, *features = session.run(  # type: ignore[attr-defined]
        wanted, {"image": images}
    )
    expected = typicality.score(logits, embedding, features[0] if features else None)
    scale = float(np.std(typicality.reference)) or 1.0
    return float(np.max(np.abs(graph_score - expected)) / scale)


def strip_score(proto: onnx.ModelProto) -> bool:
    """Remove what :func:`append_score` added, in place, and the card's note of it (a file
    the service scores in numpy); whether there was anything to remove."""
    graph = proto.graph
    kept = [
        n for n in graph.node if not any(o == OUTPUT or o.startswith(_PREFIX) for o in n.output)
    ]
    removed = len(graph.node) - len(kept)
    del graph.node[:]
    graph.node.extend(kept)
    initializers = [i for i in graph.initializer if not i.name.startswith(_PREFIX)]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    outputs = [o for o in graph.output if o.name != OUTPUT]
    del graph.output[:]
    graph.output.extend(outputs)
    for prop in proto.metadata_props:  # the card no longer says the file computes the score
        if prop.key == CARD_KEY:
            card = ModelCard.from_json(prop.value)
            section = card.typicality
            if section is not None and section.output is not None:
                scored_by_service = {"output": None, "output_max_difference": None}
                update = {"typicality": section.model_copy(update=scored_by_service)}
                prop.value = card.model_copy(update=update).to_json()
    return removed > 0
