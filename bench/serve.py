"""The service under load: requests per second and latency, against what its parts could do.

For each model, in one run:

* the real server (``smso-serve`` in a subprocess on loopback) is driven by ``--clients``
  concurrent connections of ``wrk`` (a C load generator, one thread: ``--driver``, httpx
  threads where wrk is not installed) posting JPEG files to ``/classify``, for ``--seconds``
  a load (ResNet-50: ``--resnet-seconds``), after a warm-up: requests and images
  per second, p50 / p95 / p99 latency, and the mean time per request split into decode, queue
  wait and inference (from the server's own metrics) and the rest (HTTP, multipart parsing,
  JSON: "response");
* what it is compared with, in ``--rounds`` interleaved rounds (this machine is shared and
  noisy: a ratio is taken per round, and the median reported): for the shipped model, a bare
  FastAPI endpoint on the same uvicorn that only reads the multipart upload; for ResNet-50, the
  raw onnxruntime session on the same preprocessed tensors at its best batch size;
* for the shipped model, the Open Inference Protocol beside ``/classify``: the same JPEGs sent
  to ``/v2/models/<name>/infer`` as binary ``BYTES`` and as preprocessed binary ``FP32``
  tensors, and the same tensors over gRPC (``ModelInfer`` with ``tritonclient.grpc``, on the
  same server), top-5 classification in all, in interleaved rounds.

* a GPU-like stand-in backend (``bench.lib.standin``: it sleeps as a GPU batch takes, with the
  card of ResNet-50 at 224 px) behind the real server, against bare endpoints reading the same
  requests: the serving path's own cost, which a GPU no longer hides.

Models: the shipped Fashion-MNIST model with 640x480 JPEG uploads (Fashion-MNIST test images
scaled up: real picture content), and ResNet-50 SMSO at 448 px, p = 2,048, random weights, with
the same JPEGs. Targets: ResNet-50 service images/s at 16 clients >= 0.85 of the raw session's;
shipped model requests/s >= 0.5 of the bare endpoint's. Also reports the server's resident memory.

    python -m bench.serve                   # both models (a few minutes on 2 cores)
    python -m bench.serve --quick           # the shipped model only, fewer requests
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib import RESULTS, SHIPPED, launch, report, wrk
from bench.lib.load import (
    Answered,
    Send,
    drive,
    drive_rounds,
    interleave,
    merge,
    multipart,
    post,
    ratios,
    rps,
)
from bench.lib.metrics import scrape, split
from bench.lib.payloads import (
    TOP5,
    Body,
    infer_body,
    jpegs,
    multipart_body,
    preprocessed,
    tensor_bodies,
)
from bench.lib.procfs import group_memory_mib
from bench.lib.resnet import resnet_model
from bench.lib.session import open_backend, raw_session
from bench.lib.standin import card as standin_card
from service.runtime.backend import read_card

#: A route and what it is sent: request i posts ``bodies[i % len(bodies)]`` to the URL.
Route = tuple[str, Sequence[Body]]


def route_rounds(
    args: argparse.Namespace, routes: dict[str, Route], clients: int, requests: int
) -> dict[str, list[dict[str, Any]]]:
    """Each of ``routes`` driven by ``clients`` concurrent clients in ``args.rounds``
    interleaved rounds: ``wrk`` for ``args.seconds`` a load (``--driver wrk``), or
    ``requests`` requests from Python threads (``--driver httpx``). Each route's loads."""
    if args.driver == "wrk":
        loads = {
            name: functools.partial(wrk.load, url, bodies, clients, args.seconds)
            for name, (url, bodies) in routes.items()
        }
        return interleave(loads, args.rounds)
    sends = {name: post(url, bodies) for name, (url, bodies) in routes.items()}
    return drive_rounds(sends, clients, requests, args.rounds)


def route_load(
    args: argparse.Namespace,
    route: Route,
    clients: int,
    requests: int,
    seconds: int | None = None,
    server: launch.Server | None = None,
) -> dict[str, Any]:
    """One load of ``route`` (:func:`route_rounds`, one round); with wrk, for ``seconds``
    (default ``args.seconds``), then ``server`` settled (:meth:`launch.Server.settle`: what
    wrk left in flight finished before anything else is timed)."""
    if args.driver != "wrk":
        return drive(post(*route), clients, requests)
    result = wrk.load(*route, clients, seconds or args.seconds)
    if server is not None:
        server.settle()
    return result


def uploads(url: str, files: Sequence[bytes]) -> Route:
    """``files`` uploaded to ``url`` as multipart parts named ``file``."""
    return url, [multipart_body(data, f"{i}.jpg") for i, data in enumerate(files)]


