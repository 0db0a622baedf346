"""The Open Inference Protocol over gRPC against REST: requests per second on the same server.

One ``smso-serve`` (the shipped model, HTTP and gRPC in one process) is driven in ``--rounds``
interleaved rounds by ``--clients`` concurrent clients, each sending preprocessed ``FP32``
tensors of ``--batch`` images: through ``tritonclient.http`` (binary tensor data) and through
``tritonclient.grpc`` (raw tensor contents), both asking for ``logits`` and ``embedding``. The
machine is shared and noisy, so the gRPC / REST ratio is taken per round and its median
reported (target: >= 1, gRPC no slower than REST for binary tensors).

    python -m bench.grpc_rest                    # 5 rounds of 400 requests each way
    python -m bench.grpc_rest --rounds 3 --requests 200
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench.benchlib import format_ratio, markdown_table, write_json
from bench.serve import SHIPPED, free_port, running

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "bench" / "results" / "grpc.json"


def drive(
    pool: concurrent.futures.ThreadPoolExecutor, send: Callable[[], object], requests: int
) -> float:
    """Requests per second of the ``pool``'s threads sending ``requests`` in all."""
    start = time.perf_counter()
    list(pool.map(lambda _: send(), range(requests)))
    return requests / (time.perf_counter() - start)


def senders(http_url: str, grpc_url: str, name: str, tensor: np.ndarray) -> dict[str, Callable]:
    """One send per protocol, each thread with clients of its own (tritonclient.http's gevent
    client serves only the thread that made it)."""
    local = threading.local()

    def rest_send() -> object:
        if not hasattr(local, "rest"):
            local.rest = httpclient.InferenceServerClient(http_url)
        tensors = httpclient.InferInput("image", list(tensor.shape), "FP32")
        tensors.set_data_from_numpy(tensor, binary_data=True)
        outputs = [
            httpclient.InferRequestedOutput(n, binary_data=True) for n in ("logits", "embedding")
        ]
        return local.rest.infer(name, [tensors], outputs=outputs).as_numpy("embedding")

    def grpc_send() -> object:
        if not hasattr(local, "grpc"):
            local.grpc = grpcclient.InferenceServerClient(grpc_url)
        tensors = grpcclient.InferInput("image", list(tensor.shape), "FP32")
        tensors.set_data_from_numpy(tensor)
        outputs = [grpcclient.InferRequestedOutput(n) for n in ("logits", "embedding")]
        return local.grpc.infer(name, [tensors], outputs=outputs).as_numpy("embedding")

    return {"rest": rest_send, "grpc": grpc_send}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=400, help="per protocol and round")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8, help="images per request")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)

    grpc_port = free_port()
    command = [
        sys.executable,
        "-m",
        "service.cli",
        "--model-path",
        str(SHIPPED),
        "--port",
        "{port}",
        "--grpc-port",
        str(grpc_port),
        "--log-level",
        "warning",
    ]
    with running(command, "/readyz", ROOT) as (base, _):
        port = base.rsplit(":", 1)[1]
        name = httpx.get(f"{base}/metadata").json()["model"]["name"]
        rng = np.random.default_rng(0)
        tensor = rng.standard_normal((args.batch, 1, 28, 28)).astype(np.float32)
        send = senders(f"127.0.0.1:{port}", f"127.0.0.1:{grpc_port}", name, tensor)
        rounds = []
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:  # one per client
            for fn in send.values():  # warm-up: connections, batcher, onnxruntime
                drive(pool, fn, args.requests // 4)
            for i in range(args.rounds):
                order = ("rest", "grpc") if i % 2 == 0 else ("grpc", "rest")
                measured = {p: drive(pool, send[p], args.requests) for p in order}
                rounds.append(measured | {"ratio": measured["grpc"] / measured["rest"]})

    rows = [
        [str(i + 1), f"{r['rest']:,.0f}", f"{r['grpc']:,.0f}", format_ratio(r["ratio"])]
        for i, r in enumerate(rounds)
    ]
    median = statistics.median(r["ratio"] for r in rounds)
    rows.append(
        [
            "median",
            f"{statistics.median(r['rest'] for r in rounds):,.0f}",
            f"{statistics.median(r['grpc'] for r in rounds):,.0f}",
            format_ratio(median),
        ]
    )
    print(
        f"FP32 [{args.batch}, 1, 28, 28] binary tensors, {args.clients} clients, "
        f"{args.requests} requests per protocol and round (requests/s)"
    )
    print(markdown_table(["round", "REST", "gRPC", "gRPC / REST"], rows))
    write_json(
        args.json,
        {
            "settings": vars(args) | {"json": str(args.json)},
            "rounds": rounds,
            "median_ratio": median,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
