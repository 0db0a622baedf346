"""smso-export end to end: the graph, its dynamic axes, parity, the card, failures."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from torch import nn

from export import onnx_export
from export.card import CARD_KEY, card_from_proto, file_sha256
from export.cli import main as export_main
from export.onnx_export import export_checkpoint, graph_opset, newest_opset
from export.parity import ParityError
from modelcard.typicality import Typicality
from training.checkpoint import load_model, save_checkpoint
from training.datasets.base import LabelledImages
from training.datasets.presets import PRESETS
from training.evaluate import load_with_splits
from training.heads.smso import SMSOPooling
from training.model import ModelConfig, build_model

ROOT = Path(__file__).resolve().parents[2]
C, P = 8, 4  # the tiny run's SMSO: c = 8 channels, p = 4


def card_of(path: Path) -> dict:
    """The file's card as JSON data, read as the service reads it."""
    return card_from_proto(onnx.load(path))


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def tensor_shapes(model: onnx.ModelProto) -> list[tuple]:
    """Shapes of every initializer and every intermediate tensor shape inference can name."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = [tuple(init.dims) for init in model.graph.initializer]
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        dims = value.type.tensor_type.shape.dim
        shapes.append(tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims))
    return shapes


def has_c_by_c(shapes: list[tuple], c: int) -> bool:
    return any(sum(1 for d in shape if d == c) >= 2 for shape in shapes)


@pytest.fixture(scope="module")
def exported(trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_checkpoint(trained_run / "best.pt", tmp_path_factory.mktemp("x") / "m.onnx").path


def test_the_file_has_named_inputs_and_outputs_with_dynamic_batch_and_size(exported):
    graph = onnx.load(exported).graph
    dims = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*graph.input, *graph.output]
    }
    assert dims["image"][1] == 1
    assert all(isinstance(d, str) for d in dims["image"][::2])
    assert isinstance(dims["image"][3], str)
    assert dims["logits"][1] == 10
    assert dims["embedding"][1] == P
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_a_static_size_export_has_no_shape_arithmetic_and_says_so(trained_run, tmp_path, exported):
    """--static-size: H and W fixed, the batch still dynamic, no Shape node left (onnxruntime
    would place the shape arithmetic on the CPU, which CUDA graphs refuse); same answers."""
    assert any(n.op_type == "Shape" for n in onnx.load(exported).graph.node)  # what it removes
    assert (
        export_main([str(trained_run / "best.pt"), "-o", str(tmp_path / "s.onnx"), "--static-size"])
        == 0
    )
    model = onnx.load(tmp_path / "s.onnx")
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert isinstance(dims[0], str)
    assert dims[1:] == [1, 28, 28]
    assert not any(n.op_type == "Shape" for n in model.graph.node)
    assert card_of(tmp_path / "s.onnx")["input"]["dynamic_size"] is False
    images = np.random.default_rng(0).random((3, 1, 28, 28), np.float32)
    got, want = (
        session(tmp_path / "s.onnx").run(None, {"image": images}),
        session(exported).run(None, {"image": images}),
    )
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_the_conv_form_graph_holds_no_c_by_c_tensor_and_the_covariance_form_does(
    trained_run, exported, tmp_path
):
    model_nodes = [
        n
        for n in onnx.load(exported).graph.node  # not the typicality score's
        if not any(o.startswith("typicality") for o in n.output)
    ]
    ops = {node.op_type for node in model_nodes}
    assert "Conv" in ops
    assert "MatMul" not in ops
    assert not has_c_by_c(tensor_shapes(onnx.load(exported)), C)
    # the check can fail: the covariance form has (N, c, c) tensors, and it finds them
    cov = export_checkpoint(trained_run / "best.pt", tmp_path / "cov.onnx", form="covariance")
    assert has_c_by_c(tensor_shapes(onnx.load(cov.path)), C)
    assert card_of(cov.path)["model"]["form"] == "covariance"


@pytest.mark.parametrize(("batch", "side"), [(1, 28), (5, 28), (2, 36), (3, 20)])
def test_onnxruntime_matches_pytorch_at_other_batch_sizes_and_image_sizes(
    trained_run, exported, batch, side
):
    model, _ = load_model(trained_run / "best.pt")
    images = torch.randn(batch, 1, side, side)
    logits, embedding, _ = session(exported).run(
        ["logits", "embedding", "features"], {"image": images.numpy()}
    )
    with torch.inference_mode():
        expected = model(images)
    np.testing.assert_allclose(logits, expected.logits.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(embedding, expected.embedding.numpy(), rtol=1e-4, atol=1e-4)


def test_reading_the_card_of_a_file_without_one_names_the_missing_key():
    bare = onnx.helper.make_model(onnx.helper.make_graph([], "bare", [], []))
    bare.metadata_props.add(key="other", value="{}")
    with pytest.raises(KeyError, match=re.escape(f"no {CARD_KEY!r} in its metadata_props")):
        card_from_proto(bare)


def test_the_model_card_says_what_a_server_needs(trained_run, exported):
    card = card_of(exported)
    assert card["format"] == "smso-model-card"
    assert card["version"] == 1
    assert card["classes"][0] == "T-shirt/top"
    assert len(card["classes"]) == 10
    assert card["input"] | {"channels": 1, "height": 28, "dynamic_size": True} == card["input"]
    assert card["preprocessing"]["mean"] == pytest.approx([0.2860])
    assert card["preprocessing"]["resize"] == 28  # no resize in training: the crop side
    assert card["preprocessing"]["crop"] == 28
    assert card["model"] | {"head": "smso", "embedding_dim": P, "form": "conv"} == card["model"]
    n = 7 * 7  # 28 px at small_cnn's stride 4
    assert card["model"]["form_choice"] == {
        "form": "conv",
        "requested": "conv",
        "positions": n,
        "multiply_adds": {"conv": P * C * n, "covariance": C * C * n + P * C * C},
    }
    assert card["dataset"] == "fashion_mnist"
    report = json.loads((trained_run / "test.json").read_text())
    assert card["metrics"]["test_accuracy"] == report["test_accuracy"]
    assert card["checkpoint"]["sha256"] == file_sha256(trained_run / "best.pt")
    assert card["parity"]["passed"]
    assert card["parity"]["batch_sizes"] == [1, 3, 8]
    assert card["parity"]["inputs"] == ["random", "real"]  # the tiny dataset was at hand
    assert card["parity"]["max_relative_difference"]["logits"] <= 1e-4
    assert {"torch", "onnx", "onnxruntime"} <= set(card["versions"])
    features = ["N", 128]  # small_cnn's last map, before the head's reduction to c
    assert card["outputs"] == {"logits": ["N", 10], "embedding": ["N", P], "features": features}


def test_the_file_names_no_path_of_the_machine_it_was_exported_on(exported):
    """torch.onnx's stack traces (absolute paths, line numbers) are not kept: the bytes do not
    depend on where the repository lies."""
    model = onnx.load(exported)
    kept = {entry.key for node in model.graph.node for entry in node.metadata_props}
    assert onnx_export.STACK_TRACE not in kept
    assert str(ROOT).encode() not in exported.read_bytes()
    assert b"site-packages" not in exported.read_bytes()


def test_a_test_report_of_the_checkpoint_before_smso_recalibrate_is_not_its_test(
    trained_run, tmp_path
):
    """smso-recalibrate after the test changes Sigma: the card's test accuracy is unknown, its
    validation accuracy the one measured with the new Sigma."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "test.json").write_text((trained_run / "test.json").read_text())
    payload = torch.load(trained_run / "best.pt", weights_only=False)
    again = {**payload["recalibration"], "kept": True, "val_accuracy_after": 0.125}
    torch.save({**payload, "recalibration": again}, run / "best.pt")
    metrics = export_checkpoint(run / "best.pt", run / "m.onnx", typicality=False).card.metrics
    assert metrics is not None
    assert metrics.val_accuracy == 0.125
    assert metrics.test_accuracy is None


