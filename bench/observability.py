"""What JSON logs and OpenTelemetry tracing cost the service, as ratios against both off.

Real servers on the shipped model, one per setting, each in its own process:

* ``off``: text logs at warning (no access line, no spans);
* ``off-control``: the same as ``off`` again: two identical servers on this shared machine can
  differ by up to 15 % for as long as they run, and this row shows how far;
* ``json``: ``SMSO_LOG_FORMAT=json`` at info, every record and one access line per request,
  written to a file as a log collector would read them;
* ``tracing``: an OTLP endpoint set, so the request's span and the service's decode, queue
  and inference spans are exported (by the server's exporter process) in batches over
  http/protobuf to a collector in this process that counts what it receives;
* ``tracing-10%``: the same with one request in ten sampled.

The same load, ``/classify`` with one small PNG, runs against each in turn, in rounds whose order
rotates; each round gives each setting's requests per second as a ratio against ``off`` in that
round. ``--sets`` sets of fresh servers (their start order rotating) run ``--rounds`` rounds each,
and the median ratio over all rounds is the result (target: at least 0.95 each). Each round also
reads from ``/proc`` the CPU time per request of the server process and of its children (the
span exporter). Prints a markdown table and writes JSON.

    python -m bench.observability [--sets 5] [--rounds 3] [--requests 1000] [--clients 4] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bench.serve import ROOT, children_cpu_seconds, cpu_seconds, drive, multipart, running

MODEL = ROOT / "models" / "fashion-mnist-smso" / "model.onnx"
SETTINGS = ("off", "off-control", "json", "tracing", "tracing-10%")
RESULTS = ROOT / "bench" / "results" / "observability.json"


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/http endpoint that accepts every export and counts it."""

    exports = 0
    bytes = 0

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", 0))
        self.rfile.read(length)
        type(self).exports += 1
        type(self).bytes += length
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
    if setting.startswith("tracing"):
        env |= {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_SERVICE_NAME": "smso-bench",
            "OTEL_BSP_SCHEDULE_DELAY": "500",
        }
    if setting == "tracing-10%":  # what a busy service usually runs: one request in ten traced
        env |= {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}
    return env


@contextlib.contextmanager
def server(setting: str, endpoint: str, folder: Path, number: int = 0) -> Iterator[tuple[str, int]]:
    """``setting``'s server, its output (the logs) going to a file: its base URL and pid."""
    command = [sys.executable, "-m", "service.cli", "--model-path", str(MODEL), "--port", "{port}"]
    with (folder / f"{setting}-{number}.log").open("w") as logs:
        env = environment(setting, endpoint)
        with running(command, "/readyz", ROOT, env, output=logs) as (base, process):
            yield base, process.pid


def measure(args: argparse.Namespace) -> dict[str, Any]:
    image = png()
    rounds: list[dict[str, Any]] = []
    set_ratios: dict[str, list[float]] = {s: [] for s in SETTINGS}
    log_lines = dict.fromkeys(SETTINGS, 0)
    with collector() as endpoint, tempfile.TemporaryDirectory() as tmp:
        for number in range(args.sets):
            k = number % len(SETTINGS)  # which server starts first rotates too
            starting = SETTINGS[k:] + SETTINGS[:k]
            with contextlib.ExitStack() as stack:
                servers = {
                    s: stack.enter_context(server(s, endpoint, Path(tmp), number)) for s in starting
                }
                for base, _ in servers.values():  # warm each: connection set-up, first requests
                    drive(upload(f"{base}/classify", image, args.images), args.clients, 50)
                these = []
                for r in range(args.rounds):
                    k = (number + r) % len(SETTINGS)
                    runs = {}
                    for setting in SETTINGS[k:] + SETTINGS[:k]:
                        base, pid = servers[setting]
                        before = cpu_seconds(pid), children_cpu_seconds(pid)
                        run = drive(
                            upload(f"{base}/classify", image, args.images),
                            args.clients,
                            args.requests,
                        )
                        # the exporter process's last batch may come after; close enough
                        server_s = cpu_seconds(pid) - before[0]
                        children_s = children_cpu_seconds(pid) - before[1]
                        run["server_cpu_ms"] = server_s / args.requests * 1e3
                        run["exporter_cpu_ms"] = children_s / args.requests * 1e3
                        run.pop("latencies_ms")
                        runs[setting] = run
                    these.append(runs)
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
    exports, exported = _Collector.exports, _Collector.bytes
    summary = {}
    for setting in SETTINGS:
        ratios = [
            r[setting]["requests_per_second"] / r["off"]["requests_per_second"] for r in rounds
        ]
        summary[setting] = {
            "requests_per_second": statistics.median(
                r[setting]["requests_per_second"] for r in rounds
            ),
            "p50_ms": statistics.median(r[setting]["p50_ms"] for r in rounds),
            "p99_ms": statistics.median(r[setting]["p99_ms"] for r in rounds),
            "server_cpu_ms_per_request": statistics.median(
                r[setting]["server_cpu_ms"] for r in rounds
            ),
            "exporter_cpu_ms_per_request": statistics.median(
                r[setting]["exporter_cpu_ms"] for r in rounds
            ),
            "ratio_to_off": statistics.median(ratios),
            "round_ratios": ratios,
            "set_ratios": set_ratios[setting],
            "failures": sum(r[setting]["failures"] for r in rounds),
            "log_lines": log_lines[setting],
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
            "clients": args.clients,
            "route": "/classify",
            "image": "28x28 PNG",
            "images_per_request": args.images,
        },
        "settings": summary,
        "otlp": {"exports": exports, "bytes": exported},
        "rounds": rounds,
    }


def table(result: dict[str, Any]) -> str:
    rows = [
        "| setting | req/s (median) | p50 ms | p99 ms | ratio to off (median) | server sets "
        "| server CPU ms/request | exporter CPU ms/request |",
        "|---|--:|--:|--:|--:|---|--:|--:|",
    ]
    for setting, row in result["settings"].items():
        spread = ", ".join(f"{r:.2f}" for r in row["set_ratios"])
        rows.append(
            f"| {setting} | {row['requests_per_second']:,.0f} | {row['p50_ms']:.1f} | "
            f"{row['p99_ms']:.1f} | {row['ratio_to_off']:.3f} | {spread} | "
            f"{row['server_cpu_ms_per_request']:.3f} | {row['exporter_cpu_ms_per_request']:.3f} |"
        )
    otlp = result["otlp"]
    rows.append(
        f"\nOTLP exports received: {otlp['exports']} ({otlp['bytes']:,} bytes); "
        f"log lines: " + ", ".join(f"{s} {r['log_lines']}" for s, r in result["settings"].items())
    )
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
    parser.add_argument("--smoke", action="store_true", help="a seconds-long run (tests)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    args = parser.parse_args(argv)
    if not 1 <= args.images <= 16:  # one batch (SMSO_MAX_BATCH_SIZE=16 here) per request
        parser.error(f"--images must be between 1 and 16, not {args.images}")
    if args.smoke:
        args.sets, args.rounds, args.requests, args.clients = 1, 1, 60, 2
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = measure(args)
    print(table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
