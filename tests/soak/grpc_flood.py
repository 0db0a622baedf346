"""A hostile client's gRPC flood: does the server hold messages it should refuse?

Each case of :func:`case` starts the real server (the shipped model, an API key set, gRPC on a
free port), sends ``calls`` concurrent ``ModelInfer`` calls of ``mib`` MiB each, and reads the
server's resident memory (``VmRSS``) before, its peak (``VmHWM``) and after the calls have ended:

* ``no key``: the calls carry no API key (UNAUTHENTICATED is the answer);
* ``over the size limit``: the calls carry the key, but the message is larger than the server's
  ``max_request_bytes`` (set to a quarter of the message).

A server that refuses these before holding the message stays near its idle memory.

:func:`reset_case` is the rapid reset (CVE-2023-44487's pattern): on a fresh server without a
key, ``rounds`` rounds, each a new HTTP/2 connection opening ``streams`` ModelInfer calls and
cancelling each at once (RST_STREAM after its headers, :func:`tests.soak.hostile.rapid_reset`),
while two other clients send valid calls throughout; it reports the valid calls' statuses (none
may be CANCELLED), how each round ended, and the server's memory before, at its peak and 3 s
after the last round.

``make soak`` runs both floods of 24 x 60 MiB and 20 rounds of 20,000 reset streams
(``tests/soak/test_grpc_flood.py``); ``tests/service/grpc`` asserts smaller ones on every run.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import grpc
import httpx
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from bench.lib import SHIPPED, launch, report
from bench.lib.load import Answered, Send, drive
from tests.soak.hostile import rapid_reset

KEY = "flood-test-key"


def _message(model: str, mib: int) -> Any:
    """A ModelInfer request of ``mib`` MiB: one BYTES input whose raw contents are zeros."""
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="image_bytes", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(bytes(mib * 2**20))
    return request


def _call(target: str, request: Any, key: str | None) -> Send:
    """A ModelInfer call on a channel of its own; a refusal is counted by its status code."""
    metadata = () if key is None else (("x-api-key", key),)
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]

    def send(client: object, i: int) -> Answered:
        with grpc.insecure_channel(target, options=options) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            try:
                stub.ModelInfer(request, metadata=metadata, timeout=120)
            except grpc.RpcError as error:
                return Answered(0, error.code().name)
            return Answered(200)

    return send


def case(name: str, calls: int, mib: int, key: str | None, max_request: int) -> dict[str, Any]:
    """One fresh server, one flood: its memory before, at peak and after, and the answers."""
    grpc_port = launch.free_port()
    settings = {
        "SMSO_API_KEY": KEY,
        "SMSO_GRPC_PORT": str(grpc_port),
        "SMSO_MAX_REQUEST_BYTES": str(max_request),
        "SMSO_MAX_BUFFERED_BYTES": str(max(max_request, 256 * 2**20)),
        "SMSO_WORKERS": "1",  # one process: its memory is the server's
    }
    with launch.smso_serve("--model-path", str(SHIPPED), settings=settings) as server:
        # the name does not matter: the key and the size are checked before the model
        send = _call(f"127.0.0.1:{grpc_port}", _message("fashion-mnist", mib), key)
        time.sleep(1.0)
        before = server.rss_mib()["VmRSS"]
        flood = drive(send, calls, calls)  # every call at once
        time.sleep(2.0)  # what the server still holds once the calls have ended
        after = server.rss_mib()
    return {
        "case": name,
        "calls": calls,
        "message_mib": mib,
        "max_request_bytes": max_request,
        "codes": {("OK" if k == "200" else k): v for k, v in flood["outcomes"].items()},
        "seconds": round(flood["seconds"], 2),
        "rss_before_mib": round(before, 1),
        "rss_peak_mib": round(after["VmHWM"], 1),
        "rss_after_mib": round(after["VmRSS"], 1),
    }


def _valid_calls(target: str, model: str, stop: threading.Event, codes: Counter[str]) -> None:
    """Valid ModelInfer calls (one preprocessed image) one after another until ``stop``."""
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="image", datatype="FP32", shape=[1, 1, 28, 28])
    request.raw_input_contents.append(bytes(4 * 28 * 28))
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        while not stop.is_set():
            try:
                stub.ModelInfer(request, timeout=60)
                codes["OK"] += 1
            except grpc.RpcError as error:
                codes[error.code().name] += 1


def reset_case(rounds: int, streams: int) -> dict[str, Any]:
    """One fresh server, ``rounds`` rapid-reset connections of ``streams`` streams each, valid
    calls alongside: their statuses, each round's end and the server's memory."""
    grpc_port = launch.free_port()
    settings = {"SMSO_GRPC_PORT": str(grpc_port), "SMSO_WORKERS": "1"}
    with launch.smso_serve("--model-path", str(SHIPPED), settings=settings) as server:
        target = f"127.0.0.1:{grpc_port}"
        model = httpx.get(f"{server.base}/metadata").json()["model"]["name"]
        time.sleep(1.0)
        before = server.rss_mib()["VmRSS"]
        stop, codes = threading.Event(), Counter[str]()
        clients = [
            threading.Thread(target=_valid_calls, args=(target, model, stop, codes))
            for _ in range(2)
        ]
        for client in clients:
            client.start()
        start = time.perf_counter()
        ends = Counter(rapid_reset(grpc_port, streams) for _ in range(rounds))
        seconds = time.perf_counter() - start
        stop.set()
        for client in clients:
            client.join()
        time.sleep(3.0)
        after = server.rss_mib()
    return {
        "case": "rapid reset",
        "rounds": rounds,
        "streams_per_round": streams,
        "valid_calls": dict(codes),
        "rounds_ended": dict(ends),
        "seconds": round(seconds, 2),
        "rss_before_mib": round(before, 1),
        "rss_peak_mib": round(after["VmHWM"], 1),
        "rss_after_mib": round(after["VmRSS"], 1),
    }


def flood_table(results: list[dict[str, Any]]) -> str:
    """:func:`case`'s results as a markdown table, a row each."""
    rows = [
        [
            r["case"],
            f"{r['calls']} x {r['message_mib']}",
            ", ".join(f"{k} {v}" for k, v in sorted(r["codes"].items())),
            *(f"{r[k]:.0f}" for k in ("rss_before_mib", "rss_peak_mib", "rss_after_mib")),
            f"{r['seconds']:.1f}",
        ]
        for r in results
    ]
    header = ["case", "calls x MiB", "answers", "RSS before MiB", "peak MiB", "after MiB"]
    return report.markdown_table([*header, "seconds"], rows)


def reset_table(result: dict[str, Any]) -> str:
    """:func:`reset_case`'s result as a markdown table of one row."""
    row = [
        f"{result['rounds']} x {result['streams_per_round']:,}",
        ", ".join(f"{k} {v}" for k, v in sorted(result["valid_calls"].items())),
        ", ".join(f"{k} {v}" for k, v in sorted(result["rounds_ended"].items())),
        *(f"{result[k]:.0f}" for k in ("rss_before_mib", "rss_peak_mib", "rss_after_mib")),
        f"{result['seconds']:.1f}",
    ]
    header = ["rounds x streams", "valid calls", "rounds ended", "RSS before MiB"]
    return report.markdown_table([*header, "peak MiB", "after MiB", "seconds"], [row])
