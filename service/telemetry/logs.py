"""How smso-serve logs: ``SMSO_LOG_FORMAT`` ``text`` (one readable line per record, as before)
or ``json`` (one JSON object per line), for the service's loggers and uvicorn's alike.

Every line emitted while a request is handled carries its id (:class:`RequestIdFilter`, from
:mod:`service.telemetry.access`). A JSON line has ``time`` (ISO 8601, UTC, milliseconds),
``level``, ``logger``, ``message``, ``request_id`` within a request, ``process`` with several worker
processes, ``exception`` (the traceback as one string) where there is one, and the access
line's fields (``method``, ``route``, ``status``, ``model``, ``version``, ``images``,
``latency_ms``, ``decode_ms``, ``queue_ms``, ``inference_ms``). Standard library only.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, Literal

from service.telemetry.access import request_id

__all__ = ["JsonFormatter", "RequestIdFilter", "TextFormatter", "configure_logging"]

#: The access line's fields that its message already says (``POST /classify 200``).
_IN_MESSAGE = frozenset({"method", "route", "status"})


class RequestIdFilter(logging.Filter):
    """Sets ``record.request_id``: the id of the request being handled, or ``None``."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id()
        return True


class TextFormatter(logging.Formatter):
    """``<time> [<pid>] <logger> <message>``, then the access line's fields as ``name=value`` and
    the request's id; a traceback follows on its own lines, as Python prints it."""

    def __init__(self, process: bool = False) -> None:
        pid = "%(process)d " if process else ""
        super().__init__(f"%(asctime)s {pid}%(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        line = super().formatMessage(record)
        access = getattr(record, "access", None)
        if access:
            line += "".join(f" {k}={v}" for k, v in access.items() if k not in _IN_MESSAGE)
        rid = getattr(record, "request_id", None)
        return line if rid is None else f"{line} request_id={json.dumps(rid)}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module's docstring for its keys)."""

    def __init__(self, process: bool = False) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        line: dict[str, Any] = {
            "time": when.replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", None)
        if rid is not None:
            line["request_id"] = rid
        if self.process:
            line["process"] = record.process
        line.update(getattr(record, "access", None) or {})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)  # ASCII: no character a reader splits lines on


def configure_logging(
    level: str, log_format: Literal["text", "json"], process: bool = False
) -> None:
    """One handler on the root logger (stderr), unless the process already has one (a test's,
    or a caller's own configuration): every logger, uvicorn's included, reaches it (smso-serve
    gives uvicorn no logging configuration of its own and turns its access log off)."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    formatter = JsonFormatter if log_format == "json" else TextFormatter
    handler.setFormatter(formatter(process=process))
    root.addHandler(handler)
    root.setLevel(level.upper())
