"""Checkpoint -> verified ONNX file with its model card inside.

:func:`export_checkpoint` runs the whole pipeline:

1. load the checkpoint (``training.checkpoint``) and wrap it for tracing (``export.graph``: the
   SMSO head folded, in its 1x1-conv + l2-pool form unless ``form="covariance"``, or in the form
   with the smaller modelled cost at the trained input size with ``form="auto"``);
2. trace with ``torch.onnx.export(dynamo=True)``: input ``image`` ``(N, C, H, W)`` float32 with a
   dynamic batch, and dynamic ``H, W`` where the model allows it (falling back to the trained size
   where it does not) unless ``dynamic_size=False``; outputs ``logits (N, K)``,
   ``embedding (N, p)`` and ``features (N, C_b)`` (the backbone's last map, averaged: for the
   typicality score). A fixed size leaves no shape arithmetic in the graph (with a dynamic
   size the head's ``n = h w`` is computed from the input's shape, in small operators that
   onnxruntime places on the CPU): every node then runs on CUDA, which CUDA graphs require;
3. simplify a float32 graph with onnxruntime's offline optimisation (the portable "basic"
   level: constant folding and redundant-node removal, no hardware-specific fused operators).
   ``fp16=True`` traces the backbone in float16 instead, the head and classifier in float32
   (inputs and outputs stay float32): BatchNorm is already folded into the convolutions by the
   exporter, and onnxruntime's offline pass is skipped, because it can only run here with the CPU
   provider, which has no float16 convolutions and would rewrite the graph to compute in float32;
4. check parity with PyTorch in onnxruntime at batch sizes 1, 3 and 8 on random images and, where
   the checkpoint's dataset is at hand, on real ones (``export.parity``);
5. where the checkpoint's validation split is at hand and the embedding is small enough, fit
   the typicality reference (``export.typicality``) on the exported graph's outputs for those
   images, into the card's ``typicality`` section (``typicality=False`` skips it);
6. write the model card (:class:`modelcard.card.ModelCard`) into the metadata, drop the stack
   traces torch.onnx records on each node (:func:`drop_stack_traces`), run ``onnx.checker`` with
   ``full_check``, and move the file into place: a failure at any step leaves no file behind (and
   an existing file at the destination untouched).

Exporting one checkpoint twice with the same ``SOURCE_DATE_EPOCH``, on one machine, gives the same
bytes wherever the repository lies. Another CPU's numerical kernels (numpy's BLAS, PyTorch's and
onnxruntime's) may round the typicality statistics and the parity differences differently.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import logging
import os
import platform
import tempfile
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torchvision

from export.card import check_served_name, file_sha256
from export.graph import (
    ExportForm,
    ExportModel,
    Precision,
    cheaper_form,
    exportable,
    form_costs,
)
from export.parity import ParityReport, check_parity
from export.typicality import reference_section
from export.typicality_graph import (
    OUTPUT,
    SCORE_TOLERANCE,
    append_score,
    score_parity,
    strip_score,
)
from modelcard import CARD_FORMAT, CARD_KEY, CARD_VERSION
from modelcard.card import (
    Checkpoint,
    ExportInfo,
    FormCosts,
    HeadFormChoice,
    InputSpec,
    Metrics,
    ModelCard,
    ModelInfo,
    Outputs,
    Preprocessing,
    Served,
    TypicalitySection,
    Versions,
)
from modelcard.typicality import Typicality
from training.backbones import backbone_spec
from training.checkpoint import check_finite, held_val_accuracy, load_model
from training.datasets.base import DatasetLayoutError, Splits
from training.heads.smso import SMSOPooling
from training.model import SecondOrderNet
from training.outputs import Replaceable, check_output_file, write_atomically

__all__ = [
    "DEFAULT_OPSET",
    "ExportError",
    "ExportResult",
    "FormChoice",
    "dataset_splits",
    "drop_stack_traces",
    "export_checkpoint",
    "real_images",
]

#: What ``form`` may ask for: one of the SMSO head's forms, or "auto" for the cheaper at the
#: trained input size (``export.graph.cheaper_form``).
FormChoice = Literal["conv", "covariance", "auto"]

log = logging.getLogger(__name__)

DEFAULT_OPSET = 18
MAX_SIDE = 4096  # upper bound of the dynamic H and W


class ExportError(RuntimeError):
    """The model could not be traced or written (not a parity failure: see ParityError)."""


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """Where the file went, its model card and the parity it passed."""

    path: Path
    card: ModelCard
    parity: ParityReport
    size_bytes: int


def exported_at() -> str:
    """When the file is written, ISO 8601 in UTC; ``SOURCE_DATE_EPOCH`` (the reproducible-builds
    convention) instead when set, so that exporting one checkpoint twice gives the same bytes
    (``make onnx`` sets it to the checkpoint's commit time)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch:
        try:
            when = datetime.datetime.fromtimestamp(int(epoch), datetime.UTC)
        except (ValueError, OverflowError, OSError):
            raise ValueError(
                f"SOURCE_DATE_EPOCH={epoch[:40]!r} is not a time in seconds since 1970"
            ) from None
    else:
        when = datetime.datetime.now(datetime.UTC)
    return when.isoformat(timespec="seconds")


def _input_geometry(model: SecondOrderNet, payload: dict[str, Any]) -> tuple[Literal[1, 3], int]:
    """(channels, side) the model was trained on: the preset's crop, else 224; ``ValueError``
    for images that are neither grey (1 channel) nor RGB (3), which no card describes."""
    spec = backbone_spec(model.config.backbone)
    channels = model.config.in_channels or spec.in_channels
    if channels not in (1, 3):
        raise ValueError(
            f"the model takes images of {channels} channels: a model card describes grey (1) "
            "or RGB (3) images only"
        )
    side = int(payload.get("preset", {}).get("image_size", 224))
    return (1 if channels == 1 else 3), side


def _head_form(
    model: SecondOrderNet, requested: FormChoice, side: int, stride: int
) -> tuple[ExportForm, HeadFormChoice | None]:
    """The form the SMSO head is traced in and, for the card, the choice: that form, the form
    asked for, and the modelled multiply-adds per image of both forms at the trained size, with
    ``n = (side // stride)^2`` positions. Other heads have one form: ``("conv", None)``."""
    head = model.head
    if not isinstance(head, SMSOPooling):
        return "conv", None
    positions = max(side // stride, 1) ** 2
    costs = form_costs(head.in_channels, head.dim, positions)
    form = cheaper_form(head.in_channels, head.dim, positions) if requested == "auto" else requested
    message = "SMSO head in the %s form (asked: %s); modelled multiply-adds per image at n = %d: %s"
    log.info(message, form, requested, positions, costs)
    choice = HeadFormChoice(
        form=form,
        requested=requested,
        positions=positions,
        multiply_adds=FormCosts(conv=costs["conv"], covariance=costs["covariance"]),
    )
    return form, choice


def _trace(
    module: ExportModel, example: torch.Tensor, opset: int, stride: int, dynamic_size: bool = True
) -> onnx.ModelProto:
    """Trace with a dynamic batch, and dynamic H, W unless the model needs its trained size or
    ``dynamic_size`` is off."""
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    # n = h * w >= 4 positions after the backbone's stride: a covariance needs n >= 2
    side_min = 2 * stride
    size = {
        2: torch.export.Dim("height", min=side_min, max=MAX_SIDE),
        3: torch.export.Dim("width", min=side_min, max=MAX_SIDE),
    }
    errors = []
    tries = ({0: batch, **size}, {0: batch}) if dynamic_size else ({0: batch},)
    for dynamic in tries:
        try:
            program = torch.onnx.export(
                module,
                (example,),
                input_names=["image"],
                output_names=["logits", "embedding", "features"],
                dynamic_shapes={"images": dynamic},
                dynamo=True,
                opset_version=opset,
                verbose=False,
            )
        except Exception as error:  # torch.export raises many types; report them together below
            errors.append(f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
            log.info("tracing with dynamic axes %s failed; trying fewer", sorted(dynamic))
            continue
        if program is None:
            raise ExportError("torch.onnx.export returned no program")
        written = graph_opset(program.model_proto)
        if written != opset:  # the exporter's version conversion failed and it kept its own
            raise ExportError(
                f"torch.onnx.export could not write opset {opset} (it wrote {written}): "
                f"give --opset {DEFAULT_OPSET} (the default) or another it converts to"
            )
        return program.model_proto
    raise ExportError("torch.onnx.export could not trace the model: " + " | ".join(errors))


@functools.cache
def newest_opset() -> int:
    """The newest opset both this onnx and this onnxruntime load (onnxruntime refuses opsets
    that onnx knows but has not released): each is tried on a one-node model, newest first."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the refusals are expected: keep the log quiet
    for opset in range(onnx.defs.onnx_opset_version(), DEFAULT_OPSET, -1):
        imports = [helper.make_opsetid("", opset)]
        model = helper.make_model(
            graph, opset_imports=imports, ir_version=helper.find_min_ir_version_for(imports)
        )
        try:
            ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
        except Exception:  # onnxruntime's Fail / InvalidGraph: not this opset
            continue
        return opset
    return DEFAULT_OPSET


def graph_opset(proto: onnx.ModelProto) -> int | None:
    """The version of the default (``ai.onnx``) operator set ``proto`` imports, if any."""
    versions = [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")]
    return max(versions) if versions else None


def is_onnx_model(path: Path) -> bool:
    """Whether ``path`` holds an ONNX model (a graph with at least one node), e.g. an earlier
    export that a new one may replace."""
    try:
        proto = onnx.load_model(path, load_external_data=False)
    except Exception:  # protobuf's DecodeError, OSError, ...: not a model
        return False
    return proto.ir_version > 0 and len(proto.graph.node) > 0


#: What the output may write over: an earlier export, never a checkpoint or a report.
EARLIER_EXPORT = Replaceable(
    is_onnx_model, "an ONNX model", "give another file name such as model.onnx"
)


def _optimize(proto: onnx.ModelProto, workdir: Path) -> onnx.ModelProto:
    """onnxruntime's offline graph optimisation at the portable "basic" level."""
    source, target = workdir / "traced.onnx", workdir / "optimized.onnx"
    onnx.save(proto, source)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(target)
    options.log_severity_level = 3
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return onnx.load(target)


#: The key under which torch.onnx records, on each node, the Python stack that made it: absolute
#: paths of the repository's and the virtual environment's files, with line numbers. Kept, it
#: made the file's bytes depend on where the repository lies and on edits that move a line of
#: export/graph.py or training/; nothing reads it.
STACK_TRACE = "pkg.torch.onnx.stack_trace"


def drop_stack_traces(proto: onnx.ModelProto) -> None:
    """Remove each node's :data:`STACK_TRACE` entry, in place (its other metadata stays)."""
    for node in proto.graph.node:
        kept = [entry for entry in node.metadata_props if entry.key != STACK_TRACE]
        if len(kept) < len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(kept)


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


DATA_ERRORS = (OSError, ValueError, RuntimeError, KeyError)


def dataset_splits(checkpoint: Path, data_root: str | None) -> tuple[Splits | None, str]:
    """The checkpoint's dataset, split and transformed as in evaluation, loaded once for the
    parity check and the typicality reference; ``(None, why not)`` when it is not at hand."""
    from training.evaluate import load_with_splits

    try:
        return load_with_splits(checkpoint, data_root)[2], ""
    except DATA_ERRORS as error:
        return None, str(error)


def real_images(splits: Splits, count: int = 8) -> np.ndarray | None:
    """The first ``count`` test images, ``(count, C, H, W)`` float32; None when they cannot be
    read."""
    try:
        images = [splits.test[i][0] for i in range(min(count, len(splits.test)))]
    except DATA_ERRORS as error:
        log.warning("parity on real images skipped: %s", error)
        return None
    return torch.stack(images).numpy().astype(np.float32) if images else None


def _versions() -> Versions:
    from importlib.metadata import PackageNotFoundError, version

    try:
        smso = version("smso")
    except PackageNotFoundError:
        smso = "unknown"
    return Versions(
        torch=torch.__version__,
        torchvision=torchvision.__version__,
        onnx=onnx.__version__,
        onnxruntime=ort.__version__,
        python=platform.python_version(),
        smso=smso,
    )


def _metrics(checkpoint: Path, payload: dict[str, Any]) -> Metrics:
    """Validation accuracy of what the checkpoint holds (after Sigma's re-estimation, when it
    was kept); test accuracy from its ``test.json``, if any."""
    epoch, val_accuracy = payload.get("epoch"), held_val_accuracy(payload)
    tested: dict[str, Any] = {"test_accuracy": None, "test_images": None}
    report_path = checkpoint.parent / "test.json"
    if report_path.is_file():
        from training.json_lines import read_json_record

        try:
            report = read_json_record(report_path)
        except ValueError as error:  # not JSON, not an object, not text
            raise ValueError(
                f"the test report beside the checkpoint is not smso-train's: {error}; remove "
                "or repair it (the model card takes the test accuracy from it)"
            ) from None
        # the report is about this checkpoint: its epoch, and its Sigma (smso-recalibrate after
        # the test changes it)
        if report.get("epoch") == payload.get("epoch") and report.get(
            "recalibration"
        ) == payload.get("recalibration"):
            tested = {key: report.get(key) for key in tested}
    return Metrics(epoch=epoch, val_accuracy=val_accuracy, **tested)


def export_checkpoint(
    checkpoint: str | os.PathLike[str],
    output: str | os.PathLike[str],
    form: FormChoice = "conv",
    opset: int = DEFAULT_OPSET,
    fp16: bool = False,
    optimize: bool = True,
    data_root: str | None = None,
    batch_sizes: tuple[int, ...] = (1, 3, 8),
    name: str | None = None,
    version: str | None = None,
    dynamic_size: bool = True,
    typicality: bool = True,
) -> ExportResult:
    """Export ``checkpoint`` to ``output`` (see the module docstring); returns the result.

    ``name`` and ``version`` are what a server serves the model under (the card's ``served``;
    default ``<dataset>-<backbone>-<head>`` and the checkpoint's sha256[:12]).

    Raises ``ValueError`` (a name or version that is not one URL path segment),
    ``OutputError`` (an output that is another kind of file, or in a folder this user cannot
    write to), ``CheckpointError`` (bad checkpoint, NaN weights, fewer class names than
    outputs), ``DatasetLayoutError`` (a ``data_root`` without the checkpoint's dataset: one
    that is not given may be missing, and is then only warned about), ``UnsupportedHeadError``
    (head ONNX cannot express), :class:`ExportError` (tracing failed) or ``ParityError`` (wrong
    numbers). All but the last two come before any tracing.
    """
    for value, what in ((name, "the served name"), (version, "the served version")):
        if value is not None:
            check_served_name(value, what)
    checkpoint, output = Path(checkpoint), Path(output)
    if output.is_dir():
        raise ValueError(f"the output {output} is a folder: give a file name such as model.onnx")
    if output.exists() and checkpoint.exists() and output.samefile(checkpoint):
        raise ValueError(
            f"the output {output} is the checkpoint being exported, which it would replace: "
            "give another file name such as model.onnx"
        )
    check_output_file(output, "the output", replaces=EARLIER_EXPORT)
    model, payload = load_model(checkpoint)
    check_finite(model, checkpoint)  # NaN weights: nothing correct to export
    metrics = _metrics(checkpoint, payload)  # a broken test.json fails here, before tracing
    source = Checkpoint(file=checkpoint.name, sha256=file_sha256(checkpoint))
    dataset = str(payload.get("train_config", {}).get("dataset", "unknown"))
    served = Served(
        name=name or f"{dataset}-{model.config.backbone}-{model.config.head}",
        version=version or source.sha256[:12],
    )
    # the dataset for the parity check on real images and the typicality reference: one that
    # --data-root names must be there, one the checkpoint names may be on another machine
    splits, unavailable = dataset_splits(checkpoint, data_root)
    if splits is None and data_root is not None:
        without = "(no parity check on real images, no typicality reference)"
        if "train_config" not in payload:
            raise ValueError(
                f"--data-root {data_root} cannot be used: {checkpoint} has no training config "
                f"(it was not written by smso-train), so no dataset to read; leave --data-root "
                f"out to export without one {without}"
            )
        raise DatasetLayoutError(
            f"--data-root {data_root} does not hold the dataset the checkpoint was trained on "
            f"({payload['train_config'].get('dataset')}): {unavailable}; give that dataset's "
            f"folder, or leave --data-root out to export without it {without}"
        )
    channels, side = _input_geometry(model, payload)
    if "preset" not in payload:
        log.warning(
            "%s has no preprocessing preset (it was not written by smso-train): the model card "
            "assumes %d x %d px crops of images scaled to [0, 1], not normalised (mean 0, std 1); "
            "save the checkpoint with its preset (training.checkpoint.save_checkpoint(..., "
            "preset=))",
            checkpoint,
            side,
            side,
        )
    stride = backbone_spec(model.config.backbone).stride
    traced_form, form_choice = _head_form(model, form, side, stride)
    precision: Precision = "float16" if fp16 else "float32"
    module = exportable(model, traced_form)  # the float32 reference parity compares with
    traced = exportable(model, traced_form, precision) if fp16 else module
    example = torch.randn(2, channels, side, side)
    proto = _trace(traced, example, opset, stride, dynamic_size)
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    dynamic_size = bool(dims[2].dim_param) and bool(dims[3].dim_param)

    with tempfile.TemporaryDirectory(prefix="smso-export-") as tmp:
        optimized = optimize and not fp16
        if optimized:
            proto = _optimize(proto, Path(tmp))
        elif optimize:
            log.info(
                "float16: onnxruntime's offline optimisation skipped (its CPU provider would "
                "rewrite the float16 convolutions to compute in float32); onnxruntime still "
                "optimises the graph for the serving device when a session loads it"
            )
        inputs = {
            "random": torch.randn(
                8, channels, side, side, generator=torch.Generator().manual_seed(0)
            ).numpy()
        }
        if splits is None:
            log.warning("parity on real images skipped: %s", unavailable)
        real = None if splits is None else real_images(splits)
        if real is not None:
            inputs["real"] = real
        session = _session(proto)  # the file as written, on the CPU: parity, then typicality
        parity = check_parity(session, module, inputs, batch_sizes, precision)
        why_not: str | None
        if not typicality:
            section, why_not = None, "not asked for (--no-typicality)"
        elif splits is None:
            section, why_not = None, f"no validation images at hand ({unavailable})"
        else:
            section, why_not = reference_section(session, splits, model.embedding_dim)
        reference = None
        if section is not None:
            reference = _score_in_graph(proto, section, [*inputs.values()])
            log.info(
                "typicality reference from %d validation images; %s",
                reference.images,
                f"the file computes the score (output {reference.output!r})"
                if reference.output
                else "the service computes the score",
            )
        else:
            log.warning("no typicality reference: %s", why_not)
        card = ModelCard(
            format=CARD_FORMAT,
            version=CARD_VERSION,
            classes=list(payload.get("classes") or _numbered(model.config.num_classes)),
            input=InputSpec(channels=channels, height=side, width=side, dynamic_size=dynamic_size),
            preprocessing=_preprocessing(payload, channels, side),
            model=_model_info(model, form_choice),
            outputs=Outputs(
                logits=("N", model.config.num_classes),
                embedding=("N", model.embedding_dim),
                features=("N", model.backbone.out_channels),
            ),
            dataset=dataset,
            served=served,
            metrics=metrics,
            checkpoint=source,
            export=ExportInfo(
                opset=opset, precision=precision, optimized=optimized, exported_at=exported_at()
            ),
            parity=parity,
            versions=_versions(),
            typicality=reference,
        )
        del proto.metadata_props[:]
        proto.metadata_props.add(key=CARD_KEY, value=card.to_json())
        proto.producer_name = "smso-export"
        proto.doc_string = (
            f"SMSO model card in metadata_props[{CARD_KEY!r}]: {model.config.backbone} + "
            f"{model.config.head} on {card.dataset}"
        )
        drop_stack_traces(proto)
        onnx.checker.check_model(proto, full_check=True)
        output.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(output, lambda file: onnx.save(proto, file))
    return ExportResult(output, card, parity, output.stat().st_size)


def _score_in_graph(
    proto: onnx.ModelProto, section: dict[str, Any], inputs: list[np.ndarray]
) -> TypicalitySection:
    """Append the typicality score to ``proto`` (``export.typicality_graph``), checked against
    numpy's on ``inputs``; the card's section, saying which output holds it and how close it
    came. A graph whose score differs by more than ``SCORE_TOLERANCE`` is left without it
    (warned): the service computes the score from the other outputs instead."""
    typicality = Typicality.from_card(section)  # the numbers as stored: what the service reads
    append_score(proto, typicality)
    session = _session(proto)
    difference = max(score_parity(session, typicality, images) for images in inputs)
    if difference <= SCORE_TOLERANCE:
        scored = {"output": OUTPUT, "output_max_difference": difference}
        return TypicalitySection.model_validate(section | scored)
    strip_score(proto)  # the service then scores the file in numpy, as older files
    log.warning(
        "typicality score left out of the graph: it differs from numpy's by %.2g of the "
        "reference scores' spread (at most %g); the service will compute it",
        difference,
        SCORE_TOLERANCE,
    )
    return TypicalitySection.model_validate(
        section | {"output": None, "output_max_difference": None}
    )


def _numbered(classes: int) -> list[str]:
    """Class names for a checkpoint that has none: ``"0"`` to ``str(classes - 1)``."""
    return [str(k) for k in range(classes)]


def _preprocessing(payload: dict[str, Any], channels: int, side: int) -> Preprocessing:
    """The training preset's evaluation transform; without a preset, ``side`` px crops of images
    scaled to [0, 1]. Images of any size are resized first: a preset without a resize (small
    images already at the input size) resizes the shorter side to the crop."""
    preset = payload.get("preset", {})
    return Preprocessing(
        colour="L" if channels == 1 else "RGB",
        resize=preset.get("resize") or side,
        crop=side,
        mean=[float(m) for m in preset.get("mean", [0.0] * channels)],
        std=[float(s) for s in preset.get("std", [1.0] * channels)],
    )


def _model_info(model: SecondOrderNet, form_choice: HeadFormChoice | None) -> ModelInfo:
    config = model.config
    return ModelInfo(
        backbone=config.backbone,
        head=config.head,
        head_options=dict(config.head_options),
        reduce_dim=config.reduce_dim,
        embedding_dim=model.embedding_dim,
        form=None if form_choice is None else form_choice.form,
        form_choice=form_choice,
    )
