"""NVIDIA PyTriton serving :class:`bench.peers.model.Model` through Triton's HTTP front end.

    python -m bench.peers.pytriton_server --port 8000   # in .venv-peers; PEER_* environment

As PyTriton's documentation sets up a Python model: an inference function under ``@batch``
bound to Triton (``Triton.bind``) with its input and output tensors and a ``ModelConfig`` with
Triton's dynamic batcher (``max_batch_size=16``, ``max_queue_delay_microseconds=4000``).
Triton's C++ server parses HTTP (the Open Inference Protocol: ``POST
/v2/models/classifier/infer``, the JPEG as one ``BYTES`` element in binary form) and hands
batches to the function. PEER_WORKERS > 1 binds that many inference functions, each with a
model of its own: Triton's model instances, PyTriton's multi-instance setup. The answer: the
top 5 as two outputs, ``index`` (INT64) and ``score`` (FP32).

PyTriton runs the function in a Python "stub" that Triton starts, linked against
``libpython3.X.so.1.0``; where the interpreter is not the system's (pyenv, say) the loader
would find the system's library first, so its own library folder goes first on
``LD_LIBRARY_PATH`` before Triton starts.
"""

from __future__ import annotations

import argparse
import os
import socket
import sysconfig
from collections.abc import Callable
from typing import Any

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

from bench.peers.model import TOP_K, Model, from_environment, workers

#: The model's name in Triton: ``/v2/models/classifier/...``.
NAME = "classifier"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def infer_function(model: Model) -> Callable[..., dict[str, np.ndarray]]:
    """A batched inference function: ``image_bytes`` ``(N, 1)`` -> ``index``, ``score``
    ``(N, 5)``."""

    @batch
    def infer(image_bytes: np.ndarray) -> dict[str, np.ndarray]:
        answers = model.classify([bytes(row[0]) for row in image_bytes])
        index = np.array([[p["index"] for p in ps] for ps in answers], np.int64)
        score = np.array([[p["score"] for p in ps] for ps in answers], np.float32)
        return {"index": index, "score": score}

    return infer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
            [libdir, *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        )
    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.port,
        grpc_address="127.0.0.1",
        grpc_port=free_port(),
        metrics_port=free_port(),
    )
    functions: list[Any] = [infer_function(from_environment()) for _ in range(workers())]
    with Triton(config=config) as triton:
        triton.bind(
            model_name=NAME,
            infer_func=functions,
            inputs=[Tensor(name="image_bytes", dtype=np.bytes_, shape=(1,))],
            outputs=[
                Tensor(name="index", dtype=np.int64, shape=(TOP_K,)),
                Tensor(name="score", dtype=np.float32, shape=(TOP_K,)),
            ],
            config=ModelConfig(
                max_batch_size=16,
                batcher=DynamicBatcher(max_queue_delay_microseconds=4000),
            ),
        )
        triton.serve()


if __name__ == "__main__":
    main()
