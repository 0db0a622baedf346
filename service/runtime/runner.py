"""How a batch goes through an onnxruntime session: plainly, or bound to fixed buffers.

Batch-size buckets (:func:`buckets`): 1, 2, 4, ... up to the largest batch. On an accelerator a
batch is padded up to its bucket, so the session only ever sees a handful of shapes: warm-up runs
each bucket once (cuDNN's algorithm search, TensorRT's profile, a CUDA graph per bucket) instead
of every size from 1 to ``max_batch``, and no request pays for a first call at a new size. The
padded rows cost at most as much again on the GPU, where small batches are bound by latency, not
arithmetic; on the CPU, where they would cost the same arithmetic, batches are not padded.

On CUDA each bucket has a session of its own whose shapes are all fixed
(:func:`service.runtime.providers.shaped_session`): onnxruntime's CUDA convolutions (1.20 and later,
on cuDNN's frontend API) rebuild their execution plans whenever the input shape differs from the
last call's, which cost about 100 ms per batch of ResNet-50 on an H100 when a server's batches
alternate between buckets (microsoft/onnxruntime#23006); one shape per session never does, and
a fixed shape lets the shape arithmetic fold away, so that every node runs on CUDA and can be
captured in a CUDA graph.

A runner takes the batch as its images (:data:`Batch`: the batcher's list of ``(C, H, W)``
arrays, or one ``(N, C, H, W)`` array) and copies them once, into the array the session reads,
already of the bucket's size and kept from call to call (:func:`fill`). Stacking, then padding
in a new array cost an H200 server 9.5 + 8.2 ms per batch of 31 ImageNet-sized images; on 2 CPU
cores the one copy takes 2.1 times less at 31 images, 1.6 at 64 (measured with
``bench/batch_copy.py``, removed since; see commit 0888bcb).

* :class:`PlainRunner`: ``session.run`` on numpy arrays (onnxruntime copies the input to the
  device and the outputs back inside the call).
* :class:`BoundRunner`: a host array of the largest bucket's rows, and per bucket an IO binding
  of an input and the outputs that live on the device at fixed addresses, reused by every call:
  the images are copied into the host array, its bucket's rows to the device in place, the
  outputs copied back once. Fixed addresses are what a CUDA graph needs (``gpu_graph_id`` =
  bucket number + 1); the same class runs on the CPU (``device="cpu"``), which is how it is
  tested without a GPU.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeAlias, TypeGuard

import numpy as np
import onnxruntime as ort

from service.runtime.graph import INPUT, OUTPUTS
from service.runtime.outputs import BackendOutputs
from service.telemetry import stage_clock

__all__ = [
    "Batch",
    "BoundRunner",
    "PlainRunner",
    "Runner",
    "Sessions",
    "bucket_for",
    "buckets",
    "fill",
    "stacked",
]

#: N images ``(C, H, W)`` float32: a sequence of them, or one ``(N, C, H, W)`` array.
Batch: TypeAlias = np.ndarray | Sequence[np.ndarray]

#: ``Batch`` of N images -> their N rows of each output (:class:`BackendOutputs`).
Runner: TypeAlias = Callable[[Batch], BackendOutputs]


class _Terminable:
    """onnxruntime's run options of a runner's calls: :meth:`terminate` makes the calls running
    now raise (onnxruntime checks ``RunOptions.terminate`` between nodes, and a ``Loop`` at each
    iteration), and every later call too."""

    _options: list[ort.RunOptions]

    def terminate(self) -> None:
        """Stop every call of this runner, now and from now on (from any thread)."""
        for options in self._options:
            options.terminate = True


#: One session for every batch, or one per bucket (``size -> session``).
Sessions: TypeAlias = ort.InferenceSession | Mapping[int, ort.InferenceSession]


def _per_bucket(sessions: Sessions, sizes: Sequence[int]) -> dict[int, ort.InferenceSession]:
    if isinstance(sessions, Mapping):
        missing = [size for size in sizes if size not in sessions]
        if missing:
            raise ValueError(f"no session for the buckets {missing}")
        return dict(sessions)
    return dict.fromkeys(sizes, sessions)


def buckets(max_batch: int) -> list[int]:
    """``[1, 2, 4, ..., max_batch]``: powers of two below ``max_batch``, then ``max_batch``."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes = []
    size = 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    return [*sizes, max_batch]


def bucket_for(n: int, sizes: Sequence[int]) -> int:
    """The smallest bucket that holds ``n`` images (``sizes`` ascending)."""
    index = bisect.bisect_left(sizes, n)
    if index == len(sizes):
        raise ValueError(f"a batch of {n} is larger than the largest bucket ({sizes[-1]})")
    return sizes[index]


def fill(out: np.ndarray, images: Batch) -> int:
    """Copy the ``n`` images into ``out[:n]`` (``out``: ``(M, C, H, W)``, ``M >= n``) in one
    copy, with no stacked array in between; returns ``n``. The rows after them keep what they
    held: rows are independent, a padded row's outputs are never read."""
    n = len(images)
    if n > len(out):
        raise ValueError(f"a batch of {n} does not fit in {len(out)} rows")
    if isinstance(images, np.ndarray):
        out[:n] = images
    elif n:
        np.stack(images, out=out[:n])
    return n


def _whole(images: Batch, size: int) -> TypeGuard[np.ndarray]:
    """Whether ``images`` is already the session's input for bucket ``size``: one contiguous
    float32 array of exactly ``size`` rows (the session host's merged rounds)."""
    return (
        isinstance(images, np.ndarray)
        and len(images) == size
        and images.dtype == np.float32
        and images.flags.c_contiguous
    )


