"""``SpanPipe``: a span survives the trip as a record unchanged; a full queue and a dead exporter
drop spans (counted), never a request; the service's own spans mark errors as the SDK does."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import TextMapPropagator, default_getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.span import TraceState

from service.telemetry.span_export import (
    EXPORTER_NICENESS,
    SpanPipe,
    _consume,
    from_record,
    to_record,
)
from service.telemetry.tracing import Spans
from tests.service.conftest import wait_gone


def _sdk_span():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "t"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("scope", "1.2", schema_url="https://example.org/s")
    remote = trace.SpanContext(7, 9, True, trace.TraceFlags(1), TraceState([("k", "v")]))
    parent = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    span = tracer.start_span(
        "POST /x",
        parent,
        kind=SpanKind.SERVER,
        attributes={"a": 1, "b": "two", "c": [1.5, 2.5]},
        links=[Link(trace.SpanContext(3, 4, True, trace.TraceFlags(1)), {"l": True})],
    )
    span.add_event("e", {"x": 2})
    span.set_status(Status(StatusCode.ERROR, "boom"))
    span.end()
    (finished,) = exporter.get_finished_spans()
    return finished, provider.resource


def test_a_record_rebuilds_the_same_span():
    span, resource = _sdk_span()
    again = from_record(to_record(span), resource, {})
    assert again.to_json() == span.to_json()
    assert again.instrumentation_scope == span.instrumentation_scope
    assert again.parent is not None
    assert again.parent.is_remote
    assert again.context.trace_state == span.context.trace_state


def test_a_full_queue_drops_and_counts(caplog):
    exporter = InMemorySpanExporter()
    told: list[int] = []
    pipe = SpanPipe(
        Resource({}), exporter, schedule_delay_ms=60_000, max_queue_size=3, on_drop=told.append
    )
    span, _ = _sdk_span()
    for _ in range(5):
        pipe.on_end(span)
    assert pipe.dropped == 2
    assert told == [1, 1]  # the service's smso_spans_dropped_total
    pipe.start()
    pipe.shutdown()
    assert len(exporter.get_finished_spans()) == 3
    assert "2 spans were dropped" in caplog.text


def test_a_dead_exporter_process_drops_spans_without_failing(caplog):
    """The exporter runs at a lower priority; once it is gone, spans are dropped and counted."""
    pipe = SpanPipe(Resource({}), schedule_delay_ms=60_000)
    pipe.start()  # the real child process (no endpoint: it would export to localhost)
    assert pipe._process is not None
    stat = Path(f"/proc/{pipe._process.pid}/stat")
    expected = min(os.nice(0) + EXPORTER_NICENESS, 19)  # ours plus its own
    deadline = time.monotonic() + 20
    while int(stat.read_text().rsplit(")", 1)[1].split()[16]) != expected:  # field 19: nice
        assert time.monotonic() < deadline, "the exporter never lowered its priority"
        time.sleep(0.02)
    pipe._process.send_signal(signal.SIGTERM)  # a group-wide SIGTERM: ignored, the pipe rules
    time.sleep(0.3)
    assert pipe._process.poll() is None
    pipe._process.kill()
    pipe._process.wait(10)
    span, _ = _sdk_span()
    deadline = time.monotonic() + 10
    while pipe.dropped == 0 and time.monotonic() < deadline:  # the pipe may take a message
        pipe.on_end(span)
        pipe.force_flush()
    assert pipe.dropped > 0
    assert "span exporter gone" in caplog.text
    pipe.shutdown()


@pytest.fixture(params=["sdk", "piped"])
def service_spans(request: pytest.FixtureRequest):
    """The service's ``Spans`` on an in-memory exporter (SDK spans, or records through a
    ``SpanPipe``), its provider, and ``finish()``: the spans exported, the pipe shut first."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    piped = request.param == "piped"
    pipe = SpanPipe(provider.resource, exporter, schedule_delay_ms=5) if piped else None
    provider.add_span_processor(pipe or SimpleSpanProcessor(exporter))
    spans = Spans(provider.get_tracer("smso.service"), pipe, provider.sampler)
    if pipe is not None:
        pipe.start()

    def finish():
        if pipe is not None:
            pipe.shutdown()
        return exporter.get_finished_spans()

    yield spans, provider, finish
    if pipe is not None:
        pipe.shutdown()


def test_the_service_spans_mark_an_error_and_skip_unsampled_parents(service_spans):
    spans, provider, finish = service_spans
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        with pytest.raises(KeyError), spans.timed("decode", {"smso.images": 1}):
            raise KeyError("x")
        spans.finished("queue", request.get_span_context(), 10, 20)
    unsampled = trace.SpanContext(1, 2, False, trace.TraceFlags(0))
    spans.finished("queue", unsampled, 10, 20)
    by_name = {s.name: s for s in finish()}
    assert set(by_name) == {"request", "decode", "queue"}
    decode = by_name["decode"]
    assert decode.status.status_code is StatusCode.ERROR
    assert [e.name for e in decode.events] == ["exception"]
    assert decode.parent.span_id == by_name["request"].context.span_id
    assert (by_name["queue"].start_time, by_name["queue"].end_time) == (10, 20)
    assert by_name["queue"].instrumentation_scope.name == "smso.service"


