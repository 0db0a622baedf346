"""BentoML serving :class:`bench.peers.model.Model` at ``POST /classify`` (multipart ``file``).

    bentoml serve bench.peers.bentoml_service:Classifier --port 8000   # in .venv-peers

As BentoML's documentation sets up a service: a class under ``@bentoml.service`` that loads the
model in ``__init__``, and an API method under ``@bentoml.api`` taking files as
``pathlib.Path`` (BentoML writes each upload to a file of the request's temporary folder),
with adaptive batching on (``batchable=True, max_batch_size=16``). BentoML has no fixed batch
wait: its dispatcher sizes the wait from the latencies it observes, within ``max_latency_ms``
(left at its default). ``workers=PEER_WORKERS`` processes; on a GPU, ``resources={"gpu": 1}``.
"""

# no `from __future__ import annotations`: the framework reads these annotations at run time
from pathlib import Path
from typing import Any

import bentoml

from bench.peers.model import Model, from_environment, providers, workers

_GPU = providers() != "CPUExecutionProvider"


@bentoml.service(workers=workers(), **({"resources": {"gpu": 1}} if _GPU else {}))
class Classifier:
    """The model, its uploads batched."""

    def __init__(self) -> None:
        self.model: Model = from_environment()

    @bentoml.api(route="/classify", batchable=True, max_batch_size=16)
    def classify(self, file: list[Path]) -> list[dict[str, Any]]:
        answers = self.model.classify([path.read_bytes() for path in file])
        return [{"predictions": predictions} for predictions in answers]
