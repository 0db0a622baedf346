"""Where the inference thread's time on a batch goes: seconds by stage, per thread.

The batcher times a whole batch in its inference thread (``smso_inference_seconds``); the
runner underneath knows its stages (padding to a bucket, the copy to the device, the
onnxruntime call, the copy back). They meet here without either knowing the other: the
runner calls :func:`record` after each stage, and the batcher calls :func:`take` after the
batch, in the same thread, for ``{stage: seconds}``. Stages a runner does not have are simply
absent; a run function that records nothing gives ``{}``.

The clock is thread-local, so batches run by different threads (several models, warm-up)
never mix, and it costs one ``perf_counter`` call and a dict update per stage.

A stage that releases the GIL (the onnxruntime call, large copies) includes the wait to take
it back, up to ``sys.getswitchinterval()`` (5 ms) per release when another thread keeps the
interpreter busy: comparing ``run`` with the session's time alone tells such waits apart from
the device's own time.
"""

from __future__ import annotations

import threading
import time

__all__ = ["STAGES", "record", "take"]

#: the stages the service's runners record, in the order a batch goes through them
STAGES = ("stack", "pad", "upload", "run", "download")

_local = threading.local()


def record(stage: str, since: float) -> float:
    """Add ``perf_counter() - since`` seconds to ``stage`` for the calling thread; returns
    the ``perf_counter()`` it read, the start of the next stage."""
    now = time.perf_counter()
    times: dict[str, float] | None = getattr(_local, "times", None)
    if times is None:
        times = _local.times = {}
    times[stage] = times.get(stage, 0.0) + (now - since)
    return now


def take() -> dict[str, float]:
    """The calling thread's seconds by stage since its last ``take``, and a fresh start."""
    times: dict[str, float] = getattr(_local, "times", None) or {}
    _local.times = {}
    return times
