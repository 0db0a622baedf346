"""The micro-batcher: images from many requests gathered into one onnxruntime call.

A bounded ``asyncio.Queue`` of jobs (one image each, with a future); one consumer task takes the
first job, then more until ``max_batch`` jobs or ``max_wait`` seconds have passed, hands their
images to the backend in a worker thread (never on the event loop) and resolves each job's future
with its row of the outputs.

Callers may :meth:`~MicroBatcher.announce` images before they are ready (while they are being
decoded) and :meth:`~MicroBatcher.withdraw` them once submitted or failed. With
``wait_for_announced``, the consumer waits for more images only while announced ones are on their
way: a lone request is not held for ``max_wait``, and a burst is still gathered. For announced
images the wait may stretch to a quarter (``patience``) of the last batch's inference time: with a
model that takes seconds per batch, running the one image at hand and leaving the dozen being
decoded for the next batch costs far more than waiting for them. A batch's exception is delivered to
every job in it. No polling: the consumer sleeps on the queue. A full queue raises
:class:`QueueFullError` at once (the app answers 503 with ``Retry-After``); jobs whose caller has
gone (deadline passed) are dropped before they reach the model. An image whose outputs hold NaN or
infinite values gets :class:`NonFiniteOutputError` instead of them (checked once per batch in the
inference thread, not per image on the event loop). What it does is told to its observer
(:mod:`service.batching.observer`): the queue's depth, each batch run and answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import ParamSpec

import numpy as np
from opentelemetry import trace
from opentelemetry.trace import SpanContext

from service.batching.observer import BatchObserver, NoBatchObserver
from service.runtime.outputs import BackendOutputs
from service.runtime.runner import Batch
from service.telemetry import access, stage_clock
from service.telemetry.metrics import BatchStats

__all__ = [
    "PATIENCE",
    "BatchStats",
    "MicroBatcher",
    "NonFiniteOutputError",
    "QueueFullError",
    "RunFn",
    "finite_rows",
]

log = logging.getLogger("service.batcher")  # stable for logging configs, wherever the module lives

#: While announced images are on their way, wait up to this fraction of the last batch's
#: inference time for them (at least ``max_wait``).
PATIENCE = 0.25

#: A batch's N images (``service.runtime.runner.Batch``: the jobs' ``(C, H, W)`` arrays, or one
#: ``(N, C, H, W)`` array) -> their N rows of each output: logits and embedding, and the
#: typicality score and p-value where the model has a reference (``service.models.scoring.scored``).
RunFn = Callable[[Batch], BackendOutputs]

_Event = ParamSpec("_Event")


class QueueFullError(RuntimeError):
    """More images are waiting than the queue holds."""


class NonFiniteOutputError(ArithmeticError):
    """The model gave NaN or infinite outputs for this image (the model's fault, not the
    image's: JSON cannot carry them, and no class or embedding can be read from them)."""


def finite_rows(outputs: BackendOutputs) -> np.ndarray:
    """``(N,)`` bool: row ``n`` of every output (each ``(N, ...)``) is finite throughout."""
    rows = len(outputs)
    finite = [np.isfinite(o.reshape(rows, -1)).all(axis=1) for o in outputs.named().values()]
    return np.logical_and.reduce(finite)


@dataclass
class _Job:
    image: np.ndarray  # (C, H, W) float32
    future: asyncio.Future[BackendOutputs]  # the image's row of each output
    enqueued: float = field(default_factory=time.perf_counter)
    #: the submitting request's span (OpenTelemetry; invalid when nothing is traced) and when
    #: the job was queued, in the clock spans use
    span: SpanContext = field(default_factory=lambda: trace.get_current_span().get_span_context())
    enqueued_ns: int = field(default_factory=time.time_ns)
    #: the submitting request's access-line record (None outside a request), told of its batch
    record: access.RequestRecord | None = field(default_factory=access.current)


class MicroBatcher:
    """Gathers single images into batches of at most ``max_batch``, waiting at most
    ``max_wait_s``, and runs them through ``run``; ``queue_size`` images wait at most. The rest
    is described in the module's docstring; ``observer`` is told what happens."""

    def __init__(
        self,
        run: RunFn,
        *,
        max_batch: int,
        max_wait_s: float,
        queue_size: int,
        wait_for_announced: bool = False,
        patience: float = PATIENCE,
        in_flight: int = 1,
        observer: BatchObserver | None = None,
    ) -> None:
        if in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, not {in_flight}")
        self._run = run
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.wait_for_announced = wait_for_announced
        self.patience = patience
        self._queue: asyncio.Queue[_Job] = asyncio.Queue(maxsize=queue_size)
        self._announced = 0  # images callers said are on their way, not yet submitted
        self._last_inference_s = 0.0
        self._arrived = asyncio.Event()  # set on every submit and when nothing is on its way
        self._observer = observer or NoBatchObserver()
        #: batches dispatched before the last one's results are back: with 2, the next batch
        #: waits in the inference thread's queue and starts the moment the thread is free,
        #: not when the event loop has taken the last one's results
        self.in_flight = in_flight
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")
        self._task: asyncio.Task[None] | None = None

    @property
    def depth(self) -> int:
        """Images waiting for inference."""
        return self._queue.qsize()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._consume(), name="batcher")

    async def stop(self) -> None:
        """Finish every queued job, then stop the consumer and the worker thread."""
        if self._task is not None:
            await self._queue.join()
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._executor.shutdown(wait=True)

    def announce(self, count: int) -> None:
        """``count`` images will be submitted soon (they are being decoded)."""
        self._announced += count

    def withdraw(self, count: int) -> None:
        """``count`` announced images are no longer on their way (submitted, or failed)."""
        self._announced = max(self._announced - count, 0)
        if self._announced == 0:
            self._arrived.set()

    def submit(self, image: np.ndarray) -> asyncio.Future[BackendOutputs]:
        """Queue one image; the future resolves to its row of each output (one row each:
        logits ``(1, K)``, embedding ``(1, p)``, and what else the run function answers)."""
        future: asyncio.Future[BackendOutputs] = asyncio.get_running_loop().create_future()
        job = _Job(image, future)
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            raise QueueFullError(f"{self._queue.maxsize} images are already waiting") from None
        if job.record is not None:
            job.record.note_queued(job.enqueued)
        self._arrived.set()
        return future

    def submit_all(self, images: Sequence[np.ndarray]) -> list[asyncio.Future[BackendOutputs]]:
        """Queue every image of a request, or none: :class:`QueueFullError` (the images already
        queued cancelled) when they do not all fit. The queue's new depth is reported once."""
        futures = []
        try:
            for image in images:
                futures.append(self.submit(image))
        except QueueFullError:
            for future in futures:
                future.cancel()
            raise
        self._report_depth()
        return futures

    def _report_depth(self) -> None:
        """Tell the observer the images waiting."""
        self._tell(self._observer.queue_changed, self._queue.qsize())

    @staticmethod
    def _tell(event: Callable[_Event, None], *args: _Event.args, **kwargs: _Event.kwargs) -> None:
        """Call the observer's ``event``; one that raises is logged, never raised: the consumer
        must go on (every later job would hang)."""
        try:
            event(*args, **kwargs)
        except Exception:
            log.exception("the batch observer's %s failed", getattr(event, "__name__", event))

    async def run_direct(self, images: Batch) -> BackendOutputs:
        """Run a whole batch in the worker thread, bypassing the queue (warm-up)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, images)

    async def _take_batch(self) -> list[_Job]:
        """The first job, then whatever arrives until the batch is full or ``max_wait`` has
        passed; with ``wait_for_announced``, until no announced image is still on its way or the
        patience (``max_wait``, or ``patience`` times the last batch's inference time) runs out."""
        jobs = [await self._queue.get()]
        wait = self.max_wait_s
        if self.wait_for_announced:
            wait = max(wait, self.patience * self._last_inference_s)
        deadline = time.perf_counter() + wait
        while True:
            while len(jobs) < self.max_batch and not self._queue.empty():
                jobs.append(self._queue.get_nowait())
            if len(jobs) >= self.max_batch:
                return jobs
            if self.wait_for_announced and self._announced == 0:
                return jobs  # nothing else is on its way: waiting would only add latency
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return jobs
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()

    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.in_flight)
        running: set[asyncio.Task[None]] = set()
        try:
            while True:
                await slots.acquire()  # a batch is taken only once one may be dispatched
                jobs = await self._take_batch()
                self._report_depth()  # also when all its callers have gone: nothing runs
                task = loop.create_task(self._dispatch(loop, jobs, slots))
                running.add(task)
                task.add_done_callback(running.discard)
        finally:  # stop() has drained the queue; cancelled otherwise: let the batches finish
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    async def _dispatch(
        self, loop: asyncio.AbstractEventLoop, jobs: list[_Job], slots: asyncio.Semaphore
    ) -> None:
        try:
            live = [job for job in jobs if not job.future.done()]  # callers that gave up: skip
            if live:
                await self._process(loop, live)
        finally:
            slots.release()
            for _ in jobs:
                self._queue.task_done()

    def _run_batch(
        self, images: list[np.ndarray]
    ) -> tuple[list[BackendOutputs | None], float, dict[str, float]]:
        """Run the batch's images in the worker thread; the run function copies them where it
        needs them (a batch of 64 ImageNet-sized images is 38 MB, which would hold up the event
        loop for milliseconds). Returns each image's row of the outputs, ``None`` where a row is
        not finite (:func:`finite_rows`: one vectorised check per batch), and the thread's
        seconds on the run, in all and by stage. Rows and check cost the event loop nothing."""
        stage_clock.take()  # whatever an earlier call (warm-up) left on this thread's clock
        start = time.perf_counter()
        outputs = self._run(images)
        seconds = time.perf_counter() - start
        if len(outputs) != len(images):
            raise ValueError(f"{len(outputs)} rows of outputs for {len(images)} images")
        finite = finite_rows(outputs).tolist()
        rows = [row if ok else None for row, ok in zip(outputs.split(), finite, strict=True)]
        return rows, seconds, stage_clock.take()

    async def _process(self, loop: asyncio.AbstractEventLoop, jobs: list[_Job]) -> None:
        start, start_ns = time.perf_counter(), time.time_ns()
        waits = [start - job.enqueued for job in jobs]
        records = [job.record for job in jobs if job.record is not None]  # their access lines
        for record in records:
            record.note_started(start)
        try:
            images = [job.image for job in jobs]
            rows, inference, stages = await loop.run_in_executor(
                self._executor, self._run_batch, images
            )
        except Exception as error:  # delivered to every caller of the batch
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(error)
            return
        finally:  # done or failed, the batch ended for its requests' access lines
            end = time.perf_counter()
            for record in records:
                record.note_ended(end)
        round_trip = end - start
        self._last_inference_s = inference
        self._tell(self._observer.batch_ran, jobs, start_ns, time.time_ns())
        for job, row in zip(jobs, rows, strict=True):
            if job.future.done():
                continue
            if row is None:
                job.future.set_exception(NonFiniteOutputError("NaN or infinite outputs"))
            else:
                job.future.set_result(row)
        stats = BatchStats(
            size=len(jobs),
            queue_wait_s=waits,
            inference_s=inference,
            round_trip_s=round_trip,
            stages=stages,
        )
        self._tell(self._observer.batch_answered, stats)