def serve_model(model: Path, max_batch: int, grpc_port: int = 0) -> launch.Server:
    """The real server on ``model``: HTTP on a free port, gRPC on ``grpc_port`` (0: none)."""
    settings = {"SMSO_MAX_BATCH_SIZE": str(max_batch), "SMSO_MAX_WAIT_MS": "5"}
    settings["SMSO_GRPC_PORT"] = str(grpc_port)
    return launch.smso_serve("--model-path", str(model), settings=settings)


def grpc_infer(target: str, name: str, tensors: np.ndarray) -> Send:
    """One preprocessed ``FP32`` tensor per ``ModelInfer`` over gRPC (``tritonclient.grpc``,
    raw tensor contents), asking for the top 5 classes as ``/classify`` does; each client
    thread has a channel of its own. The httpx client the load passes is not used."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    local = threading.local()

    def send(client: object, i: int) -> Answered:
        if not hasattr(local, "client"):
            local.client = grpcclient.InferenceServerClient(target)
        tensor = tensors[i % len(tensors)][None].astype(np.float32)
        image = grpcclient.InferInput("image", list(tensor.shape), "FP32")
        image.set_data_from_numpy(tensor)
        wanted = [grpcclient.InferRequestedOutput("logits", class_count=5)]
        try:
            local.client.infer(name, [image], outputs=wanted)
        except InferenceServerException as error:
            return Answered(500, type(error).__name__)
        return Answered(200)

    return send


def protocol_case(
    base: str, grpc_target: str, files: list[bytes], args: argparse.Namespace
) -> dict[str, Any]:
    """The same JPEGs through ``/classify`` (multipart), the protocol's ``infer`` with image
    bytes, and with preprocessed binary tensors over REST and over gRPC, in interleaved
    rounds."""
    card = read_card(SHIPPED)
    infer = f"{base}/v2/models/{card.name}/infer"
    sends = {
        "/classify multipart JPEG": multipart(f"{base}/classify", files),
        "/v2 infer, JPEG as binary BYTES": post(infer, [infer_body(f, TOP5) for f in files]),
        "/v2 infer, preprocessed binary FP32": post(infer, tensor_bodies(card, files)),
        "gRPC ModelInfer, preprocessed FP32": grpc_infer(
            grpc_target, card.name, preprocessed(card, files)
        ),
    }
    runs = drive_rounds(sends, args.clients, args.requests // args.rounds, args.rounds)
    return {name: merge(loads) for name, loads in runs.items()}


def shipped_case(args: argparse.Namespace, files: list[bytes]) -> dict[str, Any]:
    """The shipped model's service against the bare endpoint, in interleaved rounds (both
    servers up, one driven at a time); then the protocol routes; then the raw session."""
    grpc_port = launch.free_port()
    with launch.bare() as bare, serve_model(SHIPPED, 16, grpc_port) as server:
        routes = {
            "bare": uploads(f"{bare.base}/upload", files),
            "service": uploads(f"{server.base}/classify", files),
        }
        drive(post(*routes["bare"]), args.clients, args.clients)
        drive(post(*routes["service"]), args.clients, max(args.clients, args.requests // 10))
        before = scrape(f"{server.base}/metrics")
        runs = route_rounds(args, routes, args.clients, args.requests // args.rounds)
        after = scrape(f"{server.base}/metrics")
        memory = server.rss_mib() | group_memory_mib(os.getpgid(server.pid))
        protocols = protocol_case(server.base, f"127.0.0.1:{grpc_port}", files, args)
    served = merge(runs["service"])
    backend = open_backend(SHIPPED)
    tensors = preprocessed(backend.card, files)
    return {
        "bare": merge(runs["bare"]),
        "service": {
            "model": "fashion-mnist (shipped)",
            **served,
            "images_per_second": served["requests_per_second"],
            "split": split(before, after, served["mean_ms"]),
            "memory_mib": memory,
            "protocols": protocols,
        },
        "raw": raw_session(backend, (1, 16, 64, 256), 3.0, tensors, warmups=1, calls=3),
        **ratios(rps(runs["service"]), rps(runs["bare"])),
    }


def standin_case(args: argparse.Namespace, files: list[bytes]) -> dict[str, Any]:
    """The serving path with a GPU-like backend (1.3 ms + 0.19 ms per image, ResNet-50's card at
    224 px): ``/classify`` JPEGs against the bare multipart endpoint, ``/v2`` binary FP32
    tensors against a bare endpoint that reads the same bodies, in interleaved rounds at
    ``--clients``; then one client at a time, whose extra latency over the bare endpoint, less
    decoding and the backend's own time (from the server's metrics), is the service's overhead
    per request: queueing, thread hops, parsing and answering."""
    card = standin_card()
    bodies = tensor_bodies(card, files)
    per_round = args.requests // args.rounds
    results: dict[str, Any] = {}
    with launch.bare() as bare, launch.standin("--max-batch-size", "64") as server:
        pairs: dict[str, dict[str, Route]] = {
            "/classify multipart JPEG": {
                "bare": uploads(f"{bare.base}/upload", files),
                "service": uploads(f"{server.base}/classify", files),
            },
            "/v2 infer, preprocessed binary FP32": {
                "bare": (f"{bare.base}/body", bodies),
                "service": (f"{server.base}/v2/models/{card.name}/infer", bodies),
            },
        }
        for name, routes in pairs.items():
            for route in routes.values():
                drive(post(*route), args.clients, args.clients)
            runs = route_rounds(args, routes, args.clients, per_round)
            one_bare = route_load(args, routes["bare"], 1, per_round // 2)
            before = scrape(f"{server.base}/metrics")
            one = route_load(args, routes["service"], 1, per_round // 2)
            stages = split(before, scrape(f"{server.base}/metrics"), one["mean_ms"])
            results[name] = {
                "bare": merge(runs["bare"]),
                "service": merge(runs["service"]),
                **ratios(rps(runs["service"]), rps(runs["bare"])),
                "one_client": {
                    "bare_p50_ms": one_bare["p50_ms"],
                    "service_p50_ms": one["p50_ms"],
                    "decode_ms": stages["decode_ms"],
                    "inference_ms": stages["inference_ms"],
                    "overhead_ms": one["p50_ms"]
                    - one_bare["p50_ms"]
                    - stages["decode_ms"]
                    - stages["inference_ms"],
                },
            }
    return results


def resnet_case(args: argparse.Namespace, files: list[bytes]) -> dict[str, Any]:
    """ResNet-50 SMSO's service against its raw session at its best batch size, in interleaved
    rounds (the raw session runs while the server is idle)."""
    per_round = max(args.clients, args.resnet_requests // args.rounds)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        model = resnet_model(Path(tmp))
        backend = open_backend(model)
        tensors = preprocessed(backend.card, files[:8])
        raw = raw_session(backend, (1, 4, 8, 16), 3.0, tensors, warmups=1, calls=3)
        best = functools.partial(raw_session, backend, (raw["best_batch"],), 5.0, tensors, 1, 3)
        with serve_model(model, args.clients) as server:
            classify = uploads(f"{server.base}/classify", files)
            drive(post(*classify), args.clients, args.clients)
            before = scrape(f"{server.base}/metrics")
            runs: dict[str, list[Any]] = interleave(
                {
                    "service": functools.partial(
                        route_load,
                        args,
                        classify,
                        args.clients,
                        per_round,
                        args.resnet_seconds,
                        server,
                    ),
                    "raw": lambda: best()["images_per_second"],
                },
                args.rounds,
            )
            after = scrape(f"{server.base}/metrics")
    served = merge(runs["service"])
    raw["images_per_second_by_round"] = runs["raw"]
    return {
        "service": {
            "model": "resnet50 p=2048 448 px",
            **served,
            "images_per_second": served["requests_per_second"],
            "split": split(before, after, served["mean_ms"]),
        },
        "raw": raw,
        **ratios(rps(runs["service"]), runs["raw"]),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=800, help="shipped model, per load")
    parser.add_argument("--resnet-requests", type=int, default=144)
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per comparison")
    parser.add_argument(
        "--driver",
        choices=("wrk", "httpx"),
        default="wrk" if wrk.available() else "httpx",
        help="what drives the HTTP loads against the bare endpoints and the raw session: wrk "
        "(a C load generator, the default where it is installed) or httpx threads (the "
        "protocol comparison, gRPC among it, always uses Python clients)",
    )
    parser.add_argument("--seconds", type=int, default=4, help="wrk: seconds per load")
    parser.add_argument(
        "--resnet-seconds",
        type=int,
        default=20,
        help="wrk: seconds per load of ResNet-50 (its requests take seconds: a short load "
        "would count the ramp-up and leave much of its work in flight)",
    )
    parser.add_argument("--quick", action="store_true", help="the shipped model only")
    parser.add_argument("--json", type=Path, default=RESULTS / "serve.json")
    return parser.parse_args(argv)


def latency_cells(load: dict[str, Any]) -> list[str]:
    """Requests/s and the p50, p95 and p99 latencies of a load, as table cells."""
    return [f"{load[k]:.1f}" for k in ("requests_per_second", "p50_ms", "p95_ms", "p99_ms")]


def by_round(values: Sequence[float], form: str = ".2f") -> str:
    return ", ".join(f"{x:{form}}" for x in values)


def print_tables(shipped: dict[str, Any], resnet: dict[str, Any] | None) -> None:
    cases = [
        ("bare FastAPI upload", shipped["bare"], None),
        ("fashion-mnist service", shipped["service"], shipped["raw"]),
    ]
    if resnet is not None:
        cases.append(("resnet50 p=2048 service", resnet["service"], resnet["raw"]))
    stages = ("decode_ms", "queue_ms", "inference_ms", "response_ms")
    rows = [
        [
            name,
            *latency_cells(r),
            *(f"{r['split'][k]:.1f}" if "split" in r else "-" for k in stages),
            f"{raw['images_per_second']:.1f} ({raw['best_batch']})" if raw else "-",
        ]
        for name, r, raw in cases
    ]
    header = ["what", "req/s", "p50 ms", "p95 ms", "p99 ms", "decode ms", "queue ms"]
    header += ["inference ms", "response ms", "raw session img/s (batch)"]
    print(report.markdown_table(header, rows))
    print(
        f"\nshipped model: service req/s / bare endpoint req/s = {shipped['ratio']:.2f} "
        f"(median of rounds: {by_round(shipped['ratio_by_round'])}; target >= 0.5)"
    )
    if resnet is not None:
        print(
            f"resnet50 p=2048: service img/s / raw session img/s = {resnet['ratio']:.2f} "
            f"(median of rounds: {by_round(resnet['ratio_by_round'])}; target >= 0.85)"
        )
    print(
        "\nOpen Inference Protocol over REST and gRPC, shipped model, same JPEGs (interleaved "
        "rounds):\n"
    )
    protocols = shipped["service"]["protocols"]
    rows = [
        [route, *latency_cells(r), by_round(r["rounds_rps"], ".0f")]
        for route, r in protocols.items()
    ]
    header = ["route", "req/s", "p50 ms", "p95 ms", "p99 ms", "req/s by round"]
    print(report.markdown_table(header, rows))
    grpc = grpc_over_rest(protocols)
    print(
        f"\ngRPC / REST, preprocessed FP32 tensors: {grpc['ratio']:.2f} (median of rounds: "
        f"{by_round(grpc['ratio_by_round'])}; target >= 1)\n"
    )
    memory = shipped["service"]["memory_mib"]
    print(
        f"server memory with the shipped model, its {memory['processes']} processes: PSS "
        f"{memory['pss_mib']:.0f} MiB, RSS {memory['rss_mib']:.0f} MiB (the first process "
        f"alone: {memory['VmRSS']:.0f} MiB, peak {memory['VmHWM']:.0f} MiB)"
    )


def grpc_over_rest(protocols: dict[str, Any]) -> dict[str, Any]:
    """gRPC's requests/s over REST's for the same preprocessed tensors, per round and median."""
    grpc = protocols["gRPC ModelInfer, preprocessed FP32"]["rounds_rps"]
    return ratios(grpc, protocols["/v2 infer, preprocessed binary FP32"]["rounds_rps"])


def print_standin(results: dict[str, Any]) -> None:
    print(
        "\nGPU-like stand-in backend (1.3 ms + 0.19 ms per image; ResNet-50's card at 224 px), "
        "against a bare endpoint reading the same requests (interleaved rounds):\n"
    )
    rows = []
    for name, r in results.items():
        one, service = r["one_client"], r["service"]
        rows.append(
            [
                name,
                f"{service['requests_per_second']:.1f}",
                f"{r['bare']['requests_per_second']:.1f}",
                f"{r['ratio']:.2f} ({by_round(r['ratio_by_round'])})",
                f"{service['p50_ms']:.1f} / {service['p99_ms']:.1f}",
                *(f"{one[k]:.2f}" for k in ("service_p50_ms", "bare_p50_ms", "decode_ms")),
                *(f"{one[k]:.2f}" for k in ("inference_ms", "overhead_ms")),
            ]
        )
    header = ["route", "service req/s", "bare req/s", "ratio (rounds)", "service p50 / p99 ms"]
    header += ["1 client: service p50 ms", "bare p50 ms", "decode ms", "backend ms", "overhead ms"]
    print(report.markdown_table(header, rows))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    files = jpegs(32)
    shipped = shipped_case(args, files)
    stand_in = standin_case(args, files)
    resnet = None if args.quick else resnet_case(args, files)
    print_tables(shipped, resnet)
    print_standin(stand_in)
    ratio_names = {"shipped_rps_over_bare": shipped["ratio"]}
    ratio_names["grpc_over_rest_fp32"] = grpc_over_rest(shipped["service"]["protocols"])["ratio"]
    ratio_names |= {
        f"standin {name}: service over bare": r["ratio"] for name, r in stand_in.items()
    }
    if resnet is not None:
        ratio_names["resnet_service_over_raw"] = resnet["ratio"]
    cases = [c for c in (shipped, resnet) if c is not None]
    payload = {
        "settings": vars(args),
        "bare": shipped["bare"],
        "cases": [
            {"service": c["service"], "raw": c["raw"], "ratio_by_round": c["ratio_by_round"]}
            for c in cases
        ],
        "standin": stand_in,
        "ratios": ratio_names,
    }
    report.save(args.json, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
