"""The HTTP API on a fake backend: every endpoint, input form, error, auth, overload, metrics."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.runtime.outputs import BackendOutputs
from service.runtime.runner import Batch

from .conftest import CLASSES, FakeBackend, HeldWarmUp, grey, png, warm_up_calls

NOISE = png(np.random.default_rng(0).integers(0, 255, (64, 64), dtype=np.uint8))


def classify(client, *images: bytes, **params):
    files = [("file", (f"img{i}.png", data, "image/png")) for i, data in enumerate(images)]
    return client.post("/classify", files=files, params=params)


def test_classify_answers_each_file_in_order_with_top_k_softmax_scores(make_client):
    client = make_client()
    response = classify(client, grey(200), grey(10), top_k=3)
    assert response.status_code == 200
    body = response.json()
    assert body["model"] == {"name": "fake-small_cnn-smso", "version": "0123456789ab"}
    assert [r["filename"] for r in body["results"]] == ["img0.png", "img1.png"]
    bright, dark = (r["predictions"] for r in body["results"])
    assert len(bright) == 3
    # the fake's logits are k * mean: a bright image favours class 9, a dark one class 0
    assert bright[0] == {"label": CLASSES[9], "index": 9, "score": bright[0]["score"]}
    assert dark[0]["index"] == 0
    x = (200 / 255 - 0.5) / 0.25
    expected = np.exp(x * np.arange(10)) / np.exp(x * np.arange(10)).sum()
    assert [p["score"] for p in bright] == pytest.approx(sorted(expected)[::-1][:3], rel=1e-5)


def test_a_raw_image_body_works_like_a_file_part(make_client):
    client = make_client()
    raw = client.post("/classify", content=grey(100), headers={"content-type": "image/png"})
    part = classify(client, grey(100))
    assert raw.status_code == 200
    assert raw.json()["results"][0]["filename"] == "body"
    assert raw.json()["results"][0]["predictions"] == part.json()["results"][0]["predictions"]


def test_embed_returns_p_numbers_per_image_and_can_normalise(make_client):
    client = make_client()
    files = [
        ("file", ("a.png", grey(100), "image/png")),
        ("file", ("b.png", grey(30), "image/png")),
    ]
    body = client.post("/embed", files=files).json()
    assert body["dim"] == 4
    assert [len(r["embedding"]) for r in body["results"]] == [4, 4]
    assert body["results"][0]["embedding"][0] == pytest.approx((100 / 255 - 0.5) / 0.25, rel=1e-5)
    unit = client.post("/embed", files=files, params={"normalize": "true"}).json()
    for result in unit["results"]:
        assert np.linalg.norm(result["embedding"]) == pytest.approx(1.0)


def test_a_solid_colour_image_gives_finite_numbers(make_client):
    body = classify(make_client(), grey(0)).json()
    assert all(np.isfinite(p["score"]) for p in body["results"][0]["predictions"])


@pytest.mark.parametrize(
    ("data", "content_type", "status", "code"),
    [
        (b"this is not an image", "image/png", 400, "invalid_image"),
        (b"", "image/png", 400, "empty_image"),
        (NOISE[: len(NOISE) // 2], "image/png", 400, "invalid_image"),  # truncated
        (b"hello", "text/plain", 415, "unsupported_media_type"),
        (b'{"a": 1}', "application/json", 415, "unsupported_media_type"),
    ],
)
def test_bad_raw_bodies_get_clear_json_errors(make_client, data, content_type, status, code):
    response = make_client().post("/classify", content=data, headers={"content-type": content_type})
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["message"]


def test_a_bad_file_among_good_ones_is_named(make_client):
    files = [
        ("file", ("good.png", grey(1), "image/png")),
        ("file", ("broken.jpg", b"\xff\xd8\xff garbage", "image/jpeg")),
    ]
    response = make_client().post("/classify", files=files)
    assert response.status_code == 400
    assert "broken.jpg" in response.json()["error"]["message"]


def test_a_part_that_is_not_an_image_is_415(make_client):
    files = [("file", ("notes.txt", b"hello", "text/plain"))]
    response = make_client().post("/embed", files=files)
    assert response.status_code == 415
    assert "notes.txt" in response.json()["error"]["message"]


def test_a_form_without_a_file_part_is_422_and_says_what_to_send(make_client):
    response = make_client().post("/classify", files=[("image", ("a.png", grey(1), "image/png"))])
    assert response.status_code == 422
    assert "'file'" in response.json()["error"]["message"]


def test_a_bad_query_is_422_json(make_client):
    response = classify(make_client(), grey(1), top_k=0)
    assert response.status_code == 422
    assert "top_k" in response.json()["error"]["message"]


def test_a_mistyped_query_parameter_is_422_not_ignored(make_client):
    client = make_client()
    response = classify(client, grey(1), topk=3)
    assert response.status_code == 422
    assert response.json()["error"] == {
        "code": "unknown_query_parameter",
        "message": "unknown query parameter 'topk'; /classify accepts filename, top_k",
    }
    files = [("file", ("a.png", grey(1), "image/png"))]
    answer = client.post("/embed", files=files, params={"normalise": "true"})
    assert answer.status_code == 422
    assert answer.json()["error"]["message"] == (
        "unknown query parameter 'normalise'; /embed accepts dtype, encoding, filename, normalize"
    )
    assert client.post("/embed", files=files, params={"normalize": "true"}).status_code == 200


def test_an_image_part_of_another_name_beside_file_parts_is_422(make_client):
    files = [
        ("file", ("a.png", grey(1), "image/png")),
        ("image", ("b.png", grey(2), "image/png")),
    ]
    response = make_client().post("/classify", files=files)
    assert response.status_code == 422
    assert response.json()["error"] == {
        "code": "unknown_part",
        "message": "parts named 'image' are not read; send each image as a multipart part "
        "named 'file' and nothing else",
    }


def test_uploads_over_the_byte_limit_are_413_before_decoding(make_client):
    client = make_client(max_upload_bytes=2048, max_request_bytes=4096)
    big = png(np.random.default_rng(0).integers(0, 255, (64, 64), dtype=np.uint8))
    assert len(big) > 2048
    assert classify(client, big).status_code == 413
    raw = client.post("/classify", content=big, headers={"content-type": "image/png"})
    assert raw.status_code == 413
    assert raw.json()["error"]["code"] == "payload_too_large"
    assert classify(client, grey(1), grey(2), grey(3), grey(4), big).status_code == 413


def test_images_over_the_pixel_limit_are_413_without_decoding(make_client):
    client = make_client(max_pixels=1000)
    response = classify(client, grey(1, size=(40, 40)))
    assert response.status_code == 413
    assert "1,600 pixels" in response.json()["error"]["message"]


def test_too_many_files_are_413(make_client):
    response = classify(make_client(max_files=2), grey(1), grey(2), grey(3))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_many_files"


def test_with_an_api_key_inference_and_metadata_need_it_and_health_does_not(make_client):
    client = make_client(api_key="s3cret")
    assert classify(client, grey(1)).status_code == 401
    assert client.get("/metadata").status_code == 401
    wrong = client.get("/metadata", headers={"x-api-key": "nope"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "unauthorized"
    assert client.get("/metadata", headers={"x-api-key": "s3cret"}).status_code == 200
    bearer = {"authorization": "Bearer s3cret"}
    files = [("file", ("a.png", grey(1), "image/png"))]
    assert client.post("/embed", files=files, headers=bearer).status_code == 200
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/metrics").status_code == 200


def test_metadata_serves_the_model_card(make_client):
    body = make_client().get("/metadata").json()
    assert body["card"]["classes"] == CLASSES
    assert body["card"]["model"]["embedding_dim"] == 4
    assert body["providers"] == ["FakeExecutionProvider"]


def test_readyz_is_503_while_warming_up_then_200(make_client):
    backend = HeldWarmUp()
    client = make_client(backend, wait=False, max_batch_size=3)
    try:
        assert client.get("/healthz").status_code == 200
        loading = client.get("/readyz")
        assert loading.status_code == 503
        assert loading.json() == {"status": "loading"}
        assert classify(client, grey(1)).status_code == 503
    finally:
        backend.release.set()
    deadline = time.monotonic() + 10
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # each bucket (1, 2 and 3) ran before ready: in a thread of its own, then on the batcher's
    assert backend.calls == warm_up_calls(3) == 6


def test_requests_are_batched_together(make_client):
    backend = FakeBackend(delay_s=0.05)
    client = make_client(backend, max_batch_size=8, max_wait_ms=50)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda v: classify(client, grey(v)), range(8)))
    assert all(r.status_code == 200 for r in responses)
    assert max(backend.batches) > 1
    assert sum(backend.batches) == 8


def test_overload_gives_503_with_retry_after_not_a_pile_up(make_client):
    backend = FakeBackend(delay_s=0.3)
    client = make_client(backend, max_batch_size=1, queue_size=1, max_files=1, max_wait_ms=0)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(lambda v: classify(client, grey(v)), range(6)))
    statuses = sorted(r.status_code for r in responses)
    assert 200 in statuses
    assert 503 in statuses
    rejected = next(r for r in responses if r.status_code == 503)
    assert rejected.headers["retry-after"] == "1"
    assert rejected.json()["error"]["code"] == "overloaded"


def test_a_request_past_its_deadline_is_504(make_client):
    client = make_client(FakeBackend(delay_s=0.5), request_timeout_s=0.1)
    response = classify(client, grey(1))
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "deadline_exceeded"


def test_a_failing_batch_fails_every_request_in_it_with_json(make_client):
    client = make_client(FakeBackend(fail=True, delay_s=0.05), max_batch_size=4, max_wait_ms=50)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        responses = list(pool.map(lambda v: classify(client, grey(v)), range(3)))
    assert [r.status_code for r in responses] == [500] * 3
    assert all("fell over" in r.json()["error"]["message"] for r in responses)
    # counted as the 500s they are: the server reports http.disconnect once a response is
    # complete, which once made the metrics count them as clients gone (499)
    text = client.get("/metrics").text
    assert 'smso_http_requests_total{method="POST",route="/classify",status="500"} 3.0' in text


class NaNBackend(FakeBackend):
    """A broken model: NaN logits for every image."""

    def run(self, images: Batch) -> BackendOutputs:
        outputs = super().run(images)
        return dataclasses.replace(outputs, logits=np.full_like(outputs.logits, np.nan))


def test_a_model_that_gives_nan_is_a_500_that_says_so_on_every_route(make_client, caplog):
    client = make_client(NaNBackend())
    embed = client.post("/embed", files=[("file", ("a.png", grey(1), "image/png"))])
    for response in (classify(client, grey(1)), embed):
        assert response.status_code == 500
        assert response.json()["error"] == {
            "code": "model_output_not_finite",
            "message": "the model's outputs are NaN or infinite: the model file is at fault, "
            "not the image",
        }
    assert "NaN or infinite outputs for 1 of 1 images" in caplog.text
    assert "Traceback" not in caplog.text


def test_unknown_routes_and_methods_are_json(make_client):
    client = make_client()
    assert client.get("/nope").json()["error"]["code"] == "not_found"
    assert client.get("/classify").status_code == 405


def test_metrics_are_labelled_by_route_and_skip_health_checks(make_client):
    client = make_client()
    classify(client, grey(1))
    classify(client, b"junk")
    client.get("/healthz")
    client.get("/readyz")
    text = client.get("/metrics").text
    assert 'smso_http_requests_total{method="POST",route="/classify",status="200"} 1.0' in text
    assert 'smso_http_requests_total{method="POST",route="/classify",status="400"} 1.0' in text
    assert "/healthz" not in text
    assert "/readyz" not in text
    for name in (
        "smso_http_request_duration_seconds",
        "smso_queue_wait_seconds",
        "smso_inference_seconds",
        "smso_batch_size",
        "smso_queue_depth",
        "smso_decode_seconds",
    ):
        assert name in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    stages = {
        sample.labels["stage"]
        for sample in families["smso_inference_stage_seconds"].samples
        if sample.name.endswith("_count")
    }
    assert stages == {"stack"}  # the one stage the fake backend records


def test_openapi_documents_the_image_body(make_client):
    schema = make_client().get("/openapi.json").json()
    body = schema["paths"]["/classify"]["post"]["requestBody"]["content"]
    assert {"multipart/form-data", "image/*"} <= set(body)


def queue_depth(client) -> float:
    (line,) = [
        ln for ln in client.get("/metrics").text.splitlines() if ln.startswith("smso_queue_depth ")
    ]
    return float(line.split()[1])


def test_the_queue_depth_gauge_falls_to_zero_when_waiting_callers_have_left(make_client):
    """Images whose requests passed their deadline still sit in the queue until the batcher
    drops them; once it has, the gauge must say the queue is empty, not what it last saw."""
    client = make_client(
        FakeBackend(delay_s=1.0), max_batch_size=1, max_wait_ms=0, request_timeout_s=0.5
    )
    # a process's first decoding is slow (Pillow's start-up): that request may pass its
    # deadline before its image reaches the queue, the next ones do not
    assert classify(client, grey(0)).status_code == 504
    registry = client.app.state.smso.metrics.registry
    seen = []  # the gauge while the request waits (read in-process: /metrics is slow here)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # four images in one request: one batch at a time of one, so three wait in the queue
        sent = pool.submit(classify, client, *(grey(v) for v in range(4)))
        while not sent.done():
            seen.append(registry.get_sample_value("smso_queue_depth"))
            time.sleep(0.005)
    assert sent.result().status_code == 504
    assert max(seen) > 0  # it rose, so its fall below is the batcher's report
    deadline = time.monotonic() + 5
    while (
        client.app.state.smso.registry.lookup().batcher.depth
    ):  # the batcher drops the images of gone callers
        assert time.monotonic() < deadline
        time.sleep(0.02)
    deadline = time.monotonic() + 1
    while (depth := queue_depth(client)) != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert depth == 0
