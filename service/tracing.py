"""OpenTelemetry tracing, when configured: a span per request (FastAPI's own telemetry), and the
service's spans inside it: ``decode`` (the request's images), and per batch its images ran in
``queue`` (their wait in the model's batcher) and ``inference`` (the batch, with its size and the
request's images in it).

Tracing is on when the standard variables name an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; ``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER`` and the
rest as usual); it then needs the ``tracing`` extra (the OpenTelemetry SDK and OTLP exporter,
``fastapi[opentelemetry]``). Without it every span is OpenTelemetry's no-op: the default install
pays nothing but a function call.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Tracer, TracerProvider

__all__ = ["TRACER_NAME", "check_tracing", "telemetry_config", "tracer", "tracing_requested"]

TRACER_NAME = "smso.service"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def tracing_requested() -> bool:
    """Whether the environment asks for traces to be exported (an OTLP endpoint is set and the
    SDK is not disabled)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    return any(os.environ.get(name) for name in _ENDPOINTS)


def check_tracing() -> None:
    """``ValueError`` saying what to install when traces are asked for and the SDK is missing."""
    if tracing_requested() and importlib.util.find_spec("opentelemetry.sdk") is None:
        raise ValueError(
            "an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT) but the OpenTelemetry SDK is "
            "not installed: install the tracing extra (pip install 'smso[tracing]') or unset it"
        )


def telemetry_config(provider: TracerProvider | None = None) -> dict[str, Any]:
    """FastAPI's ``telemetry`` setting: request spans only (metrics are Prometheus's and logs
    the service's own), exported to the environment's OTLP endpoint when one is set, or to
    ``provider`` (a test's)."""
    return {
        "tracer_provider": provider,
        "tracing": True,
        "metrics": False,
        "logs": False,
        "operation_spans": False,
        "auto_configure": provider is None and tracing_requested(),
    }


def tracer(provider: TracerProvider | None = None) -> Tracer:
    """The service's tracer: from ``provider``, else the global one (a no-op until an SDK
    provider is set, which FastAPI's auto-configuration does)."""
    if provider is not None:
        return provider.get_tracer(TRACER_NAME)
    return trace.get_tracer(TRACER_NAME)
