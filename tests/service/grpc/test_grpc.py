"""The Open Inference Protocol over gRPC: ``tritonclient.grpc`` itself against the real server
(smso-serve, the shipped ONNX model, HTTP and gRPC in one process), giving what REST's
/classify and /embed give, with REST's errors as gRPC status codes, and drained on SIGTERM."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from tests.service.conftest import free_port, png
from tests.service.test_server import real_server, serve_on_a_taken_port

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import (  # noqa: E402
    InferenceServerClient,
    InferInput,
    InferRequestedOutput,
    service_pb2,
    service_pb2_grpc,
)
from tritonclient.utils import InferenceServerException  # noqa: E402

grpc = pytest.importorskip("grpc")


def images(count: int, seed: int = 0) -> np.ndarray:
    """``count`` random 28 x 28 greyscale images (uint8), the shipped model's size."""
    return np.random.default_rng(seed).integers(0, 256, (count, 28, 28), dtype=np.uint8)


@pytest.fixture(scope="module")
def server(shipped_model: str) -> Iterator[tuple[str, str, str]]:
    """``(HTTP base URL, gRPC address, model name)`` of one smso-serve serving both."""
    grpc_port = free_port()
    with real_server(shipped_model, "--grpc-port", str(grpc_port), "--log-level", "warning") as (
        base,
        _,
    ):
        name = httpx.get(f"{base}/metadata").json()["model"]["name"]
        yield base, f"127.0.0.1:{grpc_port}", name


@pytest.fixture(scope="module")
def client(server: tuple[str, str, str]) -> Iterator[InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(server[1])
    yield triton
    triton.close()


def bytes_input(files: list[bytes]) -> InferInput:
    tensor = grpcclient.InferInput("image_bytes", [len(files)], "BYTES")
    tensor.set_data_from_numpy(np.array(files, dtype=object))
    return tensor


def tensor_input(array: np.ndarray, name: str = "image") -> InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


def raw_fp32_request(name: str, count: int) -> service_pb2.ModelInferRequest:
    """A ModelInferRequest of ``count`` random images as one FP32 tensor in raw contents,
    built directly from the protocol's messages (as a client other than tritonclient would)."""
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name="image", datatype="FP32", shape=[count, 1, 28, 28]
    )
    return service_pb2.ModelInferRequest(
        model_name=name,
        inputs=[tensor],
        raw_input_contents=[images(count).astype(np.float32).tobytes()],
    )


def outputs(k: int) -> list[InferRequestedOutput]:
    return [
        grpcclient.InferRequestedOutput("logits", class_count=k),
        grpcclient.InferRequestedOutput("embedding"),
    ]


def test_health_and_metadata_match_rest(client, server):
    base, _, name = server
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready(name)
    meta = client.get_server_metadata(as_json=True)
    assert meta == httpx.get(f"{base}/v2").json()
    model = client.get_model_metadata(name, as_json=True)
    rest = httpx.get(f"{base}/v2/models/{name}").json()
    # protobuf's JSON writes int64 as strings
    for tensor in model["inputs"] + model["outputs"]:
        tensor["shape"] = [int(d) for d in tensor["shape"]]
    assert model == rest


def _rest_answers(base: str, files: list[bytes], k: int) -> tuple[list, np.ndarray]:
    upload = [("file", (f"{i}.png", f, "image/png")) for i, f in enumerate(files)]
    classify = httpx.post(f"{base}/classify", files=upload, params={"top_k": k}).json()
    embed = httpx.post(f"{base}/embed", files=upload).json()
    predictions = [r["predictions"] for r in classify["results"]]
    return predictions, np.array([r["embedding"] for r in embed["results"]])


def _assert_same(strings: np.ndarray, embedding: np.ndarray, predictions: list, rest: np.ndarray):
    assert strings.shape == (len(predictions), len(predictions[0]))
    for row, expected in zip(strings, predictions, strict=True):
        for item, prediction in zip(row, expected, strict=True):
            score, index, label = item.decode().split(":", 2)
            assert (int(index), label) == (prediction["index"], prediction["label"])
            assert float(score) == pytest.approx(prediction["score"], abs=1e-6)
    # float32: batches of other sizes run other kernels; entries are up to about 5 in size
    np.testing.assert_allclose(embedding, rest, rtol=1e-5, atol=1e-5)


