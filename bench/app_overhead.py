"""The app's own CPU per request on the event loop, through ASGI alone (no sockets, no HTTP).

What the event-loop thread spends on one request beyond the network: middleware, routing,
dependencies, reading the body, parsing, the hand-off to the batcher and back, the answer. The
backend is the GPU-like stand-in (``bench.lib.standin``) with no sleep, so the inference thread
costs only its copy; requests go one at a time through ``app(scope, receive, send)``, the body in
64 kB chunks as uvicorn delivers them. Measured with ``time.thread_time()`` of the loop's thread
(its CPU only: waits for the inference thread do not count), for two arrangements of the routes
in interleaved rounds (this machine is shared and noisy):

* **included**: ``app.include_router`` for the service's and the Open Inference Protocol's
  routers, as FastAPI's tutorials do (FastAPI 0.16x matches an included router's routes behind
  a wrapper, once to pick the router and again inside it);
* **flat**: what ``service.app.create_app`` does: the routes in the app's own list, the image
  routes first.

    python -m bench.app_overhead            # /v2 binary FP32 and /classify JPEG, about a minute
    python -m bench.app_overhead --quick    # fewer requests and rounds (a smoke test)

Prints a markdown table and writes ``bench/results/app_overhead.json`` (``--json PATH``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.lib import RESULTS, report
from bench.lib.payloads import Body, jpegs, multipart_body, tensor_bodies
from bench.lib.standin import StandinBackend, card
from service.app import create_app
from service.core.settings import Settings
from service.http.oip import build_router
from service.http.routes import build_routes

ARRANGEMENTS = ("included", "flat")
CHUNK = 65536  # what uvicorn hands the app per message at most, about


def include_routers(app: Any) -> None:
    """Replace the app's flat routes by the two routers, included."""
    routers = (build_routes(), build_router())
    ours = {getattr(route, "path", None) for router in routers for route in router.routes}
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in ours]
    app.include_router(build_routes())
    app.include_router(build_router())


def request(path: str, body: Body) -> tuple[dict[str, Any], list[bytes]]:
    """An ASGI HTTP scope for ``POST path`` with ``body`` and the body's chunks."""
    raw = [(k.lower().encode(), v.encode()) for k, v in body.headers.items()]
    raw += [(b"host", b"bench"), (b"content-length", str(len(body.data)).encode())]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": raw,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
    data = body.data
    return scope, [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]


async def call(app: Any, scope: dict[str, Any], chunks: list[bytes]) -> int:
    """One request through the app; its status."""
    sent = 0
    status = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent < len(chunks):
            sent += 1
            more = sent < len(chunks)
            return {"type": "http.request", "body": chunks[sent - 1], "more_body": more}
        await asyncio.sleep(3600)  # the client stays: no disconnect
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(dict(scope), receive, send)
    return status[0]


async def lifespan(app: Any) -> Callable[[], Any]:
    """Start the app's lifespan (the model loads, the batcher starts); returns its stop."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    task = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, outbox.put)
    )
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the app did not start: {started}")
    # the model loads and warms up after start-up: wait until /readyz answers 200
    scope, chunks = request("/readyz", Body(b"", {}))
    scope["method"] = "GET"
    deadline = time.monotonic() + 120
    while await call(app, scope, chunks) != 200:
        if time.monotonic() > deadline:
            raise RuntimeError("the app was not ready within 120 s")
        await asyncio.sleep(0.05)

    async def stop() -> None:
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await task

    return stop


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    files = jpegs(4)
    model = card()
    settings = Settings(log_level="warning")
    apps = {name: create_app(settings, StandinBackend(0.0, 0.0)) for name in ARRANGEMENTS}
    include_routers(apps["included"])
    routes = {
        "/v2 binary FP32": [
            request(f"/v2/models/{model.name}/infer", body) for body in tensor_bodies(model, files)
        ],
        "/classify JPEG": [request("/classify", multipart_body(data)) for data in files],
    }
    stops = [await lifespan(app) for app in apps.values()]
    rows = []
    try:
        for route, requests in routes.items():
            for app in apps.values():  # warm: first calls, caches
                for i in range(20):
                    await call(app, *requests[i % len(requests)])
            ms: dict[str, list[float]] = {name: [] for name in ARRANGEMENTS}
            for _ in range(args.rounds):
                for name, app in apps.items():
                    start = time.thread_time()
                    for i in range(args.requests):
                        status = await call(app, *requests[i % len(requests)])
                        if status != 200:
                            raise RuntimeError(f"{route} answered {status} ({name})")
                    ms[name].append(1e3 * (time.thread_time() - start) / args.requests)
            ratios = [i / f for i, f in zip(ms["included"], ms["flat"], strict=True)]
            rows.append(
                {
                    "route": route,
                    "loop_cpu_ms": {name: statistics.median(v) for name, v in ms.items()},
                    "rounds_ms": ms,
                    "included_over_flat": statistics.median(ratios),
                }
            )
    finally:
        for stop in stops:
            await stop()
    return {"rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="per round and arrangement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="30 requests, 2 rounds")
    parser.add_argument("--json", type=Path, default=RESULTS / "app_overhead.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.rounds = 30, 2
    result = {
        "python": report.machine()["python"],
        "requests": args.requests,
        "rounds": args.rounds,
        **asyncio.run(measure(args)),
    }
    print("Event-loop CPU per request through ASGI (ms, median of rounds):\n")
    rows = [
        [
            row["route"],
            *(f"{row['loop_cpu_ms'][name]:.3f}" for name in ARRANGEMENTS),
            report.format_ratio(row["included_over_flat"]),
        ]
        for row in result["rows"]
    ]
    header = ["route", "included routers", "flat, image routes first", "included / flat"]
    print(report.markdown_table(header, rows), end="\n\n")
    report.save(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
