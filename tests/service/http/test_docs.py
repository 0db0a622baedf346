"""The offline API docs' requests are labelled by their routes, as every other request is."""

from __future__ import annotations

import logging

from prometheus_client.parser import text_string_to_metric_families


def test_the_docs_and_their_files_are_labelled_by_their_routes(make_client, caplog):
    client = make_client()
    caplog.set_level(logging.INFO, logger="service.access")
    paths = {
        "/docs": "/docs",
        "/redoc": "/redoc",
        "/openapi.json": "/openapi.json",
        "/docs-assets/swagger-ui-bundle.js": "/docs-assets/{path}",
        "/docs-assets/favicon.png": "/docs-assets/{path}",
        "/docs-assets/no-such-file.js": "/docs-assets/{path}",  # 404, under the same route
    }
    for path in paths:
        assert client.get(path).status_code in (200, 404), path
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    samples = [s for s in families["smso_http_requests"].samples if s.name.endswith("_total")]
    routes = {s.labels["route"] for s in samples}
    assert routes == set(paths.values())  # none "unmatched"
    logged = [r.access["route"] for r in caplog.records if hasattr(r, "access")]
    assert logged == list(paths.values())
