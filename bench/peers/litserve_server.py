"""LitServe serving :class:`bench.peers.model.Model` at ``POST /classify`` (multipart ``file``).

    python -m bench.peers.litserve_server --port 8000     # in .venv-peers; PEER_* environment

As LitServe's documentation sets up a model: a ``LitAPI`` whose ``setup`` loads it, whose
``decode_request`` turns the upload into the model's input (the service's preprocessing),
batched by LitServe (``max_batch_size=16``, ``batch_timeout=0.004``: its default ``batch``
stacks the arrays), ``predict`` runs the session and ``encode_response`` answers the top 5.
``LitServer(accelerator="auto", workers_per_device=PEER_WORKERS)``: its docs say to set the
workers per device to the cores on a CPU; one API server per inference worker (its default).
"""

# no `from __future__ import annotations`: the framework reads these annotations at run time
import argparse
from typing import Any

import litserve as ls
import numpy as np
from starlette.requests import Request

from bench.peers.model import Model, Prediction, from_environment, workers


class ClassifyAPI(ls.LitAPI):
    """Upload -> preprocessed image; a batch -> each image's top 5."""

    def setup(self, device: str) -> None:
        self.model: Model = from_environment()

    # LitServe reads this annotation to choose how to parse a request: ``Request`` (its default
    # without one) hands it the parsed form for a multipart upload
    def decode_request(self, request: Request) -> np.ndarray:
        return self.model.preprocess(request["file"].file.read())

    def predict(self, x: np.ndarray) -> list[list[Prediction]]:
        return self.model.infer(x)

    def encode_response(self, output: list[Prediction]) -> dict[str, Any]:
        return {"predictions": output}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    api = ClassifyAPI(max_batch_size=16, batch_timeout=0.004, api_path="/classify")
    server = ls.LitServer(api, accelerator="auto", workers_per_device=workers())
    server.run(host="127.0.0.1", port=args.port, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()
