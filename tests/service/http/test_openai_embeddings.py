"""``POST /v1/embeddings``, OpenAI's embeddings API for images: what ``/embed`` answers, to the
bit, as floats and as base64; errors in OpenAI's shape; and OpenAI's own Python client against a
real smso-serve (its default asks for base64 and decodes it with numpy)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.settings import Settings
from tests.service.conftest import grey, wait_ready
from tests.service.galleries import fashion_pngs, files
from tests.service.test_server import real_server

API_KEY = "0pen-a1"


def data_uri(image: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(image).decode()}"


@pytest.fixture(scope="module")
def pngs() -> list[bytes]:
    return fashion_pngs(6)


@pytest.fixture(scope="module")
def client(shipped_model: str) -> Iterator[TestClient]:
    settings = Settings(model_path=shipped_model, max_batch_size=8, max_upload_bytes=4096)
    with TestClient(create_app(settings)) as served:
        wait_ready(served)
        yield served


@pytest.fixture(scope="module")
def model_name(client: TestClient) -> str:
    return client.get("/metadata").json()["model"]["name"]


def embed(client: TestClient, images: list[bytes], **params: Any) -> list[Any]:
    response = client.post("/embed", files=files(images), params=params)
    assert response.status_code == 200
    return [r["embedding"] for r in response.json()["results"]]


def embeddings(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/embeddings", json=body)


def test_float_embeddings_are_what_embed_answers_to_the_bit(client, model_name, pngs):
    response = embeddings(client, model=model_name, input=[data_uri(p) for p in pngs])
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert body["model"] == model_name
    assert body["usage"] == {"prompt_tokens": 0, "total_tokens": 0}
    assert [d["object"] for d in body["data"]] == ["embedding"] * len(pngs)
    assert [d["index"] for d in body["data"]] == list(range(len(pngs)))
    got = np.asarray([d["embedding"] for d in body["data"]], np.float64)
    want = np.asarray(embed(client, pngs), np.float64)
    assert got.shape == (len(pngs), 64)
    np.testing.assert_array_equal(got, want)


def test_base64_embeddings_are_embeds_little_endian_float32_bytes(client, model_name, pngs):
    body = embeddings(
        client, model=model_name, input=[data_uri(p) for p in pngs], encoding_format="base64"
    ).json()
    encoded = [d["embedding"] for d in body["data"]]
    assert encoded == embed(client, pngs, encoding="base64")  # the same strings
    decoded = np.stack([np.frombuffer(base64.b64decode(e), "<f4") for e in encoded])
    np.testing.assert_array_equal(decoded, np.asarray(embed(client, pngs), np.float32))


def test_one_input_a_bare_base64_string_and_dimensions_p_are_accepted(client, model_name, pngs):
    bare = base64.b64encode(pngs[0]).decode()
    one = embeddings(client, model=model_name, input=bare, dimensions=64, user="someone")
    assert one.status_code == 200
    assert one.json()["data"][0]["embedding"] == embed(client, pngs[:1])[0]
    jpeg_uri = embeddings(client, model=model_name, input=data_uri(pngs[0], "image/jpeg"))
    assert jpeg_uri.status_code == 200  # judged by its bytes, as an upload is


@pytest.mark.parametrize(
    ("body", "status", "code", "says"),
    [
        ({"model": "text-embedding-3-small"}, 404, "model_not_found", "is not served here"),
        ({"dimensions": 32}, 400, "unsupported_dimensions", "embeds images in 64 dimensions"),
        ({"input": "data:image/png;base64,%%%%"}, 400, "invalid_data_uri", "not valid base64"),
        ({"input": "data:image/png,rawbytes"}, 400, "invalid_data_uri", "not base64"),
        ({"input": "data:image/png;base64"}, 400, "invalid_data_uri", "without ','"),
        ({"input": data_uri(b"not an image")}, 400, "invalid_image", "input[0]"),
        ({"input": data_uri(b"hello", "text/plain")}, 415, "unsupported_media_type", "text/plain"),
        ({"input": data_uri(bytes(8000))}, 413, "payload_too_large", "4,096 bytes"),
        ({"input": data_uri(b"")}, 400, "empty_image", "input[0]"),
        ({"input": [[1, 2, 3]]}, 400, "invalid_json", "token arrays are not images"),
        ({"input": []}, 400, "invalid_json", "an input is empty"),
        ({"input": None}, 400, "invalid_json", "input"),
        ({"encoding_format": "int8"}, 400, "invalid_json", "encoding_format"),
        ({"temperature": 1}, 400, "invalid_json", "temperature: Extra inputs"),
        ({"input": ["x"] * 65}, 413, "too_many_files", "65 inputs; at most 64"),
    ],
)
def test_bad_requests_are_4xx_in_openais_shape_and_say_why(
    client, model_name, pngs, body, status, code, says
):
    request = {"model": model_name, "input": data_uri(pngs[0])} | body
    response = embeddings(client, **request)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert says in error["message"]
    assert error["type"] == "invalid_request_error"  # OpenAI's fields beside the service's
    assert error["param"] is None


def test_a_body_that_is_not_json_and_a_query_are_refused(client):
    garbled = client.post(
        "/v1/embeddings", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert garbled.status_code == 400
    assert garbled.json()["error"]["code"] == "invalid_json"
    form = client.post("/v1/embeddings", files=files([grey(1)]))
    assert form.status_code == 415
    query = client.post("/v1/embeddings", params={"model": "x"}, json={})
    assert query.status_code == 422
    assert query.json()["error"]["code"] == "unknown_query_parameter"
    assert client.post("/v1/nowhere").json()["error"]["type"] == "invalid_request_error"


def test_with_an_api_key_the_embeddings_need_it(make_client):
    client = make_client(api_key="s3cret")
    body = {"model": "fake-small_cnn-smso", "input": data_uri(grey(10))}
    refused = client.post("/v1/embeddings", json=body)
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
    bearer = {"authorization": "Bearer s3cret"}  # what OpenAI's clients send
    assert client.post("/v1/embeddings", json=body, headers=bearer).status_code == 200


@pytest.fixture(scope="module")
def openai() -> Any:
    """OpenAI's client package (the dev extra; not in the serving environment)."""
    return pytest.importorskip("openai", reason="OpenAI's client: the dev extra")


