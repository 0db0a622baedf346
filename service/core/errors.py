"""The service's errors, whatever door a request came in by.

:class:`ServiceError` carries a status, a stable machine-readable code and a message for people.
Its :attr:`~ServiceError.canonical` code is the protocol-neutral kind of failure (gRPC's canonical
codes, which KServe's and Triton's servers use for the same mapping): each door renders from it
(:mod:`service.http.errors` as JSON with the HTTP status, :mod:`service.grpc.server` as a gRPC
status). :class:`BackendUnavailableError` is the backend's own failure, never the request's.
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "CLIENT_CLOSED",
    "BackendUnavailableError",
    "Canonical",
    "ServiceError",
    "canonical",
    "error_body",
    "too_large",
]

#: The status a request is counted with when its client left before it was read (no client
#: sees it: there is nobody to send it to).
CLIENT_CLOSED = 499


class Canonical(Enum):
    """The kind of a failure, whatever the transport: gRPC's canonical codes by name."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    NOT_FOUND = "NOT_FOUND"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    CANCELLED = "CANCELLED"
    INTERNAL = "INTERNAL"
    UNKNOWN = "UNKNOWN"


#: Each HTTP status the service answers with, as its canonical code (the Open Inference
#: Protocol's mapping: a request the server could not take, 413 included, is INVALID_ARGUMENT;
#: 503 is UNAVAILABLE except ``overloaded``, which is RESOURCE_EXHAUSTED: retry later).
_CANONICAL = {
    400: Canonical.INVALID_ARGUMENT,
    401: Canonical.UNAUTHENTICATED,
    404: Canonical.NOT_FOUND,
    413: Canonical.INVALID_ARGUMENT,
    415: Canonical.INVALID_ARGUMENT,
    422: Canonical.INVALID_ARGUMENT,
    499: Canonical.CANCELLED,
    500: Canonical.INTERNAL,
    501: Canonical.UNIMPLEMENTED,
    503: Canonical.UNAVAILABLE,
    504: Canonical.DEADLINE_EXCEEDED,
}


def canonical(status: int, code: str = "") -> Canonical:
    """The canonical code of an answer with HTTP ``status`` and the service's ``code``."""
    if status == 503 and code == "overloaded":
        return Canonical.RESOURCE_EXHAUSTED
    return _CANONICAL.get(status, Canonical.UNKNOWN)


class BackendUnavailableError(RuntimeError):
    """The model's backend cannot run batches at present (the session host is gone or does
    not answer): 503, not the request's fault."""


class ServiceError(Exception):
    """An error with an HTTP status, a code such as ``"image_too_large"`` and a message."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers

    @property
    def canonical(self) -> Canonical:
        """What kind of failure this is, for a door that does not speak HTTP statuses."""
        return canonical(self.status, self.code)


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    """The JSON body of an error outside ``/v2``: ``{"error": {"code", "message"}}``."""
    return {"error": {"code": code, "message": message}}


def too_large(what: str, limit: int) -> ServiceError:
    """413: ``what`` is larger than ``limit`` bytes."""
    return ServiceError(413, "payload_too_large", f"{what} is larger than {limit:,} bytes")
