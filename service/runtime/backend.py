"""The inference backend: a small interface, and its onnxruntime implementation.

The app talks to a :class:`Backend` only, so tests can put a fake, slow or failing one in its
place. :class:`OnnxBackend` runs a file written by smso-export as
:func:`service.runtime.session_builder.build_session` sets it up: its model card read and checked
against the graph, a session on the providers :func:`service.runtime.providers.choose_providers`
picks, and a :mod:`service.runtime.runner` (padded to batch-size buckets on a GPU, a session per
bucket on CUDA, IO binding and CUDA graphs where asked).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from service.core.card import InputSpec, ModelCard
from service.runtime.outputs import BackendOutputs
from service.runtime.providers import choose_providers
from service.runtime.runner import Batch
from service.runtime.session_builder import BackendOptions, build_session, read_card

__all__ = [
    "Backend",
    "BackendOptions",
    "BackendOutputs",
    "OnnxBackend",
    "choose_providers",
    "read_card",
    "warm_up_inputs",
]

log = logging.getLogger("service.backend")  # stable for logging configs, wherever the module lives


class Backend(Protocol):
    """What the service needs from a model: its card, and a batched forward pass."""

    card: ModelCard
    card_dict: dict[str, Any]
    providers: list[str]

    def run(self, images: Batch) -> BackendOutputs:
        """N images ``(C, H, W)`` float32 (:data:`service.runtime.runner.Batch`) -> their N
        rows of each output: logits ``(N, K)``, embedding ``(N, p)`` and where the file has one
        the typicality score ``(N,)`` or the features ``(N, C_b)``; thread-safe."""
        ...


def warm_up_inputs(spec: InputSpec, sizes: Sequence[int]) -> Iterator[np.ndarray]:
    """What warm-up runs: one batch ``(size, C, H, W)`` float32 of standard normal values
    (seed 0) per size in ``sizes``, for the input ``spec``."""
    rng = np.random.default_rng(0)
    for size in sizes:
        yield rng.standard_normal((size, spec.channels, spec.height, spec.width), np.float32)


class OnnxBackend:
    """An ONNX file written by smso-export, run by onnxruntime."""

    def __init__(self, path: str | Path, options: BackendOptions | None = None) -> None:
        ready = build_session(path, options or BackendOptions())
        self.card, self.card_dict = ready.card, ready.card_dict
        self.providers = ready.providers
        #: what run() answers: logits and embedding, then the typicality score where the file
        #: computes it (``export.typicality_graph``), else the backbone's averaged features
        #: where it has them (for the score in numpy: ``modelcard.typicality``)
        self.outputs = ready.outputs
        self.session = ready.session  # the file's metadata (the session host's hello)
        self.mode = ready.mode
        #: the batch sizes the runner pads to (None: every size as it comes, on the CPU)
        self.buckets = ready.buckets
        self.warmup_batches = ready.warmup_batches
        self._runner = ready.runner
        log.info("loaded %s on %s (%s)", path, ", ".join(self.providers), self.mode)

    def run(self, images: Batch) -> BackendOutputs:
        """The images' rows of each output (:attr:`outputs`)."""
        return self._runner(images)

    def terminate(self) -> None:
        """Stop the onnxruntime calls running now, from any thread (each raises), and every
        later one: for a model given up on (its warm-up past the load deadline)."""
        self._runner.terminate()