def test_the_exporter_process_exits_when_the_server_dies_abruptly():
    """A killed server leaves no exporter behind: its pipe closes and the exporter exits."""
    script = (
        "from opentelemetry.sdk.resources import Resource\n"
        "from service.telemetry.span_export import SpanPipe\n"
        "pipe = SpanPipe(Resource({}))\n"
        "pipe.start()\n"
        "print(pipe._process.pid, flush=True)\n"
        "import os; os._exit(0)\n"
    )
    server = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    exporter = int(server.stdout.split()[0])
    assert wait_gone(exporter, 20)  # exited (a zombie: its parent, gone, never reaped it)


def test_a_server_error_or_an_exception_marks_the_request_span(service_spans):
    spans, _, finish = service_spans
    scope = {"type": "http", "method": "GET", "path": "/x", "headers": [], "server": ("h", 80)}
    spans.end_request(spans.start_request(scope), scope, "/x", 503)
    spans.end_request(spans.start_request(scope), scope, None, 500, RuntimeError("boom"))
    spans.end_request(spans.start_request(scope), scope, "/x", 499, asyncio.CancelledError())
    assert trace.get_current_span() is trace.INVALID_SPAN  # each request's context was left
    unavailable, crashed, left = finish()
    assert left.status.status_code is StatusCode.UNSET  # the client left: not an error
    assert left.attributes["http.response.status_code"] == 499
    assert unavailable.name == "GET /x"
    assert unavailable.status.status_code is StatusCode.ERROR
    assert unavailable.attributes["error.type"] == "503"
    assert crashed.name == "GET"  # no route matched
    assert crashed.attributes["error.type"] == "RuntimeError"
    assert [e.name for e in crashed.events] == ["exception"]
    assert unavailable.kind is SpanKind.SERVER
    assert unavailable.parent is None


def test_the_request_span_continues_the_callers_trace_from_its_headers(service_spans):
    """``traceparent`` and ``tracestate`` (a repeated header joined, RFC 9110) make the request
    span the caller's child in its trace; without them it is a root of a new trace."""
    spans, _, finish = service_spans
    parent = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    headers = [(b"traceparent", parent), (b"tracestate", b"a=1"), (b"tracestate", b"b=2")]
    headers += [(b"host", b"x"), (b"user-agent", b"t")]
    for request_headers in (headers, headers[3:]):
        scope = {"type": "http", "method": "GET", "path": "/x", "headers": request_headers}
        spans.end_request(spans.start_request(scope), scope, "/x", 200)
    child, root = finish()
    assert child.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert child.parent.span_id == 0xB7AD6B7169203331
    assert child.parent.is_remote
    assert list(child.context.trace_state.items()) == [("a", "1"), ("b", "2")]
    assert root.parent is None
    assert root.context.trace_id != child.context.trace_id


class _HeaderPropagator(TextMapPropagator):
    """A propagator that reads a header its ``fields`` does not list (as B3 reads ``x-b3-*``
    when configured as ``b3``): it must be handed every header."""

    def extract(self, carrier, context=None, getter=default_getter):
        value = getter.get(carrier, "x-trace")
        if not value:
            return context or Context()
        remote = trace.SpanContext(int(value[0]), 3, True, trace.TraceFlags(1))
        return trace.set_span_in_context(trace.NonRecordingSpan(remote), context)

    def inject(self, carrier, context=None, setter=None):
        pass

    @property
    def fields(self):
        return set()


@pytest.fixture
def header_propagator() -> Iterator[None]:
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(_HeaderPropagator())
    yield
    propagate.set_global_textmap(previous)


@pytest.mark.usefixtures("header_propagator")
def test_another_propagator_is_handed_every_header(service_spans):
    spans, _, finish = service_spans
    scope = {"type": "http", "method": "GET", "path": "/x", "headers": [(b"x-trace", b"9")]}
    spans.end_request(spans.start_request(scope), scope, "/x", 200)
    (span,) = finish()
    assert span.context.trace_id == 9
    assert span.parent.span_id == 3


def test_a_slow_collector_holds_the_exporter_back_instead_of_dropping_spans(caplog):
    """The exporter stops reading while its queue is full: nothing is dropped there (the
    server's bounded queue, which counts its drops, takes the pressure instead)."""

    class Slow(InMemorySpanExporter):
        def export(self, spans):
            time.sleep(0.01)
            return super().export(spans)

    span, resource = _sdk_span()
    messages = [pickle.dumps([to_record(span)] * 6) for _ in range(10)] + [b""]
    exporter = Slow()
    consumer = threading.Thread(
        target=_consume, args=(iter(messages).__next__, resource, exporter, 5, 4, 2)
    )
    consumer.start()
    consumer.join(30)
    assert len(exporter.get_finished_spans()) == 60
    assert "dropping" not in caplog.text.lower()


def test_a_service_folder_in_the_working_directory_does_not_shadow_the_package(tmp_path):
    """The exporter process does not put the working directory on its path."""
    (tmp_path / "service").mkdir()
    (tmp_path / "service" / "__init__.py").write_text("raise ImportError('the wrong service')\n")
    root = str(Path(__file__).resolve().parents[3])
    script = (
        f"import sys; sys.path.insert(0, {root!r})\n"
        "from opentelemetry.sdk.resources import Resource\n"
        "from service.telemetry.span_export import SpanPipe\n"
        "pipe = SpanPipe(Resource({}))\n"
        "pipe.start()\n"
        "pipe.shutdown()\n"
        "print(pipe._process.returncode)\n"
    )
    done = subprocess.run(
        [sys.executable, "-P", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.split() == ["0"], done.stderr