def test_the_file_passes_the_full_onnx_check(exported):
    onnx.checker.check_model(onnx.load(exported), full_check=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("head", "options"),
    [
        ("gap", {}),
        ("bp", {}),
        ("bp", {"vectorize": "triu"}),
        ("mpn", {}),
        ("cbp_ts", {"dim": 32}),
        ("cbp_rm", {"dim": 32}),
        ("lrbp", {"projection_dim": 4}),
        ("flatten", {}),
        ("smso", {"dim": 6, "transform": "log"}),
    ],
)
def test_every_head_onnx_can_express_exports_with_parity(head, options, tmp_path):
    config = ModelConfig(10, backbone="small_cnn", head=head, head_options=options, reduce_dim=8)
    path = save_checkpoint(tmp_path / "m.pt", build_model(config).eval())
    result = export_checkpoint(path, tmp_path / "m.onnx")
    assert result.parity.passed
    assert result.parity.inputs == ["random"]
    assert card_of(result.path)["model"]["head"] == head


@pytest.mark.parametrize(("dim", "form"), [(4, "conv"), (64, "covariance")])
def test_form_auto_exports_the_cheaper_form_with_parity(dim, form, tmp_path, capsys):
    # small_cnn at 28 px: n = 49 positions, c = 8; p (n - c) >= n c from p = 9.6 on
    config = ModelConfig(
        10, backbone="small_cnn", head="smso", head_options={"dim": dim}, reduce_dim=C
    )
    torch.manual_seed(0)
    checkpoint = save_checkpoint(
        tmp_path / "m.pt", build_model(config).eval(), preset=PRESETS["fashion_mnist"].to_dict()
    )
    output = tmp_path / "m.onnx"
    assert export_main([str(checkpoint), "-o", str(output), "--form", "auto"]) == 0
    card = card_of(output)
    assert card["model"]["form"] == form
    assert card["model"]["form_choice"]["requested"] == "auto"
    costs = card["model"]["form_choice"]["multiply_adds"]
    assert min(costs, key=costs.get) == form
    assert card["parity"]["passed"]
    assert card["parity"]["max_relative_difference"]["embedding"] <= 1e-4
    assert has_c_by_c(tensor_shapes(onnx.load(output)), C) == (form == "covariance")
    assert "max relative difference" in capsys.readouterr().out


def elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every initializer, input, output and inferred intermediate tensor."""
    inferred = onnx.shape_inference.infer_shapes(model).graph
    types = {init.name: init.data_type for init in model.graph.initializer}
    for value in [*inferred.value_info, *inferred.input, *inferred.output]:
        types[value.name] = value.type.tensor_type.elem_type
    return types


def downstream(graph: onnx.GraphProto, tensor: str) -> list[onnx.NodeProto]:
    """Every node that reads ``tensor`` directly or through other nodes."""
    reached, frontier, nodes = {tensor}, [tensor], []
    while frontier:
        name = frontier.pop()
        for node in graph.node:
            if name in node.input and node not in nodes:
                nodes.append(node)
                frontier.extend(o for o in node.output if o not in reached)
                reached.update(node.output)
    return nodes


def test_float16_export_runs_the_backbone_in_half_and_the_head_in_float(
    trained_run, exported, tmp_path
):
    result = export_checkpoint(trained_run / "best.pt", tmp_path / "h.onnx", fp16=True)
    model = onnx.load(result.path)
    graph, types = model.graph, elem_types(model)
    half, full = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    assert "BatchNormalization" not in {node.op_type for node in graph.node}  # folded into Conv
    convs = [node for node in graph.node if node.op_type == "Conv"]
    # every Conv of the backbone and the reduction, weights and bias, in float16; the head's
    # 1x1 conv in float32
    assert [types[node.output[0]] for node in convs] == [half] * (len(convs) - 1) + [full]
    assert all(types[name] == half for node in convs[:-1] for name in node.input)
    # three casts more than the float32 file, between float types: the image to float16 on
    # entry, the head's input and the backbone's map (for the features' mean) back to float32;
    # no pairs of casts around single operators
    casts = [node for node in graph.node if node.op_type == "Cast"]
    float32_casts = [node for node in onnx.load(exported).graph.node if node.op_type == "Cast"]
    assert len(casts) == len(float32_casts) + 3
    changes = [node for node in casts if types[node.input[0]] in (half, full)]
    assert [(types[n.input[0]], types[n.output[0]]) for n in changes] == [
        (full, half),
        (half, full),
        (half, full),
    ]
    assert changes[0].input[0] == "image"
    # the head and the classifier: everything after the cast that leads to the embedding
    after = [downstream(graph, cast.output[0]) for cast in changes[1:]]
    (head,) = [nodes for nodes in after if "embedding" in {o for n in nodes for o in n.output}]
    assert {"Conv", "ReduceMean", "Sqrt", "Gemm"} <= {node.op_type for node in head}
    assert {"logits", "embedding"} <= {name for node in head for name in node.output}
    assert all(types[name] != half for node in head for name in [*node.input, *node.output])
    # the image; logits, embedding, features and the typicality score
    assert [types[v.name] for v in [*graph.input, *graph.output]] == [full] * 5
    card = card_of(result.path)
    assert card["export"] | {"precision": "float16", "optimized": False} == card["export"]
    assert result.parity.passed
    assert result.parity.tolerance == 2e-2
    assert result.size_bytes < 0.75 * exported.stat().st_size


@pytest.mark.parametrize(("batch", "side"), [(1, 28), (4, 36)])
def test_the_float16_file_matches_float32_pytorch_within_its_tolerance(
    trained_run, tmp_path, batch, side
):
    path = export_checkpoint(trained_run / "best.pt", tmp_path / "h.onnx", fp16=True).path
    model, _ = load_model(trained_run / "best.pt")
    images = torch.randn(batch, 1, side, side, generator=torch.Generator().manual_seed(1))
    logits, embedding, _ = session(path).run(
        ["logits", "embedding", "features"], {"image": images.numpy()}
    )
    with torch.inference_mode():
        expected = model(images)
    for got, want in [(logits, expected.logits), (embedding, expected.embedding)]:
        assert got.dtype == np.float32
        assert np.abs(got - want.numpy()).max() <= 2e-2 * np.abs(want.numpy()).max()


def test_a_float16_export_keeps_sums_of_squares_beyond_float16s_range(trained_run, tmp_path):
    model, payload = load_model(trained_run / "best.pt")
    assert isinstance(model.head, SMSOPooling)
    with torch.no_grad():
        model.head.weight.mul_(1000)  # u = W x grows 1,000-fold; Sigma's fold cancels it
    path = save_checkpoint(tmp_path / "big.pt", model, preset=payload["preset"])
    images = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = model(images)
        x = model.forward_features(images)
        u = torch.einsum("pc,bchw->bphw", model.head.weight, x - x.mean((-2, -1), keepdim=True))
    assert u.square().sum((-2, -1)).max() > 65504  # float16's largest value
    result = export_checkpoint(path, tmp_path / "h.onnx", fp16=True)  # no dataset: no config
    assert result.parity.passed
    # onnxruntime's CPU provider runs float16 operators it has no float16 kernel for in float32,
    # which hides an overflow; onnx's reference evaluator computes in each tensor's own type
    evaluator = ReferenceEvaluator(onnx.load(result.path))
    logits, embedding, _ = evaluator.run(
        ["logits", "embedding", "features"], {"image": images.numpy()}
    )
    for got, want in [(logits, expected.logits), (embedding, expected.embedding)]:
        assert np.isfinite(got).all()
        assert np.abs(got - want.numpy()).max() <= 2e-2 * np.abs(want.numpy()).max()


def test_a_parity_failure_names_the_outputs_and_writes_nothing(
    trained_run, exported, tmp_path, monkeypatch
):
    output = tmp_path / "m.onnx"
    earlier = exported.read_bytes()
    output.write_bytes(earlier)
    optimize = onnx_export._optimize

    def broken_optimizer(proto: onnx.ModelProto, workdir: Path) -> onnx.ModelProto:
        """A graph rewrite with a bug: it perturbs the classifier's bias."""
        proto = optimize(proto, workdir)
        for init in proto.graph.initializer:
            if init.name == "classifier.bias":
                init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + 1, init.name))
        return proto

    monkeypatch.setattr(onnx_export, "_optimize", broken_optimizer)
    with pytest.raises(ParityError, match=r"logits: max relative difference [0-9.e-]+ > 0.0001"):
        export_checkpoint(trained_run / "best.pt", output)
    assert output.read_bytes() == earlier
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]  # no half-written file beside it