def stacked(images: Batch) -> np.ndarray:
    """The images as one ``(N, C, H, W)`` array (an array is returned as it is)."""
    return images if isinstance(images, np.ndarray) else np.stack(images)


class PlainRunner(_Terminable):
    """``session.run`` on numpy arrays; pads to a bucket (and takes its session) where
    ``sizes`` is given. ``outputs``: the graph's outputs it answers, by name."""

    def __init__(
        self,
        session: Sessions,
        *,
        sizes: Sequence[int] | None = None,
        outputs: Sequence[str] = OUTPUTS,
    ) -> None:
        self.outputs = list(outputs)
        self._options = [ort.RunOptions()]
        self.sizes = list(sizes) if sizes else None
        if self.sizes is None:
            if isinstance(session, Mapping):
                raise ValueError("sessions per bucket need the bucket sizes")
            self.session = session
        else:
            self.sessions = _per_bucket(session, self.sizes)
            self.session = self.sessions[self.sizes[-1]]

    @property
    def mode(self) -> str:
        """``plain`` (every batch as it comes) or ``buckets`` (padded to one)."""
        return "plain" if self.sizes is None else "buckets"

    def __call__(self, images: Batch) -> BackendOutputs:
        """Records the stages ``stack`` (the images into one array, zero rows after them up
        to the bucket; none for an array that is the bucket already) and ``run``
        (:mod:`service.telemetry.stage_clock`)."""
        n = len(images)
        session = self.session
        start = time.perf_counter()
        if self.sizes is None:
            batch = stacked(images)
        else:
            size = bucket_for(n, self.sizes)
            session = self.sessions[size]
            if _whole(images, size):
                batch = images
            else:
                batch = np.empty((size, *images[0].shape), np.float32)
                batch[fill(batch, images) :] = 0
        start = stage_clock.record("stack", start)
        outputs = session.run(self.outputs, {INPUT: batch}, self._options[0])
        stage_clock.record("run", start)
        return BackendOutputs.from_named(dict(zip(self.outputs, outputs, strict=True))).rows(0, n)


class BoundRunner(_Terminable):
    """IO binding with one set of device buffers per bucket (and a CUDA graph per bucket where
    the session was created with ``enable_cuda_graph``)."""

    def __init__(
        self,
        session: Sessions,
        *,
        input_shape: tuple[int, int, int],
        outputs: Mapping[str, tuple[int, ...]],
        sizes: Sequence[int],
        device: str = "cuda",
        device_id: int = 0,
        graphs: bool = False,
    ) -> None:
        """``input_shape``: ``(C, H, W)``; ``outputs``: each output bound, by name, with its
        shape after the batch dimension: ``{"logits": (10,), "embedding": (64,),
        "typicality": ()}`` (or ``"features": (128,)``)."""
        self.outputs = list(outputs)
        self.sizes = list(sizes)
        self.sessions = _per_bucket(session, self.sizes)
        self.session = self.sessions[self.sizes[-1]]
        self.graphs = graphs
        self._lock = threading.Lock()  # a binding's buffers serve one call at a time
        self._slots: dict[int, tuple[ort.IOBinding, ort.OrtValue, ort.RunOptions]] = {}
        self._options: list[ort.RunOptions] = []
        #: the host array the images are copied into, then a bucket's first rows to the device
        #: (one for every bucket: the lock lets one call at a time use it)
        self._host = np.zeros((self.sizes[-1], *input_shape), np.float32)

        def value(shape: tuple[int, ...]) -> ort.OrtValue:
            return ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, device, device_id)

        for number, size in enumerate(self.sizes):
            image = value((size, *input_shape))
            image.update_inplace(np.zeros((size, *input_shape), np.float32))
            binding = self.sessions[size].io_binding()
            binding.bind_ortvalue_input(INPUT, image)
            for name, tail in outputs.items():
                binding.bind_ortvalue_output(name, value((size, *tail)))
            options = ort.RunOptions()
            if graphs:
                options.add_run_config_entry("gpu_graph_id", str(number + 1))
            self._slots[size] = (binding, image, options)
            self._options.append(options)

    @property
    def mode(self) -> str:
        """``io-binding``, or ``cuda-graphs`` where each bucket's run is a CUDA graph."""
        return "cuda-graphs" if self.graphs else "io-binding"

    def __call__(self, images: Batch) -> BackendOutputs:
        """Records the stages ``stack`` (the images into the bucket's host array, with the
        wait for another call's buffers), ``upload``, ``run`` and ``download``
        (:mod:`service.telemetry.stage_clock`). An array of exactly the bucket's rows (the session
        host's merged rounds) is uploaded as it is, without the copy."""
        n = len(images)
        size = bucket_for(n, self.sizes)
        start = time.perf_counter()
        binding, image, options = self._slots[size]
        with self._lock:
            if _whole(images, size):
                host = images
            else:
                host = self._host[:size]
                fill(host, images)
            start = stage_clock.record("stack", start)
            image.update_inplace(host)
            start = stage_clock.record("upload", start)
            self.sessions[size].run_with_iobinding(binding, options)
            start = stage_clock.record("run", start)
            outputs = binding.copy_outputs_to_cpu()  # in the order bound
            stage_clock.record("download", start)
        return BackendOutputs.from_named(dict(zip(self.outputs, outputs, strict=True))).rows(0, n)
