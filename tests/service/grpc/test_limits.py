"""The gRPC door enforces what the REST door enforces, before it holds a message: the API key
(checked on the call's metadata by ``KeyFirst``) and the request size (``max_request_bytes`` as
grpcio's receive limit). Measured on the real server's resident memory, as a hostile client
would try it: messages the server refuses must not grow it."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from service.core.errors import Canonical, ServiceError, canonical
from service.grpc.server import KEYED, status_code
from tests.service.conftest import free_port
from tests.service.test_server import real_server

KEY = "k3y-for-grpc"
MIB = 2**20


def rss_mib(pid: int) -> dict[str, float]:
    """The process's resident memory now (VmRSS) and at its peak (VmHWM), in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}


def big_request(mib: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="fashion-mnist")
    request.inputs.add(name="image_bytes", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(bytes(mib * MIB))
    return request


def flood(address: str, request, calls: int, metadata=()) -> set[grpc.StatusCode]:
    """``calls`` concurrent calls, one channel each (as separate clients): the codes they got."""
    options = [("grpc.max_send_message_length", -1)]

    def one(_: int) -> grpc.StatusCode:
        with grpc.insecure_channel(address, options=options) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            try:
                stub.ModelInfer(request, metadata=metadata, timeout=60)
            except grpc.RpcError as error:
                return error.code()
            return grpc.StatusCode.OK

    with ThreadPoolExecutor(calls) as pool:
        return set(pool.map(one, range(calls)))


@pytest.fixture(scope="module")
def keyed_server(shipped_model: str) -> Iterator[tuple[str, str, int]]:
    """``(HTTP base URL, gRPC address, pid)`` of smso-serve with an API key and a 16 MiB
    request limit."""
    port = free_port()
    env = os.environ | {"SMSO_API_KEY": KEY, "SMSO_MAX_REQUEST_BYTES": str(16 * MIB)}
    args = ("--grpc-port", str(port), "--log-level", "warning")
    with real_server(shipped_model, *args, env=env) as (base, server):
        yield base, f"127.0.0.1:{port}", server.pid


def test_calls_without_the_key_are_refused_before_their_message_is_held(keyed_server):
    """8 concurrent 12 MiB ModelInfer calls without the key (96 MiB in all, each under the
    size limit): UNAUTHENTICATED, and the server's peak memory grows by far less than one
    message per call would need."""
    base, address, pid = keyed_server
    time.sleep(0.5)
    before = rss_mib(pid)["VmHWM"]
    assert flood(address, big_request(12), 8) == {grpc.StatusCode.UNAUTHENTICATED}
    assert rss_mib(pid)["VmHWM"] - before < 48, "the refused messages were held"
    wrong = (("x-api-key", "not-the-key"),)
    assert flood(address, big_request(12), 2, wrong) == {grpc.StatusCode.UNAUTHENTICATED}
    metrics = httpx.get(f"{base}/metrics").text
    counted = 'smso_grpc_requests_total{method="ModelInfer",status="UNAUTHENTICATED"} 10.0'
    assert counted in metrics


def test_a_message_over_the_request_limit_is_refused_unread(keyed_server):
    """With the key, messages larger than max_request_bytes (16 MiB here): RESOURCE_EXHAUSTED
    from grpcio, and they are not held either."""
    _, address, pid = keyed_server
    before = rss_mib(pid)["VmHWM"]
    key = (("x-api-key", KEY),)
    assert flood(address, big_request(24), 8, key) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert rss_mib(pid)["VmHWM"] - before < 48, "the oversized messages were held"


def test_the_key_opens_the_model_rpcs_and_health_needs_none(keyed_server):
    base, address, _ = keyed_server
    name = httpx.get(f"{base}/metadata", headers={"X-API-Key": KEY}).json()["model"]["name"]
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(service_pb2.ServerLiveRequest()).live
        assert stub.ServerReady(service_pb2.ServerReadyRequest()).ready
        stub.ServerMetadata(service_pb2.ServerMetadataRequest())
        ask = service_pb2.ModelMetadataRequest(name=name)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelMetadata(ask)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "x-api-key" in refused.value.details()
        for metadata in ((("x-api-key", KEY),), (("authorization", f"Bearer {KEY}"),)):
            assert stub.ModelMetadata(ask, metadata=metadata).name == name


def test_every_keyed_rpc_exists_and_every_canonical_code_is_a_grpc_status():
    names = set(service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name)
    assert names >= KEYED
    assert {status_code(code).name for code in Canonical} == {code.value for code in Canonical}


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (400, "invalid_image", Canonical.INVALID_ARGUMENT),
        (401, "unauthorized", Canonical.UNAUTHENTICATED),
        (404, "not_found", Canonical.NOT_FOUND),
        (413, "payload_too_large", Canonical.INVALID_ARGUMENT),
        (503, "overloaded", Canonical.RESOURCE_EXHAUSTED),
        (503, "draining", Canonical.UNAVAILABLE),
        (504, "timeout", Canonical.DEADLINE_EXCEEDED),
        (418, "teapot", Canonical.UNKNOWN),
    ],
)
def test_errors_have_one_protocol_neutral_code(status, code, expected):
    assert canonical(status, code) is expected
    assert ServiceError(status, code, "m").canonical is expected


def test_the_server_still_drains_after_refusals(keyed_server):
    """Refused calls leave nothing behind that would hold up the shutdown (the fixture's server
    is stopped by SIGKILL only if SIGTERM does not end it)."""
    _, address, pid = keyed_server
    assert flood(address, big_request(1), 4) == {grpc.StatusCode.UNAUTHENTICATED}
    os.kill(pid, signal.SIGTERM)
    for _ in range(600):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{pid}/status").read_text().find("State:\tZ") >= 0:
            return
        time.sleep(0.1)
    pytest.fail("the server did not stop on SIGTERM after refused calls")


def test_a_malformed_message_is_invalid_argument_one_access_line_and_counted(shipped_model):
    """Bytes that are no ModelInferRequest (or a truncated one): the client's error, said once
    per call at INFO, never grpcio's ERROR traceback."""
    port = free_port()
    env = os.environ | {"SMSO_LOG_FORMAT": "json"}
    args = ("--grpc-port", str(port), "--log-level", "info")
    garbage = [b"\xff\xff\xff\x0f not a message", b"\x0a\x80", bytes(range(256))]
    with real_server(shipped_model, *args, env=env) as (base, server):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            for raw in garbage * 10:
                with pytest.raises(grpc.RpcError) as failed:
                    infer(raw, timeout=10)
                assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert failed.value.details() == "the ModelInfer message does not parse"
        metrics = httpx.get(f"{base}/metrics").text
        assert 'smso_grpc_requests_total{method="ModelInfer",status="INVALID_ARGUMENT"} 30.0' in (
            metrics
        )
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        assert server.stdout is not None
        output = server.stdout.read()
    assert "Traceback" not in output
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    refused = [a for a in lines if a.get("status") == "INVALID_ARGUMENT"]
    assert len(refused) == 30
    assert {(a["level"], a["route"]) for a in refused} == {
        ("INFO", "/inference.GRPCInferenceService/ModelInfer")
    }
    assert not [a for a in lines if a.get("level") == "ERROR"]
