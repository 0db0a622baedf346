"""Where the inference thread's time on a batch goes: seconds by stage, per thread.

The batcher times a whole batch in its inference thread (``smso_inference_seconds``); the
runner underneath knows its stages (the images into one array, padded to a bucket; the copy to
the device, the onnxruntime call, the copy back), and the typicality scoring after it its own.
They meet here without knowing each other: each calls :func:`record` after its stage, and the
batcher calls :func:`take` after the batch, in the same thread, for ``{stage: seconds}``.
Stages a runner does not have are absent: ``upload`` and ``download`` only with IO binding
(CUDA graphs); elsewhere ``run`` includes onnxruntime's own copies. With a shared session
(:mod:`service.runtime.session_host`) the worker times ``stack`` (into shared memory), the host's
process upload to download, and the worker adds ``handoff`` (the messages both ways) and
``share`` (the wait in the host for other workers' batches ahead, and the copy of its rows into
the merged batch). A run function that records nothing gives ``{}``. Together the stages
account for the batch's time but for slicing the outputs and Python's calls between them.

The clock is thread-local, so the batchers of several models (a thread each) never mix; the
batcher takes the clock before each batch too, dropping what a call outside a batch (warm-up)
left on its thread. It costs one ``perf_counter`` call and a dict update per stage.

A stage that releases the GIL (the onnxruntime call, large copies) includes the wait to take
it back, up to ``sys.getswitchinterval()`` (5 ms) per release when another thread keeps the
interpreter busy: comparing ``run`` with the session's time alone tells such waits apart from
the device's own time.
"""

from __future__ import annotations

import threading
import time

__all__ = ["STAGES", "add", "record", "take"]

#: the stages a batch goes through, in order (a metric label: :func:`record` takes no other)
STAGES = ("stack", "handoff", "share", "upload", "run", "download", "score")

_local = threading.local()


def record(stage: str, since: float) -> float:
    """Add ``perf_counter() - since`` seconds to ``stage`` for the calling thread; returns
    the ``perf_counter()`` it read, the start of the next stage. ``stage``: one of
    :data:`STAGES`."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
    now = time.perf_counter()
    times: dict[str, float] | None = getattr(_local, "times", None)
    if times is None:
        times = _local.times = {}
    times[stage] = times.get(stage, 0.0) + (now - since)
    return now


def add(stage: str, seconds: float) -> None:
    """Add ``seconds`` to ``stage`` for the calling thread (a stage timed elsewhere: in the
    session host's process). ``stage``: one of :data:`STAGES`."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
    times: dict[str, float] | None = getattr(_local, "times", None)
    if times is None:
        times = _local.times = {}
    times[stage] = times.get(stage, 0.0) + seconds


def take() -> dict[str, float]:
    """The calling thread's seconds by stage since its last ``take``, and a fresh start."""
    times: dict[str, float] = getattr(_local, "times", None) or {}
    _local.times = {}
    return times
