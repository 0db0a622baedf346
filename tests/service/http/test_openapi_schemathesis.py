"""Property-based tests of the OpenAPI surface (schemathesis) against a real server on the
shipped model: requests generated from ``/openapi.json``, schema-valid and schema-violating,
and every answer checked by schemathesis's checks: no 5xx, a documented status, content type,
headers and body matching the schema, valid requests accepted and invalid ones refused.

``SMSO_FUZZ_SCALE=N`` runs N times as many cases (50 per operation and kind by default, about
15 s on 2 cores)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip("schemathesis", reason="schemathesis (dev extra) generates the requests")
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.service.conftest import png
from tests.service.test_server import real_server

pytestmark = pytest.mark.slow

EXAMPLES = 50 * int(os.environ.get("SMSO_FUZZ_SCALE", "1"))


@st.composite
def images(draw: st.DrawFn) -> bytes:
    """An encoded image of an accepted format: to the service a schema-valid image is a
    decodable one, which JSON Schema cannot say (``format: binary`` is any bytes)."""
    side = st.integers(1, 48)
    shape = (draw(side), draw(side), *draw(st.sampled_from([(), (3,)])))
    seed = draw(st.integers(0, 2**32 - 1))
    pixels = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    return png(pixels, draw(st.sampled_from(["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"])))


schemathesis.openapi.media_type("image/*", images())
schemathesis.openapi.format("binary", images())


@pytest.fixture(scope="module")
def api(shipped_model: str) -> Iterator[tuple[schemathesis.BaseSchema, dict[str, str]]]:
    """The schema, and the served model's name and version (path parameters)."""
    # no access log: nobody reads the server's output pipe during the run, and a full pipe
    # would stop the server
    with real_server(shipped_model, "--log-level", "warning") as (base, _):
        model = httpx.get(f"{base}/metadata").json()["model"]
        yield schemathesis.openapi.from_url(f"{base}/openapi.json"), model


def run(operation: Any, mode: GenerationMode, excluded: list[Any], **fixed: Any) -> None:
    """``EXAMPLES`` generated requests to ``operation``, each checked."""

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode, **fixed))
    def check(case: Any) -> None:
        case.call_and_validate(excluded_checks=excluded)

    check()


@pytest.mark.parametrize("model_named", [False, True], ids=["any-model", "served-model"])
@pytest.mark.parametrize(
    "mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"]
)
def test_every_operation_answers_within_its_schema(api, mode, model_named):
    schema, model = api
    failures = []
    for result in schema.get_all_operations():
        operation = result.ok()
        names = operation.path_parameters
        fixed: dict[str, Any] = {}
        if model_named:  # the served model's routes, beyond their 404 for any other name
            if not len(names):
                continue
            fixed["path_parameters"] = {
                name: model[{"model_name": "name", "model_version": "version"}[name]]
                for name in (p.name for p in names)
            }
        # a protocol request's tensors must fit the model (shape, datatype), which its JSON
        # Schema does not say: only that a schema-valid one is not a 5xx and is answered as
        # documented
        excluded = [positive_data_acceptance] if operation.path.endswith("/infer") else []
        try:
            run(operation, mode, excluded, **fixed)
        except Unsatisfiable:  # nothing to make invalid: no parameters, no body
            assert mode is GenerationMode.NEGATIVE, operation.label
        except (Exception, BaseExceptionGroup) as error:  # every operation's first failure
            failures.append(f"{operation.label}: {error}")
    assert not failures, "\n\n".join(failures)
