"""The model card: one typed document, written by ``smso-export``, read by the service and
``smso-embed``.

The card is JSON in the ONNX file's ``metadata_props`` under :data:`modelcard.CARD_KEY`.
:class:`ModelCard` is its only definition: export builds one and writes :meth:`ModelCard.to_json`;
the readers call :meth:`ModelCard.from_json`, which bounds the text before parsing it, brings an
older card to the current shape (:func:`modelcard.migration.migrate`) and validates it strictly:
no field of another type, none missing, none unknown, no NaN or infinity, and a side of at most
:data:`MAX_SIDE` pixels. A card that fails is a :class:`CardError` of one line naming the field
(``preprocessing.std.0: Input should be greater than 0``).

The field descriptions below are the reference (``docs/model-card.md``; the JSON Schema,
``docs/model-card.schema.json``, is :meth:`ModelCard.model_json_schema`). pydantic only: the
serving environment has neither torch nor onnx.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    Strict,
    StrictFloat,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from modelcard import CARD_FORMAT, CARD_VERSION
from modelcard.migration import migrate
from modelcard.nesting import MAX_DEPTH, nesting_depth

__all__ = [
    "MAX_DEPTH",
    "MAX_SIDE",
    "SCALE",
    "SERVED_NAME",
    "CardError",
    "Checkpoint",
    "EncodedArray",
    "ExportInfo",
    "FeatureReference",
    "FormCosts",
    "HeadFormChoice",
    "InputSpec",
    "Metrics",
    "ModelCard",
    "ModelInfo",
    "Outputs",
    "ParityReport",
    "PrecisionMatrix",
    "Preprocessing",
    "Served",
    "TypicalitySection",
    "Versions",
    "nesting_depth",
]

#: The largest side a card may give its input, resize or crop: four times the largest of the
#: paper's models (448 px), and a batch of 16 such images still under 4 GB of float32.
MAX_SIDE = 4096
#: What each 8-bit pixel value is multiplied by before normalisation: ``v / 255``.
SCALE = 1 / 255
#: A served name or version: one URL path segment without escaping (KServe's and Triton's
#: clients put both in ``/v2/models/{name}/versions/{version}``), and not ``.`` or ``..``.
SERVED_NAME = r"^[A-Za-z0-9_.-]{1,128}$"


class CardError(ValueError):
    """The model file has no usable model card (one line, naming the field)."""


class _Section(BaseModel):
    # strict: JSON's types as they are (no "1" for 1); NaN and infinities, which Python's json
    # reads, are no mean, std, size or accuracy
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid", allow_inf_nan=False)


Side = Annotated[int, Field(ge=1, le=MAX_SIDE)]
Count = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(ge=0, le=1)]
#: An output's shape, ``["N", values per image]`` (a JSON array read as a pair).
OutputShape = Annotated[
    tuple[Literal["N"], Annotated[int, Strict(), Field(ge=1)]], Field(strict=False)
]
#: Two numbers, a JSON array read as a pair.
Pair = Annotated[tuple[StrictFloat, StrictFloat], Field(strict=False)]
HeadForm = Literal["conv", "covariance"]
ExportPrecision = Literal["float32", "float16"]


def _not_bool(value: object) -> object:
    """JSON's true and false are no number (Python's ``True == 1`` would match ``Literal[1]``)."""
    if isinstance(value, bool):
        raise PydanticCustomError(
            "literal_error",
            "Input should be a number, not {value}",
            {"value": "true" if value else "false"},
        )
    return value


def _one_segment(value: str) -> str:
    if value in (".", ".."):
        raise PydanticCustomError("path_segment", "'.' and '..' are no URL path segment")
    return value


ServedName = Annotated[str, Field(pattern=SERVED_NAME), AfterValidator(_one_segment)]


class InputSpec(_Section):
    """The graph's input ``image``: ``(N, channels, height, width)`` float32, NCHW."""

    name: Literal["image"] = "image"
    layout: Literal["NCHW"] = "NCHW"
    dtype: Literal["float32"] = "float32"
    channels: Annotated[Literal[1, 3], BeforeValidator(_not_bool)]
    height: Side = Field(description="the trained input height in pixels")
    width: Side = Field(description="the trained input width in pixels")
    dynamic_size: bool = Field(description="whether the graph takes other heights and widths")


