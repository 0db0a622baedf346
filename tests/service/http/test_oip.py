"""The Open Inference Protocol routes on a fake backend: metadata, readiness, inference with JSON
tensors and images, the protocol's errors, the API key and metrics."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from tests.service.conftest import CLASSES, HeldWarmUp, grey

NAME, VERSION = "fake-small_cnn-smso", "0123456789ab"
INFER = f"/v2/models/{NAME}/infer"


def tensor_input(images: np.ndarray) -> dict:
    return {
        "name": "image",
        "shape": list(images.shape),
        "datatype": "FP32",
        "data": images.reshape(-1).tolist(),
    }


def bytes_input(*files: bytes) -> dict:
    return {
        "name": "image_bytes",
        "shape": [len(files)],
        "datatype": "BYTES",
        "data": [base64.b64encode(f).decode() for f in files],
    }


def test_server_and_model_metadata(make_client):
    client = make_client()
    server = client.get("/v2").json()
    assert server["name"] == "smso"
    assert set(server["extensions"]) >= {"classification", "binary_tensor_data"}
    for path in (f"/v2/models/{NAME}", f"/v2/models/{NAME}/versions/{VERSION}"):
        meta = client.get(path).json()
        assert meta["name"] == NAME
        assert meta["versions"] == [VERSION]
        assert meta["inputs"] == [
            {"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]},
            {"name": "image_bytes", "datatype": "BYTES", "shape": [-1]},
        ]
        assert meta["outputs"] == [
            {"name": "logits", "datatype": "FP32", "shape": [-1, 10]},
            {"name": "embedding", "datatype": "FP32", "shape": [-1, 4]},
        ]


def test_health_and_readiness(make_client):
    client = make_client()
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200
    assert client.get(f"/v2/models/{NAME}/ready").status_code == 200
    assert client.get(f"/v2/models/{NAME}/versions/{VERSION}/ready").status_code == 200
    missing = client.get("/v2/models/other/ready")
    assert missing.status_code == 404
    assert missing.json() == {"error": f"model 'other' is not served here; models: [{NAME!r}]"}
    assert client.get(f"/v2/models/{NAME}/versions/v9/ready").status_code == 404


def test_not_ready_while_warming_up(make_client):
    backend = HeldWarmUp()
    client = make_client(backend, wait=False)
    try:
        assert client.get("/v2/health/live").status_code == 200
        assert client.get("/v2/health/ready").status_code == 400  # the protocol's "false"
        assert client.get(f"/v2/models/{NAME}/ready").status_code == 400
        busy = client.post(INFER, json={"inputs": [bytes_input(grey(7))]})
        assert busy.status_code == 503
        assert "loading" in busy.json()["error"]
    finally:
        backend.release.set()


def test_tensor_and_image_inputs_equal_classify_and_embed(make_client):
    client = make_client()
    files = [grey(40), grey(200)]
    classify = client.post(
        "/classify", files=[("file", f) for f in files], params={"top_k": 3}
    ).json()["results"]
    embed = client.post("/embed", files=[("file", f) for f in files]).json()["results"]
    outputs = [{"name": "logits", "parameters": {"classification": 3}}, {"name": "embedding"}]
    by_bytes = client.post(
        INFER, json={"id": "a", "inputs": [bytes_input(*files)], "outputs": outputs}
    )
    assert by_bytes.status_code == 200, by_bytes.text
    answer = by_bytes.json()
    assert answer["id"] == "a"
    assert answer["model_name"] == NAME
    labels, embedding = answer["outputs"]
    assert labels["datatype"] == "BYTES"
    assert labels["shape"] == [2, 3]
    for i in range(2):
        for j, prediction in enumerate(classify[i]["predictions"]):
            score, index, label = labels["data"][3 * i + j].split(":", 2)
            assert (int(index), label) == (prediction["index"], prediction["label"])
            assert float(score) == pytest.approx(prediction["score"], abs=1e-6)
    np.testing.assert_allclose(
        np.reshape(embedding["data"], (2, 4)), [r["embedding"] for r in embed], rtol=1e-6
    )
    # the same images, preprocessed by the client: the FP32 tensor input
    mean, std = 0.5, 0.25  # the fake card's normalisation
    tensor = np.stack([np.full((1, 28, 28), (v / 255 - mean) / std, np.float32) for v in (40, 200)])
    by_tensor = client.post(INFER, json={"inputs": [tensor_input(tensor)]}).json()
    logits, embedding2 = by_tensor["outputs"]
    assert logits["name"] == "logits"
    assert logits["shape"] == [2, 10]
    np.testing.assert_allclose(embedding2["data"], embedding["data"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {
                "inputs": [
                    {
                        "name": "image",
                        "shape": [1, 3, 28, 28],
                        "datatype": "FP32",
                        "data": [0.0] * (3 * 28 * 28),
                    }
                ]
            },
            "input 'image' must have shape [N, 1, 28, 28], got [1, 3, 28, 28]",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "image",
                        "shape": [1, 1, 28, 28],
                        "datatype": "FP64",
                        "data": [0.0] * 784,
                    }
                ]
            },
            "input 'image' must be FP32, got FP64",
        ),
        (
            {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": ["x"]}]},
            "encoded images go in 'image_bytes'",
        ),
        (
            {"inputs": [{"name": "pixels", "shape": [1], "datatype": "FP32", "data": [0]}]},
            "inputs ['pixels'] not understood: send exactly one input: 'image' (FP32, shape "
            "[N, 1, 28, 28], preprocessed) or 'image_bytes' (BYTES, shape [N]",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "image_bytes",
                        "shape": [1],
                        "datatype": "BYTES",
                        "data": ["not base64!"],
                    }
                ]
            },
            "image_bytes[0]: BYTES in JSON must be base64-encoded images",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "image_bytes",
                        "shape": [1],
                        "datatype": "BYTES",
                        "data": [base64.b64encode(b"not an image").decode()],
                    }
                ]
            },
            "image_bytes[0]",
        ),
        (
            {"inputs": [{"name": "image_bytes", "shape": [0], "datatype": "BYTES", "data": []}]},
            "holds 0 images; send 1 to",
        ),
        (
            {"inputs": [bytes_input(grey(1))], "outputs": [{"name": "scores"}]},
            "unknown output 'scores'; outputs: logits, embedding",
        ),
        (
            {
                "inputs": [bytes_input(grey(1))],
                "outputs": [{"name": "embedding", "parameters": {"classification": 2}}],
            },
            "classification applies to 'logits'",
        ),
    ],
)
def test_bad_requests_get_the_protocols_400_saying_what_was_expected(make_client, body, expected):
    response = make_client().post(INFER, json=body)
    assert response.status_code == 400, response.text
    assert list(response.json()) == ["error"]
    assert expected in response.json()["error"]


def test_model_name_body_and_size_errors(make_client):
    client = make_client(max_request_bytes=4096, max_files=2)
    wrong = client.post("/v2/models/nope/infer", json={"inputs": [bytes_input(grey(1))]})
    assert wrong.status_code == 404
    assert "models: ['fake-small_cnn-smso']" in wrong.json()["error"]
    garbage = client.post(INFER, content=b"\x00\x01", headers={"content-type": "application/json"})
    assert garbage.status_code == 400
    assert "not valid JSON" in garbage.json()["error"]
    big = client.post(INFER, content=b"x" * 5000)
    assert big.status_code == 413
    assert big.json() == {"error": "the request body is larger than 4,096 bytes"}
    many = client.post(INFER, json={"inputs": [bytes_input(grey(1), grey(2), grey(3))]})
    assert many.status_code == 413
    assert "3 BYTES elements; at most 2 per request" in many.json()["error"]
    bad_length = client.post(INFER, content=b"{}", headers={"Inference-Header-Content-Length": "x"})
    assert bad_length.status_code == 400
    assert "must be a number" in bad_length.json()["error"]


def test_binary_request_and_response(make_client):
    client = make_client()
    image = np.full((2, 1, 28, 28), 0.5, np.float32)
    header = {
        "inputs": [
            {
                "name": "image",
                "shape": [2, 1, 28, 28],
                "datatype": "FP32",
                "parameters": {"binary_data_size": image.nbytes},
            }
        ],
        "outputs": [
            {"name": "embedding", "parameters": {"binary_data": True}},
            {"name": "logits", "parameters": {"classification": 1}},
        ],
    }
    text = json.dumps(header).encode()
    response = client.post(
        INFER,
        content=text + image.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(text))},
    )
    assert response.status_code == 200, response.text
    length = int(response.headers["Inference-Header-Content-Length"])
    answer = json.loads(response.content[:length])
    embedding, labels = answer["outputs"]
    assert embedding["parameters"]["binary_data_size"] == 2 * 4 * 4
    values = np.frombuffer(response.content[length:], "<f4").reshape(2, 4)
    np.testing.assert_allclose(values[:, 0], 0.5)  # the fake's embedding starts with the mean
    assert labels["data"][0].endswith(f":9:{CLASSES[9]}")  # logits_k = k * mean: class 9 wins


def test_api_key_guards_inference_metadata_and_model_readiness_but_not_health(make_client):
    client = make_client(api_key="s3cret")
    assert client.get("/v2/health/ready").status_code == 200
    assert client.get("/v2/health/live").status_code == 200
    # a model's readiness would name the model served (its 404 does): the key's business
    for name in (NAME, "other"):
        refused = client.get(f"/v2/models/{name}/ready")
        assert refused.status_code == 401
        assert NAME not in refused.text
    key = {"X-API-Key": "s3cret"}
    assert client.get(f"/v2/models/{NAME}/ready", headers=key).status_code == 200
    assert client.get("/v2/models/other/ready", headers=key).status_code == 404
    refused = client.post(INFER, json={"inputs": [bytes_input(grey(1))]})
    assert refused.status_code == 401
    assert "API key" in refused.json()["error"]
    assert client.get(f"/v2/models/{NAME}").status_code == 401
    ok = client.post(
        INFER, json={"inputs": [bytes_input(grey(1))]}, headers={"Authorization": "Bearer s3cret"}
    )
    assert ok.status_code == 200
    assert client.get(f"/v2/models/{NAME}", headers={"X-API-Key": "s3cret"}).status_code == 200


def test_metrics_count_inference_by_route_template_but_not_health(make_client):
    client = make_client()
    client.get("/v2/health/ready")
    client.get(f"/v2/models/{NAME}/ready")
    client.post(INFER, json={"inputs": [bytes_input(grey(1), grey(2))]})
    text = client.get("/metrics").text
    assert (
        'smso_http_requests_total{method="POST",route="/v2/models/{model_name}/infer",'
        'status="200"} 1.0'
    ) in text
    assert (
        'smso_images_total{model="fake-small_cnn-smso",route="/v2/models/{model_name}/infer",'
        'version="0123456789ab"} 2.0'
    ) in text
    assert "/v2/health" not in text
    assert "/ready" not in text


def test_the_openapi_document_lists_the_protocol(make_client):
    paths = make_client().get("/openapi.json").json()["paths"]
    assert {
        "/v2",
        "/v2/health/ready",
        "/v2/models/{model_name}/infer",
        "/v2/models/{model_name}/versions/{model_version}/infer",
    } <= set(paths)
    assert (
        "application/json"
        in paths["/v2/models/{model_name}/infer"]["post"]["requestBody"]["content"]
    )


def test_large_json_tensors_are_parsed_off_the_event_loop_and_answered(make_client, monkeypatch):
    import threading

    from service.http import oip
    from service.http.oip import INLINE_PARSE_BYTES

    parsed_in = []  # the thread each body was parsed in

    def parse(*args, **kwargs):
        parsed_in.append(threading.current_thread().name)
        return real_parse(*args, **kwargs)

    real_parse = oip.parse
    monkeypatch.setattr(oip, "parse", parse)
    client = make_client()
    small = np.zeros((1, 1, 28, 28), np.float32)
    response = client.post(INFER, content=json.dumps({"inputs": [tensor_input(small)]}))
    assert response.status_code == 200, response.text
    images = np.random.default_rng(0).standard_normal((48, 1, 28, 28)).astype(np.float32)
    body = json.dumps({"inputs": [tensor_input(images)], "outputs": [{"name": "embedding"}]})
    assert len(body) > INLINE_PARSE_BYTES
    response = client.post(INFER, content=body)
    assert response.status_code == 200, response.text
    loop_thread, worker = parsed_in
    assert not loop_thread.startswith("decode")  # a small body: in the event loop's thread
    assert worker.startswith("decode")  # a large one: in a decode thread
    (embedding,) = response.json()["outputs"]
    np.testing.assert_allclose(
        np.reshape(embedding["data"], (48, 4))[:, 0],
        images.reshape(48, -1).mean(1),
        rtol=1e-4,
        atol=1e-6,
    )


def test_non_finite_tensors_are_refused(make_client):
    images = np.zeros((1, 1, 28, 28), np.float32)
    body = {"inputs": [tensor_input(images)]}
    body["inputs"][0]["data"][5] = float("nan")
    response = make_client().post(INFER, content=json.dumps(body))
    assert response.status_code == 400
    assert response.json() == {"error": "input 'image' holds NaN or infinite values"}


def test_an_empty_outputs_list_means_logits_and_embedding(make_client):
    response = make_client().post(INFER, json={"inputs": [bytes_input(grey(3))], "outputs": []})
    assert [o["name"] for o in response.json()["outputs"]] == ["logits", "embedding"]


def test_odd_headers_and_parameters_are_not_500s(make_client):
    client = make_client()
    body = json.dumps({"inputs": [bytes_input(grey(3))]}).encode()
    for value in ("\u00b2".encode("latin-1"), b"9" * 5000):
        response = client.post(
            INFER, content=body, headers=[(b"Inference-Header-Content-Length", value)]
        )
        assert response.status_code == 400
        assert "must be a number of bytes" in response.json()["error"]
    huge_timeout = {"inputs": [bytes_input(grey(3))], "parameters": {"timeout": 10**400}}
    assert client.post(INFER, content=json.dumps(huge_timeout)).status_code == 200
    for timeout in ("abc", -5, 0, True, None, [1]):
        request = {"inputs": [bytes_input(grey(3))], "parameters": {"timeout": timeout}}
        response = client.post(INFER, content=json.dumps(request))
        if timeout is None:  # JSON null: no timeout given
            assert response.status_code == 200, response.text
            continue
        assert response.status_code == 400, (timeout, response.text)
        assert (
            "parameters.timeout must be a positive number of microseconds"
            in (response.json()["error"])
        )


def test_gzip_bodies_are_accepted(make_client):
    import gzip

    body = gzip.compress(json.dumps({"inputs": [bytes_input(grey(3))]}).encode())
    response = make_client().post(INFER, content=body, headers={"Content-Encoding": "gzip"})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("kind", ["image/jpeg", "multipart/form-data; boundary=x", "text/html"])
def test_a_body_that_is_not_the_protocols_is_415_saying_what_is(make_client, kind):
    response = make_client().post(INFER, content=grey(3), headers={"Content-Type": kind})
    assert response.status_code == 415
    assert "application/json" in response.json()["error"]
    assert "image_bytes" in response.json()["error"]


@pytest.mark.parametrize(
    "kind",
    [
        None,
        "application/json",
        "application/json; charset=utf-8",
        "application/x-www-form-urlencoded",
    ],
)
def test_json_bodies_are_accepted_with_or_without_a_type(make_client, kind):
    headers = {} if kind is None else {"Content-Type": kind}
    body = json.dumps({"inputs": [bytes_input(grey(3))]})
    assert make_client().post(INFER, content=body, headers=headers).status_code == 200