@pytest.fixture(scope="module")
def server(shipped_model: str, openai: Any) -> Iterator[str]:
    """smso-serve itself on the shipped model, with an API key: its base URL."""
    env = os.environ | {"SMSO_API_KEY": API_KEY}
    with real_server(shipped_model, "--log-level", "warning", env=env) as (base, _):
        yield base


#: the JSON bodies OpenAI's client sent (its http client's request hook)
SENT: list[dict[str, Any]] = []


def _keep_body(request: Any) -> None:
    SENT.append(json.loads(request.read()))


@pytest.fixture(scope="module")
def openai_client(server: str, openai: Any) -> Iterator[Any]:
    http = openai.DefaultHttpxClient(event_hooks={"request": [_keep_body]})
    with openai.OpenAI(
        base_url=f"{server}/v1", api_key=API_KEY, max_retries=0, http_client=http
    ) as client:
        yield client


def served_embed(server: str, images: list[bytes]) -> np.ndarray:
    response = httpx.post(f"{server}/embed", files=files(images), headers={"x-api-key": API_KEY})
    return np.asarray([r["embedding"] for r in response.json()["results"]], np.float32)


def test_openais_client_gets_embeds_vectors_by_its_default_base64(openai_client, server, pngs):
    name = httpx.get(f"{server}/metadata", headers={"x-api-key": API_KEY}).json()["model"]["name"]
    answer = openai_client.embeddings.create(model=name, input=[data_uri(p) for p in pngs])
    assert SENT[-1]["encoding_format"] == "base64"  # the client's default, decoded by numpy
    assert answer.model == name
    got = np.asarray([d.embedding for d in answer.data], np.float32)
    np.testing.assert_array_equal(got, served_embed(server, pngs))
    floats = openai_client.embeddings.create(
        model=name, input=data_uri(pngs[0]), encoding_format="float"
    )
    assert SENT[-1]["encoding_format"] == "float"
    np.testing.assert_array_equal(
        np.asarray(floats.data[0].embedding, np.float32), served_embed(server, pngs[:1])[0]
    )


def test_openais_client_raises_its_own_errors(server, openai_client, openai, pngs):
    with pytest.raises(openai.NotFoundError) as missing:
        openai_client.embeddings.create(model="text-embedding-3-small", input=data_uri(pngs[0]))
    assert missing.value.code == "model_not_found"
    assert missing.value.type == "invalid_request_error"
    with (
        openai.OpenAI(base_url=f"{server}/v1", api_key="wrong", max_retries=0) as stranger,
        pytest.raises(openai.AuthenticationError),
    ):
        stranger.embeddings.create(model="any", input=data_uri(pngs[0]))
