"""A GPU-like stand-in backend: the serving path measured without a GPU hiding it.

On a 2-core CPU the real model's inference hides the cost of everything around it; on a GPU it
does not (ResNet-50 SMSO runs a batch of 64 in about 12 ms on an H100). :class:`StandinBackend`
answers like a GPU would: it copies the batch's images into an array it keeps (as
``service.runtime.runner.BoundRunner`` does before the upload), sleeps ``latency_ms +
per_image_ms * N`` per batch with the GIL released, as onnxruntime's CUDA provider waits for the
device, and returns outputs of the right shapes. Its card is ResNet-50's at 224 px (1,000
classes, p = 2,048, ImageNet preprocessing: resize 256, crop 224), so decoding and request
bodies cost what they cost with the real model.

Defaults from the raw session of ResNet-50 SMSO p = 2,048 on an H100 (onnxruntime 1.31, CUDA
provider): batch 1 in 1.3 ms, about 5,200 images/s at large batches. ``python -m bench.standin``
serves it.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np

from service.core.card import CARD_KEY, ModelCard, parse_card
from service.runtime.outputs import BackendOutputs
from service.runtime.runner import Batch, fill

CARD: dict[str, Any] = {
    "format": "smso-model-card",
    "version": 1,
    "dataset": "standin",
    "classes": [f"class{k}" for k in range(1000)],
    "input": {"name": "image", "channels": 3, "height": 224, "width": 224, "dynamic_size": False},
    "preprocessing": {
        "colour": "RGB",
        "resize": 256,
        "crop": 224,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
    },
    "model": {"backbone": "resnet50", "head": "smso", "embedding_dim": 2048},
    "checkpoint": {"sha256": "5da4d1115da4d111"},
}


def card() -> ModelCard:
    """:data:`CARD` as the service reads it."""
    return parse_card({CARD_KEY: json.dumps(CARD)})[0]


class StandinBackend:
    """Copies the images, sleeps like a GPU batch, answers zeros of the right shapes; counts
    batches."""

    def __init__(self, latency_ms: float = 1.3, per_image_ms: float = 0.19) -> None:
        self._host = np.zeros((0, 3, 224, 224), np.float32)  # grows to the largest batch
        self.card, self.card_dict = parse_card({CARD_KEY: json.dumps(CARD)})
        self.providers = ["StandinExecutionProvider"]
        self.latency_s, self.per_image_s = latency_ms / 1e3, per_image_ms / 1e3
        self.batches = 0
        self._lock = threading.Lock()  # one batch at a time, as one GPU stream runs them

    def run(self, images: Batch) -> BackendOutputs:
        n = len(images)
        with self._lock:
            if len(self._host) < n:
                self._host = np.zeros((n, 3, 224, 224), np.float32)
            fill(self._host, images)
            time.sleep(self.latency_s + self.per_image_s * n)
            self.batches += 1
        classes, dim = len(self.card.classes), self.card.model.embedding_dim
        return BackendOutputs(
            logits=np.zeros((n, classes), np.float32), embedding=np.zeros((n, dim), np.float32)
        )
