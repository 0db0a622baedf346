"""A method a route does not take: 405 in the service's error shape, naming the methods it does
take, in the message and in the ``Allow`` header."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/classify", "POST"),
        ("PUT", "/embed", "POST"),
        ("GET", "/models/fake/classify", "POST"),
        ("POST", "/healthz", "GET, HEAD"),
        # two routes of one path (GET and HEAD): both named, not only the first one tried
        ("POST", "/readyz", "GET, HEAD"),
    ],
)
def test_a_405_names_the_methods_the_route_accepts(make_client, method, path, allowed):
    response = make_client().request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allowed
    error = response.json()["error"]
    assert error["code"] == "method_not_allowed"
    said = allowed.replace(", ", " and ")
    assert f"accepts {said}, not {method}" in error["message"], error["message"]


def test_a_405_under_v2_keeps_the_protocols_error_shape(make_client):
    response = make_client().get("/v2/models/fake/infer")
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert response.json() == {"error": "/v2/models/{model_name}/infer accepts POST, not GET"}


def test_a_long_method_is_not_repeated_in_the_message(make_client):
    method = "X" * 4096
    response = make_client().request(method, "/classify")
    assert response.status_code == 405
    message = response.json()["error"]["message"]
    assert message == "/classify accepts POST, not this method"