def test_cli_exports_and_reports_parity(trained_run, tmp_path, capsys):
    assert export_main([str(trained_run / "best.pt"), "-o", str(tmp_path / "m.onnx")]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out
    assert "max relative difference" in out
    assert "test accuracy" in out


def test_an_export_at_the_newest_opset_says_it_in_the_graph_and_the_card(trained_run, tmp_path):
    """And a second export replaces the first (an ONNX model, not another file)."""
    newest, output = newest_opset(), tmp_path / "m.onnx"
    args = [str(trained_run / "best.pt"), "-o", str(output), "--no-typicality"]
    assert export_main(args) == 0
    assert export_main([*args, "--opset", str(newest)]) == 0
    proto = onnx.load(output)
    assert graph_opset(proto) == newest
    assert card_of(output)["export"]["opset"] == newest


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.write_bytes(b"\x00garbage"), "is not a PyTorch checkpoint file"),
    ],
)
def test_cli_reports_a_missing_or_corrupt_checkpoint_in_one_line(tmp_path, make, message):
    path = tmp_path / "x.pt"
    make(path)
    proc = subprocess.run(
        [sys.executable, "-m", "export.cli", str(path), "-o", str(tmp_path / "m.onnx")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("smso-export: error:")
    assert "\n" not in proc.stderr.strip()  # one line
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "m.onnx").exists()


def test_cli_refuses_to_write_over_the_checkpoint_or_into_a_folder(tmp_path, capsys):
    config = ModelConfig(10, backbone="small_cnn", head="smso", head_options={"dim": 4})
    path = save_checkpoint(tmp_path / "m.pt", build_model(config))
    before = path.read_bytes()
    assert export_main([str(path), "-o", str(tmp_path / "." / "m.pt")]) == 2
    assert "is the checkpoint being exported" in capsys.readouterr().err
    assert path.read_bytes() == before
    (tmp_path / "out").mkdir()
    assert export_main([str(path), "-o", str(tmp_path / "out")]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert export_main([str(tmp_path / "out")]) == 2  # a folder as the checkpoint
    assert "is a folder, not a checkpoint file" in capsys.readouterr().err


def test_a_checkpoint_without_a_preset_is_exported_with_a_warning_of_what_is_assumed(
    tmp_path, caplog
):
    config = ModelConfig(10, backbone="small_cnn", head="smso", head_options={"dim": 4})
    path = save_checkpoint(tmp_path / "m.pt", build_model(config).eval())
    result = export_checkpoint(path, tmp_path / "m.onnx")
    assert "has no preprocessing preset" in caplog.text
    assert "assumes 224 x 224 px crops of images scaled to [0, 1], not normalised" in caplog.text
    preprocessing = result.card.preprocessing
    assert (preprocessing.mean, preprocessing.std) == ([0.0], [1.0])


def test_a_checkpoint_whose_weights_are_not_finite_is_refused_before_tracing(tmp_path, capsys):
    """A diverged run's NaN weights: refused as smso-eval refuses them (training.checkpoint.
    check_finite), naming the tensor, before any tracing."""
    config = ModelConfig(10, backbone="small_cnn", head="smso", head_options={"dim": 4})
    model = build_model(config).eval()
    assert isinstance(model.classifier, nn.Linear)
    with torch.no_grad():
        model.classifier.weight.fill_(float("nan"))
    path = save_checkpoint(tmp_path / "m.pt", model)
    assert export_main([str(path), "-o", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"smso-export: error: {path} holds NaN or infinite values in classifier.weight (40 of 40): "
        "the model's outputs would be NaN; the run that wrote it diverged: train again "
        "with a lower learning rate (lr)"
    )
    assert not (tmp_path / "m.onnx").exists()


def test_a_checkpoint_whose_outputs_are_not_finite_is_refused(tmp_path, capsys):
    """Finite weights whose outputs overflow: parity must not pass inf against inf as "no
    difference"."""
    config = ModelConfig(10, backbone="small_cnn", head="smso", head_options={"dim": 4})
    model = build_model(config).eval()
    assert isinstance(model.classifier, nn.Linear)
    with torch.no_grad():
        model.classifier.weight.fill_(3e38)
    path = save_checkpoint(tmp_path / "m.pt", model)
    assert export_main([str(path), "-o", str(tmp_path / "m.onnx")]) == 1
    err = capsys.readouterr().err
    assert "holds NaN or infinite values" in err
    assert "nothing was written" in err
    assert not (tmp_path / "m.onnx").exists()


def test_parity_fails_when_onnxruntime_alone_gives_nan(trained_run, tmp_path, monkeypatch):
    optimize = onnx_export._optimize

    def nan_bias(proto: onnx.ModelProto, workdir: Path) -> onnx.ModelProto:
        proto = optimize(proto, workdir)
        for init in proto.graph.initializer:
            if init.name == "classifier.bias":
                init.CopyFrom(
                    numpy_helper.from_array(numpy_helper.to_array(init) * np.nan, init.name)
                )
        return proto

    monkeypatch.setattr(onnx_export, "_optimize", nan_bias)
    with pytest.raises(ParityError, match=r"logits: max relative difference nan > 0.0001"):
        export_checkpoint(trained_run / "best.pt", tmp_path / "m.onnx")


def test_cli_refuses_deepo2p_with_the_reason(tmp_path, capsys):
    config = ModelConfig(10, backbone="small_cnn", head="deepo2p", reduce_dim=8)
    path = save_checkpoint(tmp_path / "m.pt", build_model(config))
    assert export_main([str(path)]) == 2
    assert "eigen-decomposition" in capsys.readouterr().err


def assert_calibrated_on(reference: Typicality, path: Path, images: LabelledImages) -> None:
    """The reference's scores are those of ``images`` through the file at ``path``, so that
    their p-values are uniform: the image ranked r-th most atypical of n gets
    ``(1 + r) / (n + 1)`` (its own score counts), less one step where float32 storage rounds its
    score down; at a level a, about ``a (n + 1) - 1`` images lie at or below it."""
    batch = np.stack([images[i][0].numpy() for i in range(len(images))])
    logits, embedding, features = session(path).run(
        ["logits", "embedding", "features"], {"image": batch}
    )
    scores = reference.score(logits, embedding, features if reference.uses_features else None)
    n = len(scores)
    assert n == reference.images == len(reference.reference)
    spread = float(np.ptp(reference.reference))
    np.testing.assert_allclose(np.sort(scores), reference.reference, atol=1e-5 * spread)
    p_values = reference.p_value(scores)
    ranks = n - np.argsort(np.argsort(scores))  # 1 = the highest score
    steps = np.rint(p_values * (n + 1)).astype(int) - ranks
    assert set(steps.tolist()) <= {0, 1}  # 0 for about half: float32 rounds to nearest
    for level in (0.1, 0.25, 0.5, 0.75):
        assert abs(int((p_values <= level).sum()) - (level * (n + 1) - 1)) <= 1


def test_the_card_carries_a_typicality_reference_from_the_validation_split(
    exported, trained_run, tmp_path
):
    """50 validation images of a p = 4 embedding: the reference the service scores with, its
    p-values calibrated on those images; --no-typicality leaves it out."""
    section = card_of(exported)["typicality"]
    assert section["images"] == 50
    assert section["embedding_dim"] == P
    reference = Typicality.from_card(section)
    images = np.random.default_rng(1).random((3, 1, 28, 28), np.float32)
    logits, embedding, _ = session(exported).run(
        ["logits", "embedding", "features"], {"image": images}
    )
    assert reference.score(logits, embedding).shape == (3,)
    splits = load_with_splits(trained_run / "best.pt")[2]
    assert len(splits.val) == 50
    assert_calibrated_on(reference, exported, splits.val)
    assert (
        export_main(
            [str(trained_run / "best.pt"), "-o", str(tmp_path / "n.onnx"), "--no-typicality"]
        )
        == 0
    )
    assert card_of(tmp_path / "n.onnx")["typicality"] is None


def test_a_graph_score_off_numpys_is_left_out_and_the_file_scored_by_the_service(
    trained_run, tmp_path, monkeypatch, caplog
):
    """The exported graph's score must match numpy's: where it does not (here: a tolerance no
    float32 result meets), the file is written without the output, with its reference, and
    a warning says the service will compute the score."""
    import export.onnx_export as onnx_export

    monkeypatch.setattr(onnx_export, "SCORE_TOLERANCE", -1.0)
    result = export_checkpoint(trained_run / "best.pt", tmp_path / "s.onnx")
    assert "typicality" not in [o.name for o in onnx.load(result.path).graph.output]
    section = card_of(result.path)["typicality"]
    assert section["output"] is section["output_max_difference"] is None
    assert section["images"] == 50
    assert "typicality score left out of the graph" in caplog.text