class Preprocessing(_Section):
    """What turns a decoded image into the input: to ``colour``, the shorter side resized to
    ``resize`` (bilinear, antialiased), a centre crop of ``crop`` x ``crop``, then per channel
    ``x = (v * scale - mean) / std`` for 8-bit values ``v``."""

    colour: Literal["L", "RGB"]
    resize: Side | None = Field(description="the shorter side's length; null: the crop's")
    crop: Side
    scale: float = Field(SCALE, gt=0, description="1/255: 8-bit values to [0, 1]")
    mean: list[float] = Field(description="per channel")
    std: list[Annotated[float, Field(gt=0)]] = Field(description="per channel")

    @property
    def largest_value(self) -> float:
        """The largest ``|x|`` a preprocessed image can hold: pixels in [0, 1] become
        ``(x - mean) / std``, so ``max over channels of max(|0 - m|, |1 - m|) / s``."""
        return max(
            max(abs(m), abs(1 - m)) / abs(s) for m, s in zip(self.mean, self.std, strict=False)
        )


class Outputs(_Section):
    """The graph's outputs and their shapes."""

    logits: OutputShape = Field(description="(N, K): one per class, in the order of classes")
    embedding: OutputShape = Field(description="(N, p): the head's output")
    features: OutputShape | None = Field(
        description="(N, C_b): the backbone's last map, averaged (the typicality score's "
        "fourth term); null: the file has no such output"
    )


class FormCosts(_Section):
    """Modelled multiply-adds per image of each form of the SMSO head."""

    conv: int = Field(ge=0)
    covariance: int = Field(ge=0)


class HeadFormChoice(_Section):
    """How the SMSO head's form in the graph was chosen."""

    form: HeadForm = Field(description="the form traced")
    requested: Literal["conv", "covariance", "auto"] = Field(description="smso-export --form")
    positions: Count = Field(description="n = h w of the backbone's last map at the input size")
    multiply_adds: FormCosts


class ModelInfo(_Section):
    """What the network is."""

    backbone: str
    head: str
    head_options: dict[str, JsonValue] = Field(description="the head's options, e.g. {dim: 64}")
    reduce_dim: int | None = Field(description="the 1x1 reduction before the head; null: none")
    embedding_dim: Count = Field(description="p, the embedding's size")
    form: HeadForm | None = Field(description="the SMSO head's form; null for other heads")
    form_choice: HeadFormChoice | None = Field(description="SMSO only; null for other heads")


class Served(_Section):
    """What a server serves the model under (``/v2/models/{name}/versions/{version}``)."""

    name: ServedName = Field(description="smso-export --name; <dataset>-<backbone>-<head>")
    version: ServedName = Field(description="smso-export --version; the checkpoint's sha256[:12]")


class Metrics(_Section):
    """How well the checkpoint does; null where it was not measured."""

    epoch: int | None = Field(ge=0)
    val_accuracy: Fraction | None
    test_accuracy: Fraction | None
    test_images: int | None = Field(ge=0)


class Checkpoint(_Section):
    """The checkpoint the file was exported from."""

    file: str | None = Field(description="its file name; null: not recorded")
    sha256: str = Field(pattern=r"^[0-9a-f]{1,64}$")


class ExportInfo(_Section):
    """How the file was written."""

    opset: Count = Field(description="the default ONNX operator set's version")
    precision: ExportPrecision = Field(
        description="float16: the backbone in float16, the head and classifier in float32"
    )
    optimized: bool = Field(description="whether onnxruntime's offline optimisation ran")
    exported_at: str = Field(description="ISO 8601, UTC (SOURCE_DATE_EPOCH where set)")


class ParityReport(_Section):
    """The file against PyTorch at export (``export.parity``): the worst relative difference
    ``max |onnx - torch| / max |torch|`` per output over every batch size and input set."""

    precision: ExportPrecision
    tolerance: float = Field(gt=0)
    batch_sizes: list[Count]
    inputs: list[str] = Field(description="the input sets, e.g. random, real")
    max_relative_difference: dict[str, float] = Field(description="per output")
    top1_agreement: Fraction = Field(description="images whose top-1 class agrees")
    top1_mismatches_allowed: int = Field(ge=0, description="float16: near-ties that may flip")
    images: int = Field(ge=0)
    passed: bool


class Versions(_Section):
    """The software that wrote the file."""

    torch: str
    torchvision: str
    onnx: str
    onnxruntime: str
    python: str
    smso: str


class EncodedArray(_Section):
    """An array: little-endian float32, base64-encoded (``modelcard.typicality``)."""

    shape: list[Annotated[int, Field(ge=0)]]
    float32_base64: str


class PrecisionMatrix(_Section):
    """``P = alpha I + U diag(w) U^T``, ``U`` (d, r) orthonormal."""

    alpha: float
    basis: EncodedArray = Field(description="U, (d, r)")
    weights: EncodedArray = Field(description="w, (r,)")


