"""The preprocessing of :mod:`service.imaging.images` as an ONNX graph, for images decoded on the
GPU: ``python -m service.imaging.preprocess_graph`` writes :data:`GRAPH` (committed; the serving
image has no ``onnx`` package, and the test suite checks that the file is what this module builds).

Inputs (one image; every size is an input, so one graph serves every model card):

- ``image``: uint8 ``(H, P)``, rows of ``P >= 3W`` bytes holding ``W`` interleaved RGB pixels
  (a decoder's pitched buffer);
- ``row`` int64 ``(1,)`` = ``3W``; ``hwc`` int64 ``(3,)`` = ``(H, W, 3)``;
- ``weights`` float32 ``(3, K)`` and the colour step ``c = floor((x @ weights + 2**15) / 2**16)``:
  the identity times ``2**16`` keeps RGB (``K = 3``), ``[[19595], [38470], [7471]]`` is Pillow's
  ``convert("L")`` (``K = 1``), both exact in float32 (every sum is an integer below ``2**24``;
  elementwise products and a sum, never a matrix product a GPU may run in TF32);
- ``width`` and ``height`` int64 ``(4,)``: the sizes ``(1, K, H, w')`` and ``(1, K, h', w')``
  of the two resize passes, Pillow's order (horizontal, then vertical), each antialiased linear
  with half-pixel centres and weights renormalised at the borders (Pillow's ``BILINEAR``), each
  rounded to 8 bits as Pillow's 8-bit resampling rounds;
- ``start`` and ``end`` int64 ``(2,)``: the centre crop's rows and columns;
- ``mean`` and ``std`` float32 ``(K, 1, 1)``.

Output ``pixels``: float32 ``(K, S, S)`` = ``(v / 255 - mean) / std``, the same float32
operations in the same order as :meth:`service.imaging.images.Preprocessor.tensor`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

GRAPH = Path(__file__).with_name("preprocess.onnx")
OPSET = 18  # Resize's antialias attribute (onnxruntime runs it on the CPU and CUDA providers)


def build() -> bytes:
    """The graph's serialised ``ModelProto`` (deterministic: the same bytes every time)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def const(name: str, values: float | list[float] | list[int], dtype: type) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(values, dtype), name)

    resize: dict[str, Any] = {
        "mode": "linear",
        "antialias": 1,
        "coordinate_transformation_mode": "half_pixel",
        "exclude_outside": 1,
    }
    nodes = [
        helper.make_node("Slice", ["image", "zero", "row", "one"], ["rows"]),
        helper.make_node("Reshape", ["rows", "hwc"], ["hwc_u8"]),
        helper.make_node("Transpose", ["hwc_u8"], ["chw_u8"], perm=[2, 0, 1]),
        helper.make_node("Cast", ["chw_u8"], ["chw"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["chw", "one"], ["c1hw"]),  # (3, 1, H, W)
        helper.make_node("Unsqueeze", ["weights", "spatial"], ["ck11"]),  # (3, K, 1, 1)
        helper.make_node("Mul", ["c1hw", "ck11"], ["weighted"]),  # (3, K, H, W)
        helper.make_node("ReduceSum", ["weighted", "zero"], ["summed"]),  # (1, K, H, W)
        helper.make_node("Add", ["summed", "half_unit"], ["shifted"]),
        helper.make_node("Div", ["shifted", "unit"], ["scaled"]),
        helper.make_node("Floor", ["scaled"], ["nkhw"]),
        helper.make_node("Resize", ["nkhw", "", "", "width"], ["wide"], **resize),
        helper.make_node("Round", ["wide"], ["wide_r"]),
        helper.make_node("Clip", ["wide_r", "black", "white"], ["wide_8"]),
        helper.make_node("Resize", ["wide_8", "", "", "height"], ["tall"], **resize),
        helper.make_node("Round", ["tall"], ["tall_r"]),
        helper.make_node("Clip", ["tall_r", "black", "white"], ["resized"]),
        helper.make_node("Slice", ["resized", "start", "end", "spatial"], ["cropped"]),
        helper.make_node("Div", ["cropped", "white"], ["unit_range"]),
        helper.make_node("Sub", ["unit_range", "mean"], ["centred"]),
        helper.make_node("Div", ["centred", "std"], ["normalised"]),
        helper.make_node("Squeeze", ["normalised", "zero"], ["pixels"]),
    ]
    initialisers = [
        const("zero", [0], np.int64),
        const("one", [1], np.int64),
        const("spatial", [2, 3], np.int64),
        const("half_unit", [2.0**15], np.float32),
        const("unit", [2.0**16], np.float32),
        const("black", 0.0, np.float32),  # a scalar
        const("white", 255.0, np.float32),
    ]
    i64, f32 = TensorProto.INT64, TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("image", TensorProto.UINT8, ["H", "P"]),
        helper.make_tensor_value_info("row", i64, [1]),
        helper.make_tensor_value_info("hwc", i64, [3]),
        helper.make_tensor_value_info("weights", f32, [3, "K"]),
        helper.make_tensor_value_info("width", i64, [4]),
        helper.make_tensor_value_info("height", i64, [4]),
        helper.make_tensor_value_info("start", i64, [2]),
        helper.make_tensor_value_info("end", i64, [2]),
        helper.make_tensor_value_info("mean", f32, ["K", 1, 1]),
        helper.make_tensor_value_info("std", f32, ["K", 1, 1]),
    ]
    outputs = [helper.make_tensor_value_info("pixels", f32, ["K", "S", "S"])]
    graph = helper.make_graph(nodes, "smso_preprocess", inputs, outputs, initialisers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="smso service.imaging.preprocess_graph",
    )
    model.ir_version = 9  # onnxruntime 1.31 reads up to 11; 9 is what opset 18 needs
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def main() -> None:
    GRAPH.write_bytes(build())
    print(f"wrote {GRAPH} ({GRAPH.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
