"""What the doors of one server share: settings, the models, the decode threads, metrics, spans
and the server-wide bounds (:class:`ServiceState`)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from service.core.settings import Settings
from service.limits.admission import Admission
from service.limits.bodies import BufferedBytes
from service.limits.inflight import InFlight
from service.models.registry import Registry
from service.models.repository import Repository
from service.telemetry.metrics import Metrics
from service.telemetry.tracing import Spans, tracer

__all__ = ["ServiceState"]


@dataclass
class ServiceState:
    """What the routes of one app share: settings, the models (``registry``), the decode
    threads, metrics and the server-wide bounds. Filled in by the app's lifespan."""

    settings: Settings
    registry: Registry = field(default_factory=Registry)
    metrics: Metrics = field(default_factory=Metrics)
    #: shutting down: health checks say so and no model takes new requests
    draining: bool = False
    #: the model repository being followed, when the server serves one
    repository: Repository | None = None
    #: the service's own OpenTelemetry spans (a no-op unless tracing is configured)
    spans: Spans = field(default_factory=lambda: Spans(tracer()))
    admission: Admission = field(init=False)
    buffered: BufferedBytes = field(init=False)
    #: requests in progress, over both doors
    inflight: InFlight = field(init=False)
    #: the threads that decode images (and parse large protocol requests)
    decoder: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.decoder = ThreadPoolExecutor(
            self.settings.decode_workers, thread_name_prefix="decode"
        )  # threads start on first use
        self.admission = Admission(self.settings.inflight_limit)
        self.buffered = BufferedBytes(self.settings.max_buffered_bytes)
        refused = self.metrics.requests_refused.labels("max_connections")
        self.inflight = InFlight(self.settings.max_connections, refused.inc)
