"""Ray Serve serving :class:`bench.peers.model.Model` at ``POST /classify`` (multipart ``file``).

    python -m bench.peers.rayserve_app --port 8000    # in .venv-peers; PEER_* environment

As Ray Serve's documentation sets up a model behind HTTP: a deployment class with a FastAPI
ingress (``@serve.ingress``) whose route reads the upload and awaits a method under
``@serve.batch(max_batch_size=16, batch_wait_timeout_s=0.004)``, which preprocesses and runs the
batch. ``num_replicas=PEER_WORKERS`` (one CPU each, Ray Serve's default; on a GPU a share of
it each). Ray starts a local cluster (its defaults) and its HTTP proxy on ``--port``; SIGTERM
shuts Serve and Ray down.
"""

# no `from __future__ import annotations`: the framework reads these annotations at run time
import argparse
import signal
import sys
import threading
from typing import Any

import ray
from fastapi import FastAPI, UploadFile
from ray import serve

from bench.peers.model import Model, Prediction, from_environment, providers, workers

app = FastAPI()
_GPU = providers() != "CPUExecutionProvider"


@serve.deployment(
    num_replicas=workers(), ray_actor_options={"num_gpus": 1 / workers()} if _GPU else {}
)
@serve.ingress(app)
class Classifier:
    """The model; each upload waits for its batch."""

    def __init__(self) -> None:
        self.model: Model = from_environment()

    @app.get("/ready")
    def ready(self) -> dict[str, bool]:
        return {"ready": True}

    @app.post("/classify")
    async def classify(self, file: UploadFile) -> dict[str, Any]:
        return {"predictions": await self.batched(await file.read())}

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.004)
    async def batched(self, files: list[bytes]) -> list[list[Prediction]]:
        return self.model.classify(files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(Classifier.bind(), blocking=False)  # type: ignore[attr-defined]
    print("Ray Serve ready", file=sys.stderr, flush=True)
    stop.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
