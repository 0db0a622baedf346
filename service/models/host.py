"""What loading and following models need of the server they run in (:class:`Host`).

The server's state (:class:`service.dataplane.state.ServiceState`) has these and more; naming only
these keeps the models below the data plane that uses them.
"""

from __future__ import annotations

from typing import Protocol

from service.core.settings import Settings
from service.models.registry import Registry
from service.telemetry.metrics import Metrics
from service.telemetry.tracing import Spans

__all__ = ["Host"]


class Host(Protocol):
    """The settings, the registry the models go into, the metrics they report to and the spans
    their batches record."""

    settings: Settings
    registry: Registry
    metrics: Metrics
    spans: Spans