def test_encoded_images_give_what_classify_and_embed_give(client, server):
    base, _, name = server
    files = [png(image) for image in images(3)]
    result = client.infer(name, [bytes_input(files)], outputs=outputs(3), request_id="r1")
    assert result.get_response().id == "r1"
    assert result.get_output("logits").datatype == "BYTES"
    _assert_same(
        result.as_numpy("logits"), result.as_numpy("embedding"), *_rest_answers(base, files, 3)
    )


def _preprocessed(base: str, pixels: np.ndarray) -> np.ndarray:
    """The images as the card's preprocessing makes them (28 x 28 greyscale: scaled and
    normalised only), ``(N, 1, 28, 28)`` float32."""
    spec = httpx.get(f"{base}/metadata").json()["card"]["preprocessing"]
    assert spec["colour"] == "L"
    assert spec["crop"] == spec["resize"] == 28
    scaled = pixels.astype(np.float32) * np.float32(spec["scale"])
    return ((scaled - spec["mean"][0]) / spec["std"][0]).astype(np.float32)[:, None]


def test_fp32_tensors_give_what_classify_and_embed_give(client, server):
    base, _, name = server
    pixels = images(4, seed=1)
    result = client.infer(name, [tensor_input(_preprocessed(base, pixels))], outputs=outputs(2))
    _assert_same(
        result.as_numpy("logits"),
        result.as_numpy("embedding"),
        *_rest_answers(base, [png(p) for p in pixels], 2),
    )
    # without classification: the logits themselves, as REST's binary answer has them
    plain = client.infer(name, [tensor_input(_preprocessed(base, pixels))])
    assert plain.as_numpy("logits").shape == (4, 10)
    assert plain.as_numpy("logits").dtype == np.float32


def test_typed_contents_answer_as_raw_contents(client, server):
    """``contents.fp32_contents`` / ``bytes_contents`` (what tritonclient never sends, other
    clients do) answer as the raw tensors do."""
    base, address, name = server
    pixels = images(2, seed=2)
    tensor = _preprocessed(base, pixels)
    files = [png(p) for p in pixels]
    raw = client.infer(name, [tensor_input(tensor)]).as_numpy("embedding")
    Tensor = service_pb2.ModelInferRequest.InferInputTensor  # noqa: N806
    requests = [
        Tensor(
            name="image",
            datatype="FP32",
            shape=tensor.shape,
            contents=service_pb2.InferTensorContents(fp32_contents=tensor.reshape(-1)),
        ),
        Tensor(
            name="image_bytes",
            datatype="BYTES",
            shape=[2],
            contents=service_pb2.InferTensorContents(bytes_contents=files),
        ),
    ]
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for request in requests:
            response = stub.ModelInfer(
                service_pb2.ModelInferRequest(model_name=name, inputs=[request])
            )
            names = [o.name for o in response.outputs]
            embedding = np.frombuffer(
                response.raw_output_contents[names.index("embedding")], "<f4"
            ).reshape(2, -1)
            np.testing.assert_allclose(embedding, raw, rtol=1e-5, atol=1e-6)


def _rest_error(base: str, name: str, body: dict) -> str:
    answer = httpx.post(f"{base}/v2/models/{name}/infer", json=body)
    assert answer.status_code >= 400
    return answer.json()["error"]


