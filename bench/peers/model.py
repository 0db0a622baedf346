"""What every peer server runs: the service's preprocessing, one onnxruntime session, top 5.

Each peer (:mod:`bench.peers.litserve_server` and its siblings) wraps a :class:`Model` in its
own API, so that all of them, and ``smso-serve``, compute the same thing per image:

* decoding and preprocessing: ``service.imaging.images.Preprocessor`` for the model card, with
  the service's default pixel limit (the very code ``smso-serve`` runs);
* inference: one session per process from ``service.runtime.providers.choose_providers``, with
  the service's session options (onnxruntime's default intra-op threads, no spinning); on the
  CUDA provider where a GPU and onnxruntime-gpu are there, else the CPU;
* the answer: softmax over the logits and the 5 best classes (ties: the lower index), as
  ``/classify`` answers them, ``{"predictions": [{"label", "index", "score"}, ...]}``.

:class:`StandinModel` is the GPU-like stand-in (:mod:`bench.lib.standin`'s backend, for the
peers): it sleeps ``latency_ms + per_image_ms * N`` per batch, one batch at a time, and answers
zeros, on the stand-in's card (ResNet at 224 px, 1,000 classes).

This module runs in the peers' environment (``.venv-peers``) as well as the service's: it
imports numpy, Pillow, onnxruntime and the service's imaging, card and provider modules only.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from service.core.card import CARD_KEY, ModelCard, parse_card
from service.imaging.images import Preprocessor
from service.runtime.providers import CPU, CUDA, choose_providers, has_nvidia_gpu

#: The service's default ``max_pixels`` (``service.core.settings.Settings``).
MAX_PIXELS = 50_000_000
#: Classes in an answer, as ``/classify`` answers by default.
TOP_K = 5
#: The environment variables a peer server reads its model from (``bench.peers.setups``).
MODEL_ENV, BACKEND_ENV, WORKERS_ENV = "PEER_MODEL", "PEER_BACKEND", "PEER_WORKERS"
#: The stand-in's cost per batch and per image (milliseconds), from the environment.
LATENCY_ENV, PER_IMAGE_ENV = "PEER_STANDIN_LATENCY_MS", "PEER_STANDIN_PER_IMAGE_MS"

Prediction = dict[str, Any]


def providers() -> str:
    """The providers a peer's session asks for: CUDA (then the CPU) where a GPU is there and
    onnxruntime has the CUDA provider, else the CPU alone."""
    if has_nvidia_gpu() and CUDA in ort.get_available_providers():
        return f"{CUDA},{CPU}"
    return CPU


def top_classes(logits: np.ndarray, labels: Sequence[str]) -> list[list[Prediction]]:
    """Each row of ``logits`` ``(N, K)`` as its :data:`TOP_K` best classes: softmax scores,
    best first, ties to the lower index (``service.dataplane.answers.top_classes``)."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    scores = np.exp(shifted)
    scores /= scores.sum(axis=-1, keepdims=True)
    best = np.argsort(-scores, axis=-1, kind="stable")[:, :TOP_K]
    return [
        [{"label": labels[k], "index": int(k), "score": float(row[k])} for k in order]
        for row, order in zip(scores, best, strict=True)
    ]


class Model:
    """An ONNX file written by smso-export: bytes -> preprocessed image -> top 5."""

    def __init__(self, path: str | Path) -> None:
        self.session, self.providers = choose_providers(providers(), Path(path))
        self.card: ModelCard = parse_card(self.session.get_modelmeta().custom_metadata_map)[0]
        self.input = self.session.get_inputs()[0].name
        self.preprocessor = Preprocessor(self.card.preprocessing, MAX_PIXELS)

    def preprocess(self, data: bytes) -> np.ndarray:
        """Encoded image bytes -> ``(C, S, S)`` float32, as the service decodes them."""
        return self.preprocessor(data)

    def infer(self, images: Sequence[np.ndarray] | np.ndarray) -> list[list[Prediction]]:
        """Preprocessed images (each ``(C, S, S)``, or stacked) -> each one's top 5, in one
        session call."""
        batch = images if isinstance(images, np.ndarray) else np.stack(images)  # (N, C, S, S)
        (logits,) = self.session.run(["logits"], {self.input: batch})
        return top_classes(logits, self.card.classes)

    def classify(self, files: Sequence[bytes]) -> list[list[Prediction]]:
        """Encoded images -> each one's top 5 (one batch)."""
        return self.infer([self.preprocess(data) for data in files])


class StandinModel(Model):
    """The GPU-like stand-in: the same preprocessing, then a sleep per batch (GIL released, one
    batch at a time, as one GPU stream runs them) and zeros as logits."""

    def __init__(self, latency_ms: float, per_image_ms: float) -> None:
        from bench.lib.standin import CARD

        self.card = parse_card({CARD_KEY: json.dumps(CARD)})[0]
        self.providers = ["StandinExecutionProvider"]
        self.preprocessor = Preprocessor(self.card.preprocessing, MAX_PIXELS)
        self.latency_s, self.per_image_s = latency_ms / 1e3, per_image_ms / 1e3
        self._lock = threading.Lock()

    def infer(self, images: Sequence[np.ndarray] | np.ndarray) -> list[list[Prediction]]:
        batch = np.array(images, np.float32)  # the copy a real backend makes before its upload
        with self._lock:
            time.sleep(self.latency_s + self.per_image_s * len(batch))
        logits = np.zeros((len(batch), len(self.card.classes)), np.float32)
        return top_classes(logits, self.card.classes)


def from_environment() -> Model:
    """The model a peer server serves, from :data:`MODEL_ENV` (a file) and :data:`BACKEND_ENV`
    (``onnx`` or ``standin``, with :data:`LATENCY_ENV` and :data:`PER_IMAGE_ENV`)."""
    backend = os.environ.get(BACKEND_ENV, "onnx")
    if backend == "standin":
        latency = float(os.environ.get(LATENCY_ENV, "1.3"))
        return StandinModel(latency, float(os.environ.get(PER_IMAGE_ENV, "0.03")))
    if backend != "onnx":
        raise ValueError(f"unknown {BACKEND_ENV} {backend!r}; valid: onnx, standin")
    return Model(os.environ[MODEL_ENV])


def workers() -> int:
    """The worker processes (or instances, or replicas) a peer runs: :data:`WORKERS_ENV`."""
    return int(os.environ.get(WORKERS_ENV, "1"))
