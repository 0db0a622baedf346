"""Each request's id, its record and its access line, whatever door it came in by.

A request's id is the client's (``X-Request-ID`` over HTTP, ``x-request-id`` metadata over gRPC)
when it is printable ASCII of at most 128 characters, else a new one (uuid4, hex). Through a
context variable (:func:`current`) it is attached to every log line emitted while the request is
handled (:class:`service.telemetry.logs.RequestIdFilter`). When the request ends, one access line
is logged on the ``service.access`` logger (:func:`log_access`): the route template (never the
raw path), the model, its version, the status, the images and the latency with its split, each
where the request had them.

The routes fill in what only they know (the model), :mod:`service.dataplane.pipeline` the
decoding time and the model's batcher the queue and inference times, on the request's
:class:`RequestRecord`.
"""

from __future__ import annotations

import logging
import re
import uuid
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

__all__ = [
    "HEADER",
    "RequestRecord",
    "begin",
    "current",
    "log_access",
    "note_model",
    "request_id",
    "valid_id",
]

log = logging.getLogger("service.access")

HEADER = "x-request-id"
#: A client's id is kept when it is printable ASCII (spaces inside only), 1 to 128 characters.
_VALID_ID = re.compile(rb"[!-~](?:[ -~]{0,126}[!-~])?")


@dataclass
class RequestRecord:
    """What the access line says of one request; ``None``: the request had no such thing."""

    request_id: str
    model: str | None = None
    version: str | None = None
    images: int | None = None
    decode_s: float | None = None  # in decode_all: admission, waiting for a thread, decoding
    # in the model's batcher (time.perf_counter()): its first image queued, the first of the
    # batches with its images dispatched to the inference thread, the last of them ended
    queued: float | None = None
    started: float | None = None
    ended: float | None = None

    def add(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to the timing ``name`` (``decode_s``)."""
        setattr(self, name, (getattr(self, name) or 0.0) + seconds)

    def note_queued(self, at: float) -> None:
        """One of its images entered the batcher's queue ``at``."""
        self.queued = at if self.queued is None else min(self.queued, at)

    def note_started(self, at: float) -> None:
        """A batch with some of its images was dispatched to the inference thread ``at``."""
        self.started = at if self.started is None else min(self.started, at)

    def note_ended(self, at: float) -> None:
        """A batch with some of its images ended ``at`` (its outputs back, or its failure)."""
        self.ended = at if self.ended is None else max(self.ended, at)

    def cut(self, at: float) -> None:
        """It stopped waiting ``at`` (its deadline): a queue wait or an inference still under
        way ends there."""
        if self.queued is not None and self.started is None:
            self.started = at
        elif self.started is not None and (self.ended is None or self.ended < at):
            self.ended = at

    @property
    def queue_s(self) -> float | None:
        """From its first image queued to the start of the first batch with any of its images."""
        if self.queued is None or self.started is None:
            return None
        return max(self.started - self.queued, 0.0)

    @property
    def inference_s(self) -> float | None:
        """From the start of the first batch with its images to the end of the last one."""
        if self.started is None or self.ended is None:
            return None
        return self.ended - self.started


_CURRENT: ContextVar[RequestRecord | None] = ContextVar("smso_request", default=None)


def current() -> RequestRecord | None:
    """The record of the request being handled, ``None`` outside one."""
    return _CURRENT.get()


def request_id() -> str | None:
    """The id of the request being handled, ``None`` outside one."""
    record = _CURRENT.get()
    return None if record is None else record.request_id


class _Versioned(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...


_M = TypeVar("_M", bound=_Versioned)


def note_model(model: _M) -> _M:
    """Name ``model`` (and its version) on the current request's access line; returns it."""
    record = _CURRENT.get()
    if record is not None:
        record.model, record.version = model.name, model.version
    return model


def valid_id(value: bytes | str | None) -> str | None:
    """A client's request id when it is acceptable (printable ASCII, 1 to 128 characters),
    else ``None`` (a new one is generated)."""
    if isinstance(value, str):
        if not value.isascii():
            return None
        value = value.encode("ascii")
    return value.decode("ascii") if value is not None and _VALID_ID.fullmatch(value) else None


def begin(client_id: str | None) -> RequestRecord:
    """A new request's record, with the client's id or a new one, bound to the current
    context (its task): every log line emitted in it carries the id."""
    record = RequestRecord(client_id or uuid.uuid4().hex)
    _CURRENT.set(record)
    return record


def log_access(
    method: str,
    route: str,
    status: int | str,
    record: RequestRecord,
    seconds: float,
    level: int = logging.INFO,
) -> None:
    """The request's access line on ``service.access``: what it has of the route template,
    model, version, status, images and the latency with its split."""
    if not log.isEnabledFor(level):
        return
    fields: dict[str, Any] = {
        "method": method,
        "route": route,
        "status": status,
        "model": record.model,
        "version": record.version,
        "images": record.images,
        "latency_ms": _ms(seconds),
        "decode_ms": _ms(record.decode_s),
        "queue_ms": _ms(record.queue_s),
        "inference_ms": _ms(record.inference_s),
    }
    access = {name: value for name, value in fields.items() if value is not None}
    log.log(level, "%s %s %s", method, route, status, extra={"access": access})


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