class FeatureReference(_Section):
    """The class-conditional term on the backbone's averaged features."""

    class_means: EncodedArray = Field(description="(K', C_b)")
    within: PrecisionMatrix = Field(description="the shared within-class precision")


class TypicalitySection(_Section):
    """The reference statistics of the typicality score and p-value (``modelcard.typicality``),
    fitted on the validation split at export."""

    format: int = Field(ge=1, description="the section's format; another is served without it")
    score: str = Field(description="what the score adds up")
    images: Count = Field(description="validation images the statistics come from")
    embedding_dim: Count
    mean: EncodedArray = Field(description="mu, (p,)")
    precision: PrecisionMatrix = Field(description="P, of all validation images")
    class_means: EncodedArray = Field(description="mu_c, (K', p)")
    within: PrecisionMatrix = Field(description="P_w, the shared within-class precision")
    standardise: list[Pair] = Field(
        description="(a, b) of each term: its mean and standard deviation"
    )
    reference: EncodedArray = Field(description="the validation images' scores, (n,)")
    features: FeatureReference | None = Field(description="null: three terms, no features")
    output: str | None = Field(description="the graph output computing the score; null: none")
    output_max_difference: float | None = Field(
        ge=0, description="that output against numpy's score, in reference standard deviations"
    )


class ModelCard(_Section):
    """Everything a server needs to use an exported file, and how it was made."""

    format: Literal["smso-model-card"] = Field(description=f"always {CARD_FORMAT!r}")
    version: Annotated[Literal[1], BeforeValidator(_not_bool)] = Field(
        description=f"the card's version: {CARD_VERSION}"
    )
    classes: list[str] = Field(min_length=1, description="class names in label order")
    input: InputSpec
    preprocessing: Preprocessing
    model: ModelInfo
    outputs: Outputs
    dataset: str = Field(description="the training dataset's name")
    served: Served
    metrics: Metrics | None
    checkpoint: Checkpoint | None
    export: ExportInfo | None
    parity: ParityReport | None
    versions: Versions | None
    typicality: TypicalitySection | None = Field(
        description="null: no reference, no typicality scores"
    )

    @model_validator(mode="after")
    def _consistent(self) -> ModelCard:
        channels = self.input.channels
        if len(self.preprocessing.mean) != channels or len(self.preprocessing.std) != channels:
            raise PydanticCustomError(
                "channels",
                "preprocessing.mean and preprocessing.std must have {channels} values "
                "(input.channels)",
                {"channels": channels},
            )
        for name, want in (("logits", len(self.classes)), ("embedding", self.model.embedding_dim)):
            if getattr(self.outputs, name)[1] != want:
                raise PydanticCustomError(
                    "outputs",
                    "outputs.{name} has {got} values per image, the card {want}",
                    {"name": name, "got": getattr(self.outputs, name)[1], "want": want},
                )
        return self

    @property
    def name(self) -> str:
        """The name the model is served under, e.g. ``fashion_mnist-small_cnn-smso``."""
        return self.served.name

    @property
    def model_version(self) -> str:
        """The version it is served under (by default the checkpoint's sha256[:12])."""
        return self.served.version

    def to_json(self) -> str:
        """The card as compact JSON, its keys in the order of the fields: what export writes."""
        return self.model_dump_json()

    def sha256(self) -> str:
        """sha256 of the card as canonical JSON (sorted keys, no spaces): the same card, the
        same checksum, however the file's metadata spaced it. What smso-embed's rows and a
        gallery's stamp record, and what the service compares them with."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> ModelCard:
        """The card in ``text`` (an ONNX file's metadata value), of any version-1 shape;
        :class:`CardError` with one line naming what is wrong otherwise."""
        if nesting_depth(text) > MAX_DEPTH:
            raise CardError(
                f"the model card is malformed: it nests lists and objects more than {MAX_DEPTH} "
                "levels deep"
            )
        try:
            raw = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as error:
            raise CardError(f"the model card is malformed: not JSON ({error})") from None
        if not isinstance(raw, dict):
            raise CardError("the model card is malformed: not a JSON object")
        try:
            current = migrate(raw)
        except ValueError as error:
            raise CardError(str(error)) from None
        try:
            return cls.model_validate(current)
        except ValidationError as error:
            raise CardError(f"the model card is malformed: {_one_line(error)}") from None


def _one_line(error: ValidationError) -> str:
    """Each refused field of the card by its place (``preprocessing.std.0``) and why; a check
    across sections (the channels) by its message alone."""
    parts = []
    for item in error.errors(include_url=False):
        place = ".".join(str(part) for part in item["loc"])
        parts.append(f"{place}: {item['msg']}" if place else item["msg"])
    return "; ".join(parts)