def _grpc_error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_errors_are_status_codes_with_rest_messages(client, server):
    base, _, name = server
    zeros = np.zeros((1, 1, 28, 28), np.float32)
    data = [0.0] * 784
    unknown = _grpc_error(lambda: client.infer("other", [tensor_input(zeros)]))
    assert unknown.status() == "StatusCode.NOT_FOUND"
    body = {
        "inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": data}]
    }
    assert unknown.message() == _rest_error(base, "other", body)
    assert _grpc_error(lambda: client.is_model_ready("other")).status() == "StatusCode.NOT_FOUND"
    assert (
        _grpc_error(lambda: client.get_model_metadata("other")).status() == "StatusCode.NOT_FOUND"
    )
    cases: list[tuple[InferInput, dict[str, Any]]] = [
        (tensor_input(zeros, "pixels"), {"name": "pixels", "shape": [1, 1, 28, 28]}),
        (tensor_input(np.zeros((1, 3, 28, 28), np.float32)), {"shape": [1, 3, 28, 28]}),
    ]
    for tensor, change in cases:
        error = _grpc_error(lambda tensor=tensor: client.infer(name, [tensor]))
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
        wrong = {"name": "image", "datatype": "FP32", "data": data * 3} | change
        if change.get("name") == "pixels":
            wrong["data"] = data
        assert error.message() == _rest_error(base, name, {"inputs": [wrong]})
    undecodable = _grpc_error(lambda: client.infer(name, [bytes_input([b"not an image"])]))
    assert undecodable.status() == "StatusCode.INVALID_ARGUMENT"
    # the repository extension needs a repository
    index = _grpc_error(client.get_model_repository_index)
    assert index.status() == "StatusCode.UNIMPLEMENTED"
    assert _grpc_error(lambda: client.get_model_config(name)).status() == (
        "StatusCode.UNIMPLEMENTED"
    )


def test_a_busy_grpc_port_is_one_line_and_exit_2(shipped_model):
    port, proc = serve_on_a_taken_port(shipped_model, "--grpc-port")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"smso-serve: error: cannot listen on 127.0.0.1:{port}")
    assert "--grpc-port 0" in lines[0]


@pytest.mark.slow
def test_sigterm_answers_the_grpc_request_in_flight(shipped_model):
    """Eight large images decoded by one thread take a while: the request is in flight when
    SIGTERM arrives, and is answered before the server exits; a call made after SIGTERM is
    refused (UNAVAILABLE), and the server says it is not ready."""
    grpc_port = free_port()
    env = os.environ | {"SMSO_DECODE_THREADS": "1"}
    with real_server(
        shipped_model, "--grpc-port", str(grpc_port), "--log-level", "warning", env=env
    ) as (base, server):
        name = httpx.get(f"{base}/metadata").json()["model"]["name"]
        noise = np.random.default_rng(3).integers(0, 256, (8, 1500, 1500), dtype=np.uint8)
        files = [png(image) for image in noise]
        triton = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(triton.infer, name, [bytes_input(files)], outputs=outputs(1))
            deadline = time.monotonic() + 30
            while _decoded(base) < 1:  # the server holds the request
                assert time.monotonic() < deadline, "the request never reached the server"
                time.sleep(0.005)
            assert not answer.done()
            # an idle keep-alive HTTP connection keeps the server draining (up to keep_alive_s)
            # rather than stopping the gRPC server 0.1 s after SIGTERM: on a busy machine the
            # call below could come after that, and meet a closed port instead of the drain
            address = urlsplit(base)
            assert address.hostname is not None
            idle = http.client.HTTPConnection(address.hostname, address.port)
            idle.request("GET", "/healthz")
            idle.getresponse().read()
            server.send_signal(signal.SIGTERM)
            while triton.is_server_ready():  # draining has begun (HTTP no longer listens)
                assert time.monotonic() < deadline, "the server never started draining"
                time.sleep(0.005)
            # a new call on the open channel is refused, the one in flight answered
            with pytest.raises(InferenceServerException, match="shutting down"):
                triton.infer(name, [bytes_input(files[:1])], outputs=outputs(1))
            idle.close()
            result = answer.result(timeout=60)
        assert result.as_numpy("logits").shape == (8, 1)
        assert server.wait(timeout=60) in (0, -signal.SIGTERM)
        triton.close()


def _decoded(base: str) -> float:
    """Images decoded so far, from /metrics."""
    found = re.search(
        r"^smso_decode_seconds_count (\S+)$", httpx.get(f"{base}/metrics").text, re.MULTILINE
    )
    return float(found.group(1)) if found else 0.0


