"""What JSON logs and OpenTelemetry tracing cost the service, as ratios against both off.

Real servers on the shipped model, one per setting, each in its own process:

* ``off``: text logs at warning (no access line, no spans);
* ``off-control``: the same as ``off`` again: two identical servers on this shared machine can
  differ by up to 15 % for as long as they run, and this row shows how far;
* ``json``: ``SMSO_LOG_FORMAT=json`` at info, every record and one access line per request,
  written to a file as a log collector would read them;
* ``tracing-1.0``, ``tracing-0.1``, ``tracing-0.01``: an OTLP endpoint set and
  ``OTEL_TRACES_SAMPLER_ARG`` the sampling ratio (every request, one in 10, one in 100; the
  service's default is one in 1,000), so a sampled request's span and the service's decode,
  queue and inference spans are exported by the SDK's batch processor over http/protobuf to a
  collector in this process, which keeps what it receives and counts the spans afterwards.

The same load, ``/classify`` with one small PNG, runs against each in turn, in rounds whose order
rotates; each round gives each setting's requests per second as a ratio against ``off`` in that
round. ``--sets`` sets of fresh servers (their start order rotating) run ``--rounds`` rounds each,
and the median ratio over all rounds is the result. Each round also reads from ``/proc`` the
server process's CPU time per request (all its threads: the span exporter's too). At the end of
each set the traced servers' ``smso_spans_dropped_total`` is read; the spans received per request
check the sampling.

First, without servers, the spans' own CPU per request is timed in this process
(:func:`span_costs`: a request's four spans made as the service makes them, with the service's
provider at each ratio and the default one, in the thread that makes them; and the OTLP encoding
of a span): what no ratio of throughputs on a shared machine can resolve. Prints two markdown
tables and writes JSON.

    python -m bench.observability [--sets 5] [--rounds 3] [--requests 1000] [--clients 4]
        [--span-requests 20000] [--costs-only] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.server
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from PIL import Image

from bench.lib import ROOT, launch
from bench.lib.load import drive, multipart
from bench.lib.metrics import scrape
from bench.lib.procfs import group_cpu_seconds
from service.http.workers import inherited
from service.telemetry.tracing import DEFAULT_SAMPLING_RATIO, Spans, otlp_provider, tracer

MODEL = ROOT / "models" / "fashion-mnist-smso" / "model.onnx"
#: the traced settings and their sampling ratios (OTEL_TRACES_SAMPLER_ARG)
TRACED = {"tracing-1.0": 1.0, "tracing-0.1": 0.1, "tracing-0.01": 0.01}
SETTINGS = ("off", "off-control", "json", *TRACED)
#: the ratios whose spans are timed alone (span_costs): the servers' and the service's default
COSTED = TRACED | {"tracing-0.001": DEFAULT_SAMPLING_RATIO}
REPEATS = 7  # of each setting's span timing, interleaved; the fastest is kept
RESULTS = ROOT / "bench" / "results" / "observability.json"
WARM_UP = 50  # requests to each fresh server before its rounds
SERVICE_NAME = "smso-bench-"  # + the setting: whose spans an export holds


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/http endpoint that accepts every export and keeps its body (decoded after the
    run, not while the servers are measured)."""

    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        type(self).bodies.append(body)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:  # quiet
        pass


@contextlib.contextmanager
def collector() -> Iterator[str]:
    """An OTLP/http collector on a free loopback port: its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def spans_by_setting(bodies: list[bytes]) -> dict[str, int]:
    """The spans the export requests ``bodies`` hold, by the setting of the server that sent
    them (its ``service.name``)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    spans = dict.fromkeys(TRACED, 0)
    for body in bodies:
        for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
            names = [
                a.value.string_value
                for a in resource_spans.resource.attributes
                if a.key == "service.name"
            ]
            setting = names[0].removeprefix(SERVICE_NAME) if names else ""
            count = sum(len(scope.spans) for scope in resource_spans.scope_spans)
            spans[setting] = spans.get(setting, 0) + count
    return spans


