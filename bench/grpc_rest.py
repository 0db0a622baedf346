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
import statistics
import threading
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench.lib import RESULTS, SHIPPED, launch, report
from bench.lib.load import Answered, Send, drive, drive_rounds, rps


def senders(http_url: str, grpc_url: str, name: str, tensor: np.ndarray) -> dict[str, Send]:
    """One send per protocol, each client thread with clients of its own (tritonclient.http's
    gevent client serves only the thread that made it); the load's httpx client is not used."""
    local = threading.local()
    outputs = ("logits", "embedding")

    def rest_send(client: object, i: int) -> Answered:
        if not hasattr(local, "rest"):
            local.rest = httpclient.InferenceServerClient(http_url)
        tensors = httpclient.InferInput("image", list(tensor.shape), "FP32")
        tensors.set_data_from_numpy(tensor, binary_data=True)
        wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in outputs]
        local.rest.infer(name, [tensors], outputs=wanted).as_numpy("embedding")
        return Answered(200)

    def grpc_send(client: object, i: int) -> Answered:
        if not hasattr(local, "grpc"):
            local.grpc = grpcclient.InferenceServerClient(grpc_url)
        tensors = grpcclient.InferInput("image", list(tensor.shape), "FP32")
        tensors.set_data_from_numpy(tensor)
        wanted = [grpcclient.InferRequestedOutput(n) for n in outputs]
        local.grpc.infer(name, [tensors], outputs=wanted).as_numpy("embedding")
        return Answered(200)

    return {"rest": rest_send, "grpc": grpc_send}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=400, help="per protocol and round")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8, help="images per request")
    parser.add_argument("--json", type=Path, default=RESULTS / "grpc.json")
    args = parser.parse_args(argv)

    grpc_port = launch.free_port()
    settings = {"SMSO_GRPC_PORT": str(grpc_port)}
    with launch.smso_serve("--model-path", str(SHIPPED), settings=settings) as server:
        name = httpx.get(f"{server.base}/metadata").json()["model"]["name"]
        rng = np.random.default_rng(0)
        tensor = rng.standard_normal((args.batch, 1, 28, 28)).astype(np.float32)
        sends = senders(f"127.0.0.1:{server.port}", f"127.0.0.1:{grpc_port}", name, tensor)
        for send in sends.values():  # warm-up: connections, batcher, onnxruntime
            drive(send, args.clients, args.requests // 4)
        runs = drive_rounds(sends, args.clients, args.requests, args.rounds, alternate=True)
    rounds = [
        {"rest": rest, "grpc": grpc, "ratio": grpc / rest}
        for rest, grpc in zip(rps(runs["rest"]), rps(runs["grpc"]), strict=True)
    ]
    median = statistics.median(r["ratio"] for r in rounds)
    rows = [
        [str(i + 1), f"{r['rest']:,.0f}", f"{r['grpc']:,.0f}", report.format_ratio(r["ratio"])]
        for i, r in enumerate(rounds)
    ]
    medians = [f"{statistics.median(r[p] for r in rounds):,.0f}" for p in ("rest", "grpc")]
    rows.append(["median", *medians, report.format_ratio(median)])
    print(
        f"FP32 [{args.batch}, 1, 28, 28] binary tensors, {args.clients} clients, "
        f"{args.requests} requests per protocol and round (requests/s)"
    )
    print(report.markdown_table(["round", "REST", "gRPC", "gRPC / REST"], rows))
    report.save(args.json, {"settings": vars(args), "rounds": rounds, "median_ratio": median})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
