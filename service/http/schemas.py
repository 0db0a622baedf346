"""Response models of the API (they also give the OpenAPI docs their schemas and examples)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ERROR_RESPONSES",
    "SEARCH_ERRORS",
    "ClassifyResponse",
    "EmbedResponse",
    "EmbeddingsResponse",
    "ErrorResponse",
    "OipError",
    "OipIndexEntry",
    "OipModelReady",
    "OipReady",
    "OpenAIErrorResponse",
    "SearchResponse",
    "Status",
    "oip_errors",
    "openai_errors",
]


class ModelRef(BaseModel):
    name: str = Field(examples=["fashion_mnist-small_cnn-smso"])
    version: str = Field(examples=["491ff837d0bc"], description="checkpoint sha256, 12 digits")


class Prediction(BaseModel):
    label: str = Field(examples=["Ankle boot"])
    index: int = Field(examples=[9])
    score: float = Field(examples=[0.97], description="softmax probability")


class Typicality(BaseModel):
    score: float = Field(
        examples=[-1.2],
        description="how atypical the image is of the model's reference (validation) images: "
        "the sum of three standardised terms (class-conditional and overall Mahalanobis "
        "distance of the embedding, energy of the logits); higher is less typical",
    )
    p_value: float = Field(
        examples=[0.42],
        description="the share of reference images at least as atypical: about 1 % of "
        "in-distribution images fall below 0.01",
    )


TYPICALITY = (
    "where the model's card has a typicality reference (smso-export fits it on the validation "
    "split) and SMSO_TYPICALITY is on"
)


class ClassifyResult(BaseModel):
    filename: str = Field(examples=["boot.png"])
    predictions: list[Prediction]
    typicality: Typicality | None = Field(None, description=TYPICALITY)


class ClassifyResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    model: ModelRef
    results: list[ClassifyResult]


class EmbedResult(BaseModel):
    filename: str = Field(examples=["boot.png"])
    embedding: list[float] | str = Field(
        examples=[[0.12, -1.3, 0.57]],
        description="the p values: a list of numbers, or with encoding=base64 one string, the "
        "base64 of the values as little-endian float32 (or float16 with dtype=float16)",
    )
    typicality: Typicality | None = Field(None, description=TYPICALITY)


class EmbedResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    model: ModelRef
    dim: int = Field(examples=[64], description="p, the embedding's size")
    results: list[EmbedResult]


class Neighbour(BaseModel):
    path: str = Field(
        examples=["/data/shoes/boot-0042.png"], description="the image, as smso-embed named it"
    )
    similarity: float = Field(
        examples=[0.93],
        description="the cosine of the standardised embeddings (of their bits, for a b1 "
        "gallery), in [-1, 1]; 1: the same embedding",
    )
    label: str = Field(examples=["Ankle boot"], description="its top-1 class when embedded")


class SearchResult(BaseModel):
    filename: str | None = Field(
        examples=["boot.png"], description="the image's name; null for an embedding sent as JSON"
    )
    prediction: Prediction | None = Field(
        description="the image's own top-1 class, as /classify answers it; null for an "
        "embedding sent as JSON"
    )
    neighbours: list[Neighbour] = Field(description="the nearest gallery items, best first")
    typicality: Typicality | None = Field(None, description=TYPICALITY)


class GalleryRef(BaseModel):
    generation: str = Field(examples=["3f2a9c81d0e4"], description="the build (smso-index)")
    items: int = Field(examples=[60000])
    dtype: str = Field(examples=["f32"], description="the stored codes: f32, f16, i8 or b1")


class SearchResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    model: ModelRef
    gallery: GalleryRef = Field(description="the gallery that answered")
    results: list[SearchResult]


class EmbeddingData(BaseModel):
    object: Literal["embedding"]
    index: int = Field(examples=[0], description="the input's place in the request")
    embedding: list[float] | str = Field(
        examples=[[0.12, -1.3, 0.57]],
        description="what /embed answers for the image: the p values, or with "
        "encoding_format=base64 the base64 of the values as little-endian float32",
    )


class Usage(BaseModel):
    prompt_tokens: int = Field(examples=[0], description="always 0: images, not tokens")
    total_tokens: int = Field(examples=[0])


class EmbeddingsResponse(BaseModel):
    """OpenAI's embeddings answer."""

    model_config = ConfigDict(protected_namespaces=())
    object: Literal["list"]
    data: list[EmbeddingData]
    model: str = Field(examples=["fashion_mnist-small_cnn-smso"], description="the model's name")
    usage: Usage


