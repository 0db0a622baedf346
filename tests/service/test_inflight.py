"""Requests in progress are bounded over both doors (``SMSO_MAX_CONNECTIONS``): beyond it a
request is refused at once with the service's JSON 503 and ``Retry-After`` (gRPC:
RESOURCE_EXHAUSTED), counted, while health checks stay answered; idle connections take no
place (uvicorn's own limit counted them and answered every request in plain text)."""

from __future__ import annotations

import io
import os
import socket
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import pytest
from PIL import Image
from tritonclient.grpc import service_pb2_grpc

from tests.service.conftest import free_port
from tests.service.grpc.test_grpc import raw_fp32_request
from tests.service.test_server import real_server


def pngs(count: int) -> list[tuple[str, tuple[str, bytes, str]]]:
    rng = np.random.default_rng(0)
    files = []
    for i in range(count):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(buffer, "PNG")
        files.append(("file", (f"{i}.png", buffer.getvalue(), "image/png")))
    return files


def refused_total(base: str) -> float:
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith('smso_requests_refused_total{limit="max_connections"}'):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.slow
def test_beyond_the_limit_requests_are_a_json_503_over_http_and_resource_exhausted_over_grpc(
    shipped_model,
):
    grpc_port = free_port()
    env = os.environ | {"SMSO_MAX_CONNECTIONS": "2", "SMSO_LOG_LEVEL": "warning"}
    with real_server(shipped_model, "--grpc-port", str(grpc_port), env=env) as (base, _):
        files = pngs(48)
        name = httpx.get(f"{base}/metadata").json()["model"]["name"]
        request = raw_fp32_request(name, 64)

        def post(_: int) -> httpx.Response:
            return httpx.post(f"{base}/classify", files=files, timeout=120)

        def call(_: int) -> str:
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                try:
                    stub.ModelInfer(request, timeout=120)
                except grpc.RpcError as error:
                    return f"{error.code().name}: {error.details()}"
                return "OK"

        with ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(post, range(16)))
            codes = list(pool.map(call, range(16)))
            health = [httpx.get(f"{base}/healthz").status_code for _ in range(5)]
        statuses = {a.status_code for a in answers}
        assert statuses <= {200, 503}, statuses
        assert 503 in statuses
        refused = [a for a in answers if a.status_code == 503]
        assert refused[0].json()["error"]["code"] == "overloaded"
        assert refused[0].headers["retry-after"] == "1"
        full = (
            "RESOURCE_EXHAUSTED: the server has 2 requests in progress (max_connections); "
            "retry shortly"
        )
        assert set(codes) <= {"OK", full}, set(codes)
        assert full in codes
        assert health == [200] * 5
        expected = len(refused) + codes.count(full)
        assert refused_total(base) == expected


def test_idle_connections_take_no_place_and_probes_are_always_answered(shipped_model):
    """300 connections that send nothing, against a limit of 50 requests in progress: the
    health checks and an inference are answered as usual (uvicorn's limit_concurrency counted
    every connection and answered all of them with a plain-text 503)."""
    env = os.environ | {"SMSO_MAX_CONNECTIONS": "50", "SMSO_LOG_LEVEL": "warning"}
    with real_server(shipped_model, env=env) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(300)]
        try:
            for path in ("/healthz", "/readyz"):
                answer = httpx.get(f"{base}{path}", timeout=30)
                assert answer.status_code == 200, answer.text
            answer = httpx.post(f"{base}/classify", files=pngs(1), timeout=30)
            assert answer.status_code == 200, answer.text
            assert refused_total(base) == 0
        finally:
            for connection in idle:
                connection.close()