@pytest.mark.slow
def test_a_grpc_call_has_a_request_id_echoed_an_access_line_and_metrics(shipped_model):
    """x-request-id from the call's metadata (or a new one) is echoed in the initial metadata
    and carried by the call's JSON access line, as REST's X-Request-ID is; each call is counted
    by method and status."""
    grpc_port = free_port()
    env = os.environ | {"SMSO_LOG_FORMAT": "json"}
    args = ("--grpc-port", str(grpc_port), "--log-level", "info")
    with real_server(shipped_model, *args, env=env) as (base, server):
        name = httpx.get(f"{base}/metadata").json()["model"]["name"]
        request = raw_fp32_request(name, 2)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            _, call = stub.ModelInfer.with_call(request, metadata=[("x-request-id", "g-1")])
            assert ("x-request-id", "g-1") in call.initial_metadata()
            missing = service_pb2.ModelInferRequest(model_name="nope", inputs=request.inputs)
            with pytest.raises(grpc.RpcError) as failed:
                stub.ModelInfer(missing, metadata=[("x-request-id", "x" * 200)])
            assert failed.value.code() == grpc.StatusCode.NOT_FOUND
            generated = dict(failed.value.initial_metadata())["x-request-id"]
            assert re.fullmatch(r"[0-9a-f]{32}", generated)  # the over-long one replaced
        metrics = httpx.get(f"{base}/metrics").text
        assert 'smso_grpc_requests_total{method="ModelInfer",status="OK"} 1.0' in metrics
        assert 'smso_grpc_requests_total{method="ModelInfer",status="NOT_FOUND"} 1.0' in metrics
        assert 'smso_grpc_request_duration_seconds_count{method="ModelInfer"} 2.0' in metrics
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        assert server.stdout is not None  # stdout=PIPE
        output = server.stdout.read()
    lines = [json.loads(line) for line in output.splitlines()]
    (line,) = [a for a in lines if a.get("request_id") == "g-1"]
    assert line["logger"] == "service.access"
    assert line["method"] == "gRPC"
    assert line["route"] == "/inference.GRPCInferenceService/ModelInfer"
    assert line["status"] == "OK"
    assert line["model"] == name
    assert line["images"] == 2
    assert line["queue_ms"] >= 0
    assert line["inference_ms"] >= 0
    (line,) = [a for a in lines if a.get("request_id") == generated]
    assert line["status"] == "NOT_FOUND"


def test_grpc_messages_count_against_max_buffered_bytes_with_rest_bodies(shipped_model):
    """With room for one 200 KB message at a time, concurrent ModelInfer calls beyond it are
    RESOURCE_EXHAUSTED (REST's 503 overloaded) naming max_buffered_bytes, not processed, and
    the budget is given back: a call alone afterwards is answered."""
    grpc_port = free_port()
    env = os.environ | {"SMSO_MAX_REQUEST_BYTES": "300000", "SMSO_MAX_BUFFERED_BYTES": "300000"}
    args = ("--grpc-port", str(grpc_port), "--log-level", "warning")
    with real_server(shipped_model, *args, env=env) as (base, _):
        name = httpx.get(f"{base}/metadata").json()["model"]["name"]
        request = raw_fp32_request(name, 64)  # 200,704 bytes of tensor
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

            def call(_: int) -> str:
                try:
                    stub.ModelInfer(request, timeout=60)
                except grpc.RpcError as error:
                    refused = error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    return (
                        "refused"
                        if refused and "max_buffered_bytes" in error.details()
                        else (f"{error.code()}: {error.details()}")
                    )
                return "answered"

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                outcomes = list(pool.map(call, range(48)))
            assert set(outcomes) == {"refused", "answered"}, set(outcomes)
            assert call(0) == "answered"  # nothing is left held


def test_a_malformed_input_is_invalid_argument_even_after_a_too_large_one():
    """As on REST: every input's datatype and shape are checked before any size limit."""
    from service.grpc.server import infer_request
    from service.protocol.codec import ProtocolError

    tensors = [
        service_pb2.ModelInferRequest.InferInputTensor(
            name="big", datatype="BYTES", shape=[9115, 290145]
        ),
        service_pb2.ModelInferRequest.InferInputTensor(
            name="bad", datatype="FP32", shape=[1, 2**31]
        ),
    ]
    with pytest.raises(ProtocolError, match="'bad': shape must be") as error:
        infer_request(service_pb2.ModelInferRequest(model_name="m", inputs=tensors), 64)
    assert error.value.status == 400