class Status(BaseModel):
    status: str = Field(examples=["ready"])


class ErrorDetail(BaseModel):
    code: str = Field(examples=["invalid_image"])
    message: str = Field(examples=["boot.png: not a recognised image format"])


class ErrorResponse(BaseModel):
    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in {
        400: "undecodable, truncated or empty image",
        401: "missing or wrong API key",
        404: "the model (or version) is not served here, or no model is the default",
        413: "upload or image over the limits",
        415: "a declared content type that is not an image",
        422: "missing or unknown file part, or a bad or unknown query parameter",
        503: "overloaded (Retry-After), the model loading (Retry-After) or failed",
        504: "deadline passed",
    }.items()
}


#: What /search adds to the errors of every image route.
SEARCH_ERRORS: dict[int | str, dict[str, Any]] = ERROR_RESPONSES | {
    400: {
        "model": ErrorResponse,
        "description": "undecodable image, a JSON body that does not parse or match, or an "
        "embedding of another size than the gallery's",
    },
    404: {
        "model": ErrorResponse,
        "description": "the model (or version) is not served here, or no gallery is loaded "
        "beside it (no_gallery: the message says why and how to give one)",
    },
}


class OpenAIErrorDetail(ErrorDetail):
    type: str = Field(
        examples=["invalid_request_error"],
        description="OpenAI's kind: invalid_request_error, authentication_error or server_error",
    )
    param: str | None = Field(None, description="always null")


class OpenAIErrorResponse(BaseModel):
    """An error under ``/v1``: the service's ``{"error": {"code", "message"}}`` with OpenAI's
    ``type`` and ``param`` beside them."""

    error: OpenAIErrorDetail


#: What each status means under ``/v1`` (the body is always :class:`OpenAIErrorResponse`).
OPENAI_STATUSES = {
    400: "a JSON body that does not parse or match, an input that is not a base64 image, "
    "an undecodable image, or dimensions other than the model's",
    401: "missing or wrong API key",
    404: "the model is not served here",
    413: "the request, an image or the number of inputs is over the limits",
    415: "a content type that is not JSON, or an input whose media type is not an image",
    422: "an unknown query parameter",
    503: "overloaded (Retry-After), the model loading (Retry-After) or failed",
    504: "deadline passed",
}


def openai_errors() -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a ``/v1`` route."""
    return {
        code: {"model": OpenAIErrorResponse, "description": text}
        for code, text in OPENAI_STATUSES.items()
    }


class OipError(BaseModel):
    """An error under ``/v2``, as the Open Inference Protocol writes it."""

    error: str = Field(examples=["model 'x' is not served here"])


class OipReady(BaseModel):
    ready: bool


class OipIndexEntry(BaseModel):
    """A model in the repository index (Triton's model repository extension)."""

    name: str = Field(examples=["fashion_mnist"])
    version: str = Field(examples=["2"])
    state: str = Field(examples=["READY"], description="READY, LOADING or UNAVAILABLE")
    reason: str = Field("", description="why the model is unavailable")
    gallery: dict[str, Any] | None = Field(
        None, description="a served model's gallery, as /metadata describes it (HTTP only)"
    )
    gallery_refused: str | None = Field(None, description="why its gallery was refused")


class OipModelReady(BaseModel):
    name: str = Field(examples=["fashion_mnist-small_cnn-smso"])
    ready: bool


#: What each status means under ``/v2`` (the body is always :class:`OipError`).
OIP_STATUSES = {
    400: "a malformed request, or inputs the model does not take",
    401: "missing or wrong API key",
    404: "the model (or version) is not served here",
    413: "the request, a tensor or an image is over the limits",
    415: "an unsupported Content-Type or Content-Encoding",
    422: "a malformed header or parameter",
    503: "overloaded (Retry-After), not ready (Retry-After) or failed",
    504: "deadline passed",
}


def oip_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a ``/v2`` route that can answer ``statuses``."""
    return {code: {"model": OipError, "description": OIP_STATUSES[code]} for code in statuses}
