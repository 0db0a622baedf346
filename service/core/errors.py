"""The service's errors, whatever door a request came in by.

:class:`ServiceError` carries a status, a stable machine-readable code and a message for people;
each door renders it (:mod:`service.http.errors` as JSON, :mod:`service.grpc.server` as a status
code). :class:`BackendUnavailableError` is the backend's own failure, never the request's.
"""

from __future__ import annotations

__all__ = [
    "CLIENT_CLOSED",
    "BackendUnavailableError",
    "ServiceError",
    "error_body",
    "too_large",
]

#: The status a request is counted with when its client left before it was read (no client
#: sees it: there is nobody to send it to).
CLIENT_CLOSED = 499


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


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    """The JSON body of an error outside ``/v2``: ``{"error": {"code", "message"}}``."""
    return {"error": {"code": code, "message": message}}


def too_large(what: str, limit: int) -> ServiceError:
    """413: ``what`` is larger than ``limit`` bytes."""
    return ServiceError(413, "payload_too_large", f"{what} is larger than {limit:,} bytes")
