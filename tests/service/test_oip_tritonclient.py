"""``tritonclient.http`` itself against the real server (uvicorn, the shipped ONNX model): what
Triton's and KServe's clients do works unchanged, and gives what /classify and /embed give."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import uvicorn
from PIL import Image

from service.app import create_app
from service.core.settings import Settings

from .conftest import FASHION_MNIST as DEFAULT_ROOT
from .conftest import free_port, read_idx, wait_http_ready

pytest.importorskip("geventhttpclient", reason="tritonclient[http]: the dev extra")
tritonclient = pytest.importorskip("tritonclient.http")
from tritonclient.http import InferenceServerClient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

API_KEY = "tr1ton"
AUTH = {"X-API-Key": API_KEY}


def auth() -> dict[str, str]:
    """A fresh headers dict: tritonclient adds its own headers to the dict it is given."""
    return dict(AUTH)


def jpeg(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).resize((96, 96)).convert("RGB").save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def server(shipped_model: str) -> Iterator[str]:
    """The app on uvicorn in a thread, on a free loopback port; yields ``host:port``."""
    port = free_port()
    settings = Settings(model_path=shipped_model, max_batch_size=8, api_key=API_KEY, port=port)
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="error")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    url = f"127.0.0.1:{port}"
    wait_http_ready(f"http://{url}", lambda: None if thread.is_alive() else "uvicorn stopped")
    yield url
    uv.should_exit = True
    thread.join(timeout=30)


@pytest.fixture(scope="module")
def client(server: str) -> Iterator[InferenceServerClient]:
    triton = tritonclient.InferenceServerClient(url=server)
    yield triton
    triton.close()


@pytest.fixture(scope="module")
def model(server, client) -> dict:
    """The model's metadata, as tritonclient reads it."""
    name = httpx.get(f"http://{server}/metadata", headers=AUTH).json()["model"]["name"]
    return client.get_model_metadata(name, headers=auth())


@pytest.fixture(scope="module")
def images() -> list[bytes]:
    pixels = read_idx(DEFAULT_ROOT / "t10k-images-idx3-ubyte.gz")[:3]
    return [jpeg(p) for p in pixels]


def test_health_metadata_and_readiness(client, model):
    assert client.is_server_live()
    assert client.is_server_ready()
    # a model's readiness is behind the key, like its metadata
    assert not client.is_model_ready(model["name"])
    assert client.is_model_ready(model["name"], headers=auth())
    assert client.is_model_ready(model["name"], model["versions"][0], headers=auth())
    assert not client.is_model_ready("some-other-model", headers=auth())
    meta = client.get_server_metadata()
    assert {"classification", "binary_tensor_data"} <= set(meta["extensions"])
    assert [i["name"] for i in model["inputs"]] == ["image", "image_bytes"]
    assert model["inputs"][0]["shape"] == [-1, 1, 28, 28]
    # the shipped model's card has a typicality reference: its two outputs are offered too
    assert [o["name"] for o in model["outputs"]] == [
        "logits",
        "embedding",
        "typicality",
        "typicality_p_value",
    ]
    assert model["outputs"][1]["shape"] == [-1, 64]
    assert model["outputs"][2]["shape"] == [-1]


def _bytes_input(files: list[bytes], binary: bool):
    tensor = tritonclient.InferInput("image_bytes", [len(files)], "BYTES")
    data = files if binary else [base64.b64encode(f) for f in files]
    tensor.set_data_from_numpy(np.array(data, dtype=np.object_), binary_data=binary)
    return tensor


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_image_bytes_give_what_classify_and_embed_give(client, model, server, images, binary):
    outputs = [
        tritonclient.InferRequestedOutput("logits", binary_data=binary, class_count=3),
        tritonclient.InferRequestedOutput("embedding", binary_data=binary),
    ]
    result = client.infer(
        model["name"], [_bytes_input(images, binary)], outputs=outputs, headers=auth()
    )
    labels = result.as_numpy("logits")  # (3, 3) of b"score:index:label"
    embedding = result.as_numpy("embedding")  # (3, 64)
    files = [("file", (f"{i}.jpg", f, "image/jpeg")) for i, f in enumerate(images)]
    classify = httpx.post(
        f"http://{server}/classify", files=files, params={"top_k": 3}, headers=AUTH
    ).json()["results"]
    embed = httpx.post(f"http://{server}/embed", files=files, headers=AUTH).json()["results"]
    assert labels.shape == (3, 3)
    assert embedding.shape == (3, 64)
    for row, expected in zip(labels, classify, strict=True):
        for item, prediction in zip(row, expected["predictions"], strict=True):
            text = item.decode() if isinstance(item, bytes) else item  # JSON: tritonclient's str
            score, index, label = text.split(":", 2)
            assert (int(index), label) == (prediction["index"], prediction["label"])
            assert float(score) == pytest.approx(prediction["score"], abs=1e-5)
    np.testing.assert_allclose(embedding, [r["embedding"] for r in embed], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_a_preprocessed_tensor_gives_what_the_images_give(client, model, server, images, binary):
    from service.core.card import Preprocessing
    from service.imaging.images import Preprocessor

    card = httpx.get(f"http://{server}/metadata", headers=AUTH).json()["card"]
    preprocess = Preprocessor(Preprocessing.model_validate(card["preprocessing"]), 10**8)
    tensor = np.stack([preprocess(f, f"{i}.jpg") for i, f in enumerate(images)])  # (3, 1, 28, 28)
    image = tritonclient.InferInput("image", list(tensor.shape), "FP32")
    image.set_data_from_numpy(tensor, binary_data=binary)
    by_tensor = client.infer(model["name"], [image], headers=auth())  # every output, binary
    by_bytes = client.infer(model["name"], [_bytes_input(images, True)], headers=auth())
    for name in ("logits", "embedding"):
        np.testing.assert_allclose(
            by_tensor.as_numpy(name), by_bytes.as_numpy(name), rtol=1e-4, atol=1e-5
        )
    assert by_tensor.as_numpy("logits").dtype == np.float32


def test_wrong_shape_datatype_name_and_key_are_errors_that_say_what_was_expected(client, model):
    name = model["name"]
    wrong_shape = tritonclient.InferInput("image", [1, 3, 28, 28], "FP32")
    wrong_shape.set_data_from_numpy(np.zeros((1, 3, 28, 28), np.float32))
    with pytest.raises(InferenceServerException, match=r"shape \[N, 1, 28, 28\], got \[1, 3"):
        client.infer(name, [wrong_shape], headers=auth())
    wrong_type = tritonclient.InferInput("image", [1, 1, 28, 28], "FP64")
    wrong_type.set_data_from_numpy(np.zeros((1, 1, 28, 28), np.float64))
    with pytest.raises(InferenceServerException, match="must be FP32, got FP64") as caught:
        client.infer(name, [wrong_type], headers=auth())
    assert caught.value.status() == "400"
    unknown = tritonclient.InferInput("pixels", [1], "FP32")
    unknown.set_data_from_numpy(np.zeros(1, np.float32))
    with pytest.raises(InferenceServerException, match="'image_bytes' \\(BYTES, shape \\[N\\]"):
        client.infer(name, [unknown], headers=auth())
    with pytest.raises(InferenceServerException, match="not served here"):
        client.get_model_metadata("resnet", headers=auth())
    with pytest.raises(InferenceServerException, match="API key") as caught:
        client.infer(name, [wrong_shape])
    assert caught.value.status() == "401"
