"""The request pipeline every inference route shares: decode images off the event loop, queue
them in the micro-batcher and await their rows of the outputs under the request's deadline.

``/classify``, ``/embed`` and the Open Inference Protocol's ``infer`` differ only in how images
arrive and how answers are written; all of them go through :func:`decode_all` (encoded images)
and :func:`run_batched` (preprocessed ``(C, H, W)`` float32 arrays).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence

import numpy as np

from service.batching.batcher import NonFiniteOutputError, QueueFullError
from service.core.errors import BackendUnavailableError, ServiceError
from service.dataplane.state import ServiceState
from service.dataplane.upload import Upload
from service.imaging.images import ImageError, ImageTooLargeError
from service.models.registry import LoadedModel
from service.runtime.outputs import BackendOutputs
from service.telemetry import access

__all__ = ["decode_all", "run_batched"]

log = logging.getLogger("service")


def _decode_unless_abandoned(
    state: ServiceState,
    model: LoadedModel,
    upload: Upload,
    deadline: float,
    gone: threading.Event,
) -> np.ndarray | None:
    """In a decode thread: the image decoded, or ``None`` (counted as dropped) when its request
    no longer wants it: an image may wait for a thread longer than its request lives."""
    if gone.is_set() or time.perf_counter() > deadline:
        state.metrics.dropped.inc()
        return None
    return model.preprocess(upload.data, upload.filename)


def _deadline_exceeded(state: ServiceState) -> ServiceError:
    timeout = state.settings.request_timeout_s
    message = f"no answer within the deadline (at most {timeout:g} s)"
    return ServiceError(504, "deadline_exceeded", message)


def _retrieve(work: asyncio.Future[np.ndarray | None]) -> None:
    """Read a decode's outcome that nobody awaits any more (its request failed or left), so
    that asyncio does not log its exception as never retrieved."""
    if not work.cancelled():
        work.exception()


async def _decode(
    state: ServiceState,
    model: LoadedModel,
    upload: Upload,
    deadline: float,
    gone: threading.Event,
) -> np.ndarray:
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    work = loop.run_in_executor(
        state.decoder, _decode_unless_abandoned, state, model, upload, deadline, gone
    )
    work.add_done_callback(_retrieve)
    try:
        # shielded: a request that is cancelled (its client left) leaves its images queued for
        # the decode threads, which drop them (``gone``) and count them, instead of asyncio
        # cancelling them unseen
        image = await asyncio.shield(work)
    except ImageTooLargeError as error:
        raise ServiceError(413, "image_too_large", str(error)) from None
    except ImageError as error:
        raise ServiceError(400, "invalid_image", str(error)) from None
    if image is None:
        raise _deadline_exceeded(state)
    state.metrics.decode.observe(time.perf_counter() - start)
    return image


async def decode_all(
    state: ServiceState,
    model: LoadedModel,
    uploads: Sequence[Upload],
    deadline: float | None = None,
) -> list[np.ndarray]:
    """Each encoded image decoded and preprocessed for ``model`` to ``(C, H, W)`` float32, in
    a thread pool; 400 (undecodable) or 413 (over the pixel limit) naming the file.

    Admitted first (503 at once when ``max_inflight`` images are already being decoded), and
    under the request's ``deadline`` (a ``time.perf_counter()`` value; by default
    ``request_timeout_s`` from now): 504 once it passes. Once the request has failed or passed
    its deadline, its images still waiting for a decode thread are dropped, not decoded.

    The images are announced to the batcher while they decode, so that it waits for them; the
    caller submits them (:func:`run_batched`) with no ``await`` in between.
    """
    batcher = model.batcher
    if deadline is None:
        deadline = time.perf_counter() + state.settings.request_timeout_s
    with (
        state.spans.timed("decode", {"smso.images": len(uploads)}),
        _timed("decode_s", len(uploads)),
        state.admission.admit(len(uploads)),
    ):
        gone = threading.Event()  # the decode threads skip this request's images once set
        batcher.announce(len(uploads))
        tasks = [asyncio.ensure_future(_decode(state, model, u, deadline, gone)) for u in uploads]
        try:
            async with asyncio.timeout(max(deadline - time.perf_counter(), 0)):
                return list(await asyncio.gather(*tasks))
        except TimeoutError:
            raise _deadline_exceeded(state) from None
        finally:
            gone.set()
            for task in tasks:  # a failed image (400) leaves its siblings running otherwise
                task.cancel()
            batcher.withdraw(len(uploads))


@contextlib.contextmanager
def _timed(name: str, images: int) -> Iterator[None]:
    """The time inside, added to the current request's ``name`` timing for its access line
    (also when it fails), and its image count."""
    record = access.current()
    if record is None:  # not within a request (a test calling the pipeline directly)
        yield
        return
    record.images = images
    start = time.perf_counter()
    try:
        yield
    finally:
        record.add(name, time.perf_counter() - start)


#: Inputs whose values reach this many times the largest a preprocessed image holds are the
#: client's doing when the model's outputs for them are not finite (a client's own tensor:
#: decoded images never leave the preprocessed range).
OUT_OF_RANGE = 1000.0


def _blame_extreme_inputs(model: LoadedModel, images: Sequence[np.ndarray]) -> None:
    """400 ``input_out_of_range`` when the images hold values far outside what preprocessing
    gives (the outputs' NaN or infinity then comes from them, not from the model file)."""
    bound = model.card.preprocessing.largest_value
    largest = max((float(np.abs(image).max()) for image in images), default=0.0)
    if largest > OUT_OF_RANGE * bound:
        raise ServiceError(
            400,
            "input_out_of_range",
            f"the model's outputs are NaN or infinite for these inputs: their values reach "
            f"{largest:.3g}, while an image preprocessed as the model card says lies within "
            f"+-{bound:.3g}; send images preprocessed as the card says (or the encoded images)",
        )


async def run_batched(
    state: ServiceState,
    model: LoadedModel,
    images: Sequence[np.ndarray],
    deadline: float,
    route: str,
) -> BackendOutputs:
    """Each ``(C, H, W)`` image through ``model``'s micro-batcher; the outputs of all, row ``n``
    image ``n``'s: logits and embedding, and with a typicality reference the score and p-value.

    413 when there are more images than the queue can ever hold, 503 when it is full, 504 once
    ``deadline`` (a ``time.perf_counter()`` value) passes, 500 when the batch the image ran in
    failed or gave NaN or infinite outputs (the model's fault, not the client's).
    """
    record = access.current()
    if record is not None:  # its queue and inference times come from the batcher
        record.images = len(images)
    capacity = state.settings.queue_size
    if len(images) > capacity:  # never admitted, however long the client retries
        message = f"{len(images)} images; the queue holds at most {capacity}"
        raise ServiceError(413, "too_many_images", message)
    try:
        futures = model.batcher.submit_all(images)
    except QueueFullError:
        raise ServiceError(
            503,
            "overloaded",
            "the server is at capacity; retry shortly",
            headers={"Retry-After": "1"},
        ) from None
    try:
        async with asyncio.timeout(max(deadline - time.perf_counter(), 0)):
            rows = await asyncio.gather(*futures)
    except TimeoutError:
        for future in futures:
            future.cancel()
        if record is not None:  # its wait, or its inference, ends at the deadline
            record.cut(time.perf_counter())
        raise _deadline_exceeded(state) from None
    except BackendUnavailableError as error:
        log.error("inference failed: %s", error)
        raise ServiceError(
            503, "backend_unavailable", f"{error}; retry later", headers={"Retry-After": "5"}
        ) from None
    except NonFiniteOutputError:
        # JSON cannot carry them, and no class or embedding can be read from them
        answered = [f for f in futures if f.done() and not f.cancelled()]
        broken = sum(isinstance(f.exception(), NonFiniteOutputError) for f in answered)
        for future in futures:  # the request fails: its images still queued need not run
            future.cancel()
        _blame_extreme_inputs(model, images)
        log.error(
            "model %s version %s gave NaN or infinite outputs for %d of %d images answered",
            model.name,
            model.version,
            broken,
            len(answered),
        )
        raise ServiceError(
            500,
            "model_output_not_finite",
            "the model's outputs are NaN or infinite: the model file is at fault, not the image",
        ) from None
    except Exception as error:
        log.error("inference failed: %s", error)
        raise ServiceError(500, "inference_failed", f"inference failed: {error}") from None
    state.metrics.images.labels(route, model.name, model.version).inc(len(images))
    outputs = BackendOutputs.concatenate(rows)
    # scored where the model has a reference (service.models.scoring.scored), as is its drift
    if model.drift is not None and outputs.typicality is not None and outputs.p_value is not None:
        histogram = state.metrics.typicality.labels(model.name, model.version)
        for score in outputs.typicality.tolist():
            histogram.observe(score)
        model.drift.observe(outputs.p_value)
    return outputs