def upload(url: str, image: bytes, images: int) -> Any:
    """``images`` copies of ``image`` per request, as multipart parts named ``file``."""
    if images == 1:
        return multipart(url, [image])
    parts = [("file", (f"{i}.png", image, "image/png")) for i in range(images)]

    def send(client: Any, i: int) -> Any:
        return client.post(url, files=parts)

    return send


def png() -> bytes:
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def environment(setting: str, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env |= {"SMSO_MAX_BATCH_SIZE": "16", "SMSO_LOG_LEVEL": "warning", "SMSO_LOG_FORMAT": "text"}
    if setting == "json":
        env |= {"SMSO_LOG_FORMAT": "json", "SMSO_LOG_LEVEL": "info"}
    if setting in TRACED:  # the batch processor's settings as deployed (the SDK's defaults)
        env |= {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_SERVICE_NAME": SERVICE_NAME + setting,
            "OTEL_TRACES_SAMPLER_ARG": str(TRACED[setting]),
        }
    return env


@contextlib.contextmanager
def server(setting: str, endpoint: str, folder: Path, number: int = 0) -> Iterator[tuple[str, int]]:
    """``setting``'s server, its output (the logs) going to a file: its base URL and pid."""
    command = [sys.executable, "-m", "service.cli", "--model-path", str(MODEL), "--port", "{port}"]
    env = environment(setting, endpoint) | {"SMSO_GRPC_PORT": "0"}
    with launch.Server(command, "/readyz", env, folder / f"{setting}-{number}.log") as running:
        yield running.base, running.process.pid


class _Discard(SpanExporter):
    """An exporter that takes every batch and sends nothing."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _one_request(spans: Spans) -> None:
    """A request's spans as the service makes them: its own (``AccessLog``), ``decode`` (the
    data plane), ``queue`` and ``inference`` (the batcher, after the batch)."""
    scope = {
        "type": "http",
        "method": "POST",
        "scheme": "http",
        "path": "/classify",
        "query_string": b"",
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 40000),
        "headers": [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"bench"), (b"accept", b"*/*")],
    }
    request = spans.start_request(scope)
    with spans.timed("decode", {"smso.images": 1}):
        queued = time.time_ns()
    parent = trace.get_current_span().get_span_context()
    start = time.time_ns()
    spans.finished("queue", parent, queued, start)
    batch = {"smso.model": "m", "smso.model_version": "1", "smso.batch_size": 1, "smso.images": 1}
    spans.finished("inference", parent, start, time.time_ns(), batch)
    if request is not None:
        spans.end_request(request, scope, "/classify", 200)


def span_costs(requests: int) -> dict[str, Any]:
    """Tracing's CPU per request in the serving process, without the servers' noise: the spans
    of ``requests`` requests made in this thread (``time.thread_time``: other processes and
    threads do not count) by the service's provider at each sampling ratio, in :data:`REPEATS`
    interleaved slices, the fastest kept; and the OTLP encoding of a span (the exporter's
    encoder, which runs in the batch processor's thread). The queue is made large enough for
    this loop's bursts: every span is made and queued."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    def provider(ratio: float, exporter: SpanExporter) -> SdkTracerProvider:
        queue = str(4 * requests + 1000)
        with inherited({"OTEL_TRACES_SAMPLER_ARG": str(ratio), "OTEL_BSP_MAX_QUEUE_SIZE": queue}):
            return otlp_provider(exporter=exporter)

    def per_request_us(spans: Spans, count: int) -> float:
        start = time.thread_time()
        for _ in range(count):
            _one_request(spans)
        return (time.thread_time() - start) / count * 1e6

    made = {"off": Spans(tracer(None))}
    providers = {setting: provider(ratio, _Discard()) for setting, ratio in COSTED.items()}
    made |= {setting: Spans(tracer(traced)) for setting, traced in providers.items()}
    for spans in made.values():
        per_request_us(spans, min(requests, 200))  # warm
    # interleaved repeats, the fastest of each kept: the others' load only ever adds time
    timings: dict[str, list[float]] = {setting: [] for setting in made}
    for _ in range(REPEATS):
        for setting, spans in made.items():
            timings[setting].append(per_request_us(spans, max(requests // REPEATS, 1)))
    for traced in providers.values():
        traced.shutdown()
    costs: dict[str, Any] = {"requests": requests, "repeats": REPEATS}
    costs |= {f"{setting}_us": min(times) for setting, times in timings.items()}
    memory = InMemorySpanExporter()
    traced = provider(1.0, memory)
    spans = Spans(tracer(traced))
    for _ in range(512 // 4):  # one full export batch
        _one_request(spans)
    traced.force_flush()
    batch = memory.get_finished_spans()
    encodings = []
    for _ in range(REPEATS):
        start = time.thread_time()
        for _ in range(10):
            encode_spans(batch).SerializePartialToString()
        encodings.append((time.thread_time() - start) / 10 / len(batch) * 1e6)
    costs["encode_us_per_span"] = min(encodings)
    traced.shutdown()
    return costs


def measure(args: argparse.Namespace) -> dict[str, Any]:
    image = png()
    rounds: list[dict[str, Any]] = []
    set_ratios: dict[str, list[float]] = {s: [] for s in SETTINGS}
    log_lines = dict.fromkeys(SETTINGS, 0)
    sent = dict.fromkeys(SETTINGS, 0)  # /classify requests each setting's servers answered
    dropped = dict.fromkeys(TRACED, 0.0)  # their smso_spans_dropped_total
    _Collector.bodies = []
    with collector() as endpoint, tempfile.TemporaryDirectory() as tmp:
        for number in range(args.sets):
            k = number % len(SETTINGS)  # which server starts first rotates too
            starting = SETTINGS[k:] + SETTINGS[:k]
            with contextlib.ExitStack() as stack:
                servers = {
                    s: stack.enter_context(server(s, endpoint, Path(tmp), number)) for s in starting
                }
                for setting, (base, _) in servers.items():  # warm each: connections, first runs
                    drive(upload(f"{base}/classify", image, args.images), args.clients, WARM_UP)
                    sent[setting] += WARM_UP
                these = []
                for r in range(args.rounds):
                    k = (number + r) % len(SETTINGS)
                    runs = {}
                    for setting in SETTINGS[k:] + SETTINGS[:k]:
                        base, pid = servers[setting]
                        before = group_cpu_seconds(pid)  # the server's group: its workers
                        run = drive(
                            upload(f"{base}/classify", image, args.images),
                            args.clients,
                            args.requests,
                        )
                        # the batch processor's last export may come after; close enough
                        run["server_cpu_ms"] = (
                            (group_cpu_seconds(pid) - before) / args.requests * 1e3
                        )
                        run.pop("latencies_ms")
                        runs[setting] = run
                        sent[setting] += args.requests
                    these.append(runs)
                for setting in TRACED:
                    base, _ = servers[setting]
                    dropped[setting] += scrape(f"{base}/metrics").get("smso_spans_dropped_total", 0)
            # the servers have stopped: their last spans are exported
            for setting in SETTINGS:
                set_ratios[setting].append(
                    statistics.median(
                        r[setting]["requests_per_second"] / r["off"]["requests_per_second"]
                        for r in these
                    )
                )
                log = Path(tmp) / f"{setting}-{number}.log"
                log_lines[setting] += len(log.read_text().splitlines())
            rounds.extend(these)
    bodies = _Collector.bodies
    spans = spans_by_setting(bodies)
    summary = {}
    for setting in SETTINGS:
        ratios = [
            r[setting]["requests_per_second"] / r["off"]["requests_per_second"] for r in rounds
        ]
        summary[setting] = {
            "sampling_ratio": TRACED.get(setting, 0.0),
            "requests_per_second": statistics.median(
                r[setting]["requests_per_second"] for r in rounds
            ),
            "p50_ms": statistics.median(r[setting]["p50_ms"] for r in rounds),
            "p99_ms": statistics.median(r[setting]["p99_ms"] for r in rounds),
            "server_cpu_ms_per_request": statistics.median(
                r[setting]["server_cpu_ms"] for r in rounds
            ),
            "ratio_to_off": statistics.median(ratios),
            "round_ratios": ratios,
            "set_ratios": set_ratios[setting],
            "failures": sum(r[setting]["failures"] for r in rounds),
            "log_lines": log_lines[setting],
            "requests_sent": sent[setting],
            "spans_received": spans.get(setting, 0),
            "spans_per_request": spans.get(setting, 0) / sent[setting],
            "spans_dropped": dropped.get(setting, 0.0),
        }
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
        },
        "load": {
            "sets": args.sets,
            "rounds": args.rounds,
            "requests": args.requests,
            "warm_up_requests": WARM_UP,
            "clients": args.clients,
            "route": "/classify",
            "image": "28x28 PNG",
            "images_per_request": args.images,
        },
        "settings": summary,
        "otlp": {"exports": len(bodies), "bytes": sum(len(b) for b in bodies)},
        "rounds": rounds,
    }


def table(result: dict[str, Any]) -> str:
    rows = [
        "| setting | sampled | req/s (median) | p50 ms | p99 ms | ratio to off (median) "
        "| server sets | server CPU ms/request | spans/request | spans dropped |",
        "|---|--:|--:|--:|--:|--:|---|--:|--:|--:|",
    ]
    for setting, row in result["settings"].items():
        spread = ", ".join(f"{r:.2f}" for r in row["set_ratios"])
        rows.append(
            f"| {setting} | {row['sampling_ratio']:g} | {row['requests_per_second']:,.0f} | "
            f"{row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['ratio_to_off']:.3f} | {spread} | "
            f"{row['server_cpu_ms_per_request']:.3f} | {row['spans_per_request']:.3f} | "
            f"{row['spans_dropped']:,.0f} |"
        )
    otlp = result["otlp"]
    rows.append(
        f"\nOTLP exports received: {otlp['exports']} ({otlp['bytes']:,} bytes); "
        f"log lines: " + ", ".join(f"{s} {r['log_lines']}" for s, r in result["settings"].items())
    )
    return "\n".join(rows)


def cost_table(costs: dict[str, Any]) -> str:
    """The spans' CPU per request (:func:`span_costs`), in µs."""
    encode = costs["encode_us_per_span"]
    rows = [
        "| setting | spans' CPU on the request's threads, µs/request "
        "| OTLP encoding (batch processor's thread), µs/request |",
        "|---|--:|--:|",
        f"| off | {costs['off_us']:.1f} | 0 |",
    ]
    for setting, ratio in COSTED.items():
        rows.append(f"| {setting} | {costs[f'{setting}_us']:.1f} | {4 * ratio * encode:.1f} |")
    rows.append(f"\nOTLP encoding: {encode:.1f} µs a span ({costs['requests']:,} requests timed)")
    return "\n".join(rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sets", type=int, default=5, help="sets of fresh servers, one per setting each"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the settings a set")
    parser.add_argument("--requests", type=int, default=1000, help="requests per setting a round")
    parser.add_argument("--clients", type=int, default=4, help="concurrent client threads")
    parser.add_argument("--images", type=int, default=1, help="PNG files per request")
    parser.add_argument(
        "--span-requests", type=int, default=20_000, help="requests whose spans are timed alone"
    )
    parser.add_argument(
        "--costs-only", action="store_true", help="only the spans' CPU, timed alone (no servers)"
    )
    parser.add_argument("--smoke", action="store_true", help="a seconds-long run (tests)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    args = parser.parse_args(argv)
    if not 1 <= args.images <= 16:  # one batch (SMSO_MAX_BATCH_SIZE=16 here) per request
        parser.error(f"--images must be between 1 and 16, not {args.images}")
    if args.smoke:
        args.sets, args.rounds, args.requests, args.clients = 1, 1, 60, 2
        args.span_requests = 300
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    costs = span_costs(args.span_requests)
    if args.costs_only:
        result: dict[str, Any] = {"span_costs": costs}
    else:
        result = measure(args) | {"span_costs": costs}
        print(table(result))
        print()
    print(cost_table(costs))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
