"""Prometheus metrics of one app, in its own registry (a fresh app per test, no global state).

Requests are counted by :mod:`service.http.request_metrics` (HTTP) and
:mod:`service.grpc.server`, each label from a closed set: a client cannot grow the page. Names end
in ``_total`` or ``_seconds`` (or name a plain quantity: batch size, queue depth).

The series of one model version (labels ``model`` and ``version``) last as long as it serves:
:meth:`Metrics.forget` removes every one of them when it retires, so that the page is bounded by
what is served now, not by every version ever served. With several worker processes
(prometheus_client's multiprocess mode, where a series cannot be removed from the files the
workers write) :func:`exposition` shows the series of the versions that the answering worker
has loaded and not retired (:attr:`Metrics.live`), and leaves every other version's out.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

__all__ = ["MULTIPROC_ENV", "BatchStats", "Metrics", "exposition"]

#: Where worker processes keep their metric values (prometheus_client's multiprocess mode).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: a gallery search takes tens of microseconds on a small gallery: finer buckets below 1 ms
SEARCH_BUCKETS = (0.0001, 0.00025, 0.0005, *LATENCY_BUCKETS[:-3])


@dataclass
class BatchStats:
    """What the last batch measured, for metrics: called after every batch."""

    size: int
    queue_wait_s: list[float]
    #: the inference thread's time on the batch: the copy into one batch, the onnxruntime call
    inference_s: float
    #: from the batch's dispatch to its results back on the event loop: ``inference_s`` plus
    #: the wait for the inference thread (an earlier batch in flight) and for the event loop
    round_trip_s: float = 0.0
    #: ``inference_s`` by stage (:mod:`service.telemetry.stage_clock`): what the run function
    #: recorded (``stack``, ``upload``, ``run``, ``download``, ``score``...)
    stages: dict[str, float] = field(default_factory=dict)


#: The labels of per-model metrics.
MODEL = ["model", "version"]


class Metrics:
    """The service's metrics in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "smso_http_requests_total",
            "HTTP requests by route template and status",
            ["method", "route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "smso_http_request_duration_seconds",
            "Request latency, first byte in to last out",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.grpc_requests = Counter(
            "smso_grpc_requests_total",
            "gRPC calls by method and status code",
            ["method", "status"],
            registry=r,
        )
        self.grpc_latency = Histogram(
            "smso_grpc_request_duration_seconds",
            "gRPC call latency, in the handler",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # model and version label values come from the models loaded (a closed set: folder
        # names of the repository, or the one model's card), never from a request
        self.images = Counter(
            "smso_images_total",
            "Images answered, by route and model",
            ["route", *MODEL],
            registry=r,
        )
        self.dropped = Counter(
            "smso_images_dropped_total",
            "Images not decoded because their request had passed its deadline or its client left",
            registry=r,
        )
        self.decoded = Counter(
            "smso_images_decoded_total",
            "With decode_device=cuda, images decoded by where: device (nvJPEG on the GPU) or "
            "pillow (the decode threads' CPU: the images the GPU's path does not take)",
            ["decoder"],
            registry=r,
        )
        self.requests_refused = Counter(
            "smso_requests_refused_total",
            "Requests refused at once because the server was at a limit (HTTP 503, gRPC "
            "RESOURCE_EXHAUSTED), by the setting that bounds it",
            ["limit"],
            registry=r,
        )
        self.spans_dropped = Counter(
            "smso_spans_dropped_total",
            "Sampled trace spans not exported: the export queue was full "
            "(OTEL_BSP_MAX_QUEUE_SIZE), or the export failed",
            registry=r,
        )
        self.decode = Histogram(
            "smso_decode_seconds",
            "Decoding and preprocessing one image",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "smso_queue_wait_seconds",
            "Time an image waited in its model's batcher queue",
            MODEL,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference = Histogram(
            "smso_inference_seconds",
            "The inference thread's time on a batch: stacking, the onnxruntime call, copies",
            MODEL,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_stage = Histogram(
            "smso_inference_stage_seconds",
            "The inference thread's time on a batch by stage: stack (the images into one "
            "batch, padded to a batch-size bucket), handoff and share (with a shared session: "
            "to the session host and back, and the wait there), upload (to the device), run "
            "(the onnxruntime call), download, score (typicality)",
            [*MODEL, "stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.round_trip = Histogram(
            "smso_batch_round_trip_seconds",
            "A batch's dispatch to its results back on the event loop: inference, and the wait "
            "for the inference thread and for the event loop",
            MODEL,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "smso_batch_size",
            "Images per onnxruntime call",
            MODEL,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=r,
        )
        # set on every submit and when a batch is taken (the batcher's on_depth): the only
        # moments the depth changes; summed over the live worker processes
        self.queue_depth = Gauge(
            "smso_queue_depth",
            "Images waiting for inference, all models",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.model_queue_depth = Gauge(
            "smso_model_queue_depth",
            "Images waiting for inference, by model",
            MODEL,
            registry=r,
            multiprocess_mode="livesum",
        )
        # typicality and drift (models whose card has a typicality reference); with several
        # workers each has its own window: the most alarming one is shown
        self.typicality = Histogram(
            "smso_typicality_score",
            "Typicality score of each served image (higher: less "
            "typical of the model's reference images)",
            MODEL,
            buckets=(-4, -2, 0, 2, 4, 6, 8, 12, 16, 24, 32, 64),
            registry=r,
        )
        self.drift_p_value = Gauge(
            "smso_drift_p_value",
            "Binomial p-value of the rare images (typicality p < 0.01) "
            "among the last images of the window",
            MODEL,
            registry=r,
            multiprocess_mode="livemin",
        )
        self.drift_window = Gauge(
            "smso_drift_window",
            "Images in the drift window (up to SMSO_DRIFT_WINDOW)",
            MODEL,
            registry=r,
            multiprocess_mode="livesum",
        )
        self.drift_alarm = Gauge(
            "smso_drift_alarm",
            "1 while the drift p-value is below SMSO_DRIFT_ALARM_P",
            MODEL,
            registry=r,
            multiprocess_mode="livemax",
        )
        # the gallery served beside each model version (/search)
        self.search = Histogram(
            "smso_search_seconds",
            "A search of the gallery beside the model: every query of one request, encoded and "
            "matched (the embeddings' inference not included)",
            MODEL,
            buckets=SEARCH_BUCKETS,
            registry=r,
        )
        self.gallery_items = Gauge(
            "smso_gallery_items",
            "Items in the gallery served beside the model (0: none serves)",
            MODEL,
            registry=r,
            multiprocess_mode="livemax",
        )
        #: every metric labelled by model and version, with its label names in order
        self._per_model: list[tuple[MetricWrapperBase, list[str]]] = [
            (self.images, ["route", *MODEL]),
            (self.inference_stage, [*MODEL, "stage"]),
            *(
                (metric, MODEL)
                for metric in (
                    self.queue_wait,
                    self.inference,
                    self.round_trip,
                    self.batch_size,
                    self.model_queue_depth,
                    self.typicality,
                    self.drift_p_value,
                    self.drift_window,
                    self.drift_alarm,
                    self.search,
                    self.gallery_items,
                )
            ),
        ]
        #: the model versions this process has loaded and not retired since: with several
        #: worker processes, the page shows only theirs (a worker started after a version
        #: was retired elsewhere never loaded it, and so does not show it either)
        self.live: set[tuple[str, str]] = set()

    def batch_observer(self, model: str, version: str) -> Callable[[BatchStats], None]:
        """What a model's batcher calls after each batch: its size, inference time (in all and
        by stage) and each image's wait, labelled with the model (a version served again is
        live again)."""
        self.live.add((model, version))
        size, inference, round_trip = (
            self.batch_size.labels(model, version),
            self.inference.labels(model, version),
            self.round_trip.labels(model, version),
        )
        wait = self.queue_wait.labels(model, version)
        stages: dict[str, Histogram] = {}

        def observe(stats: BatchStats) -> None:
            size.observe(stats.size)
            inference.observe(stats.inference_s)
            round_trip.observe(stats.round_trip_s)
            for stage, seconds in stats.stages.items():
                if stage not in stages:
                    stages[stage] = self.inference_stage.labels(model, version, stage)
                stages[stage].observe(seconds)
            for seconds in stats.queue_wait_s:
                wait.observe(seconds)

        return observe

    def drift_reporter(self, model: str, version: str) -> Callable[[float, int, bool], None]:
        """What a model's drift monitor calls after each change: its three gauges."""
        p_value, window, alarm = (
            self.drift_p_value.labels(model, version),
            self.drift_window.labels(model, version),
            self.drift_alarm.labels(model, version),
        )

        def report(p: float, images: int, alarmed: bool) -> None:
            p_value.set(p)
            window.set(images)
            alarm.set(int(alarmed))

        return report

    def gallery_reporter(self, model: str, version: str) -> Callable[[int], None]:
        """What a model's gallery calls when it changes: the items now served (0: none)."""
        items = self.gallery_items.labels(model, version)
        return items.set

    def forget(self, model: str, version: str) -> None:
        """Drop every series of a retired model version: its gauges, counters and histograms
        (Prometheus reads a series that ends as stale; ``rate()`` and ``increase()`` over the
        time it served are unchanged). In multiprocess mode the series stay in the workers'
        files and :func:`exposition` leaves them out."""
        self.live.discard((model, version))
        if os.environ.get(MULTIPROC_ENV):
            return  # prometheus_client cannot remove them there (and warns)
        for metric, names in self._per_model:
            for values in _label_values(metric, names, model, version):
                with contextlib.suppress(KeyError):  # removed meanwhile
                    metric.remove(*values)


def _label_values(
    metric: Collector, names: list[str], model: str, version: str
) -> set[tuple[str, ...]]:
    """The label values (in the order of ``names``) of ``metric``'s series of ``model`` at
    ``version``, read from what it collects."""
    return {
        tuple(sample.labels[name] for name in names)
        for family in metric.collect()
        for sample in family.samples
        if _of(sample, {(model, version)})
    }


def _of(sample: Sample, versions: set[tuple[str, str]]) -> bool:
    """Whether ``sample`` is labelled with one of the ``(model, version)`` pairs."""
    return (sample.labels.get("model"), sample.labels.get("version")) in versions


class _Served:
    """The families of ``collector`` with the samples of the ``live`` model versions only (and
    every sample that names no model)."""

    def __init__(self, collector: Collector, live: set[tuple[str, str]]) -> None:
        self._collector, self._live = collector, live

    def collect(self) -> Iterable[Metric]:
        for family in self._collector.collect():
            family.samples = [
                s for s in family.samples if "model" not in s.labels or _of(s, self._live)
            ]
            yield family


def exposition(metrics: Metrics | None) -> bytes:
    """The Prometheus text page: this process's registry, or, with several worker processes
    (``PROMETHEUS_MULTIPROC_DIR`` set), every worker's values combined."""
    folder = os.environ.get(MULTIPROC_ENV)
    if folder:
        _forget_exited_workers(Path(folder))
        registry = CollectorRegistry()
        combined = multiprocess.MultiProcessCollector(None)
        registry.register(combined if metrics is None else _Served(combined, set(metrics.live)))
        return generate_latest(registry)
    return b"" if metrics is None else generate_latest(metrics.registry)


def _forget_exited_workers(folder: Path) -> None:
    """Remove the live-gauge files of worker processes that have exited (uvicorn replaces a
    worker that dies, and nobody calls ``mark_process_dead`` for it): the queue depth it last
    reported would count for ever. Counters and histograms keep their files."""
    for path in folder.glob("gauge_live*_*.db"):
        pid = path.stem.rpartition("_")[2]
        if pid.isdigit() and not _running(int(pid)):
            with contextlib.suppress(FileNotFoundError):  # another worker was scraped too
                multiprocess.mark_process_dead(int(pid), str(folder))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal: only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's
        return True
    return True
