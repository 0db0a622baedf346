"""The service's onnxruntime backend alone, by batch size: what a server is compared with.

:func:`open_backend` sets up ``service.runtime.backend.OnnxBackend`` as a server would, in one
of :data:`MODES`; :func:`raw_session` times its ``run`` on the same input each call, with no
server around it, and the stages its runner records (``service.telemetry.stage_clock``): what
a server's stage table shows, alone.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from service.runtime.backend import BackendOptions, OnnxBackend
from service.telemetry import stage_clock

#: How the backend runs a batch: as it comes, through IO binding, with a CUDA graph per bucket.
MODES = ("plain", "io-binding", "cuda-graphs")


def open_backend(
    path: str | Path, mode: str = "plain", providers: str = "auto", max_batch: int = 256
) -> OnnxBackend:
    """The service's backend on ``path`` in ``mode`` (one of :data:`MODES`)."""
    if mode not in MODES:
        raise ValueError(f"unknown raw mode {mode!r}; valid: {', '.join(MODES)}")
    options = BackendOptions(
        providers=providers,
        max_batch=max_batch,
        io_binding=mode == "io-binding",
        cuda_graphs=mode == "cuda-graphs",
    )
    return OnnxBackend(path, options)


def raw_session(
    backend: OnnxBackend,
    batches: Sequence[int],
    seconds: float,
    images: np.ndarray | None = None,
    warmups: int = 3,
    calls: int = 5,
) -> dict[str, Any]:
    """Images/s, median ms per call and median ms of each recorded stage, by batch size: at
    least ``calls`` calls and ``seconds`` per size after ``warmups`` (a first call at a shape,
    a CUDA graph's capture). The input: ``images`` (``(N, C, H, W)``, repeated to the batch
    size) or random ones of the card's input shape. Also the best batch size and its images/s."""
    spec = backend.card.input
    rng = np.random.default_rng(0)
    rows: dict[int, dict[str, Any]] = {}
    for batch in batches:
        if images is None:
            shape = (batch, spec.channels, spec.height, spec.width)
            inputs = rng.standard_normal(shape, np.float32)
        else:
            inputs = np.resize(images, (batch, *images.shape[1:])).astype(np.float32)
        for _ in range(warmups):
            backend.run(inputs)
        times: list[float] = []
        stages: list[dict[str, float]] = []
        begin = time.perf_counter()
        while len(times) < calls or time.perf_counter() - begin < seconds:
            stage_clock.take()
            start = time.perf_counter()
            backend.run(inputs)
            times.append(time.perf_counter() - start)
            stages.append(stage_clock.take())
        rows[batch] = {
            "images_per_second": batch * len(times) / sum(times),
            "ms_p50": 1e3 * statistics.median(times),
            "stages_ms_p50": {
                name: 1e3 * statistics.median(call[name] for call in stages) for name in stages[0]
            },
        }
    best = max(rows, key=lambda batch: rows[batch]["images_per_second"])
    return {
        "mode": backend.mode,
        "providers": backend.providers,
        "by_batch": rows,
        "best_batch": best,
        "images_per_second": rows[best]["images_per_second"],
    }
