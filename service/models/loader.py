"""Loading a model into a running server, and retiring one, without failing a request.

:func:`load_model` builds one :class:`~service.models.registry.LoadedModel` (onnxruntime session off
the event loop, preprocessor, micro-batcher), warms it up (each batch-size bucket once), loads
the gallery beside it (:mod:`service.models.galleries`) and only then makes it serve its name;
the version it replaces retires (:func:`retire`) once the requests holding it have been
answered. A model that cannot be loaded or run is marked unavailable with the reason, and
whatever served its name before keeps serving.

Loading and warm-up have a deadline (``load_timeout_s``): both run in daemon threads of their
own (:mod:`service.models.threads`), so that a session whose constructor never returns is given
up on and cannot hold the server's exit, and a warm-up run that never ends (an ONNX ``Loop`` of
2**62 iterations) is stopped (``RunOptions.terminate``, the backend's ``terminate``). The warm-up
also checks what the card says of the graph on what the graph answers
(:func:`service.runtime.graph.check_outputs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from pathlib import Path

from service.batching.batcher import MicroBatcher, RunFn
from service.core.card import ModelCard
from service.core.settings import Settings
from service.imaging.images import Preprocess, Preprocessor
from service.models.drift import DriftMonitor
from service.models.galleries import GallerySlot, gallery_place
from service.models.host import Host
from service.models.registry import LoadedModel, ModelStatus
from service.models.scoring import scored, typicality_reference
from service.models.threads import in_daemon_thread
from service.runtime.backend import Backend, BackendOptions, OnnxBackend, warm_up_inputs
from service.runtime.graph import check_outputs
from service.runtime.hosted_backend import HostedBackend, host_from_environment
from service.runtime.runner import buckets
from service.telemetry.batch_telemetry import BatchTelemetry

__all__ = [
    "STOPPING_S",
    "load_model",
    "retire",
    "unload_model",
]

log = logging.getLogger("service")

#: How long a terminated warm-up run is waited for (onnxruntime stops it at its next node).
STOPPING_S = 5.0


def _preprocessor(state: Host, card: ModelCard) -> Preprocess:
    """Pillow's preprocessing of the card, or with ``decode_device=cuda`` the GPU's for common
    JPEGs (:mod:`service.imaging.gpu_jpeg`; imported only then: it needs nvImageCodec)."""
    settings = state.settings
    pillow = Preprocessor(card.preprocessing, settings.max_pixels)
    if settings.decode_device == "cpu":
        return pillow
    from service.imaging.gpu_jpeg import GpuJpegPreprocessor

    decoded = state.metrics.decoded
    return GpuJpegPreprocessor(
        pillow, settings.decode_device, on_decoded=lambda where: decoded.labels(where).inc()
    )


async def load_model(
    state: Host,
    source: Path | None,
    name: str | None = None,
    version: str | None = None,
    backend: Backend | None = None,
) -> LoadedModel | None:
    """Load ``source`` (or take ``backend``, a test's fake), warm it up and serve it as
    ``name`` at ``version`` (by default the card's served name and version); ``None`` when it
    could not be loaded or run (its entry then says why)."""
    registry, settings = state.registry, state.settings
    if name is not None:
        registry.mark(name, version or "", ModelStatus.LOADING, source=source)
    batcher = None
    phase = "loading"
    deadline = asyncio.timeout(settings.load_timeout_s)
    try:
        async with deadline:
            if backend is None:
                if source is None:
                    raise ValueError("nothing to load: no model file and no backend")
                backend = await in_daemon_thread(
                    functools.partial(_backend, source, settings),
                    name=f"load {name or source.name}",
                    abandoned=close_backend,  # loaded after the deadline: let it go
                )
            card = backend.card
            name, version = name or card.name, version or card.model_version
            registry.mark(name, version, ModelStatus.LOADING, source=source)
            typicality = typicality_reference(backend, settings.typicality, name)
            run = scored(backend.run, typicality)
            telemetry = BatchTelemetry(
                metrics=state.metrics,
                spans=state.spans,
                model=name,
                version=version,
                total_depth=registry.queue_depth,
            )
            batcher = MicroBatcher(
                run,
                max_batch=settings.max_batch_size,
                max_wait_s=settings.max_wait_ms / 1e3,
                queue_size=settings.queue_size,
                wait_for_announced=True,
                patience=settings.batch_patience,
                in_flight=settings.batches_in_flight,
                observer=telemetry,
            )
            batcher.start()
            phase = "warming up"
            await _warm_up(backend, run, batcher, settings.max_batch_size, name)
            preprocess = await asyncio.to_thread(_preprocessor, state, card)  # GPU's: a probe
    except asyncio.CancelledError:
        await _discard(state, batcher, backend, name, version)
        raise
    except Exception as error:
        await _discard(state, batcher, backend, name, version)
        if isinstance(error, TimeoutError) and deadline.expired():
            reason = (
                f"{phase} took longer than the load deadline ({settings.load_timeout_s:g} s, "
                "SMSO_LOAD_TIMEOUT_S)" + ("; its runs were stopped" if phase != "loading" else "")
            )
        else:
            reason = " ".join(str(error).split()) or type(error).__name__
        failed = name or (source.parent.name if source is not None else "model")
        shown = _without_paths(reason, source)
        serving = registry.served(failed)
        registry.mark(failed, version or "", ModelStatus.UNAVAILABLE, shown, source)
        if serving is None:
            outcome = "is unavailable (503) until it is replaced"
        elif serving.version == version:  # the file was replaced under the same number
            outcome = f"version {version} as loaded before goes on serving"
        else:
            outcome = f"version {serving.version} goes on serving"
        log.error(
            "model %s version %s could not be loaded or warmed up, and %s: %s",
            failed,
            version or "?",
            outcome,
            reason,
        )
        log.debug("what failed", exc_info=True)
        return None
    drift = None
    if typicality is not None:
        drift = DriftMonitor(
            f"{name} ({version})",
            settings.drift_window,
            settings.drift_alarm_p,
            state.metrics.drift_reporter(name, version),
        )
    place = gallery_place(settings, source)
    gallery = GallerySlot(
        place,
        card=card,
        model=f"model {name} version {version}",
        report=state.metrics.gallery_reporter(name, version) if place is not None else None,
    )
    try:  # loaded before the model serves: its first request finds its gallery
        await gallery.refresh()
    except asyncio.CancelledError:
        await _discard(state, batcher, backend, name, version)
        raise
    model = LoadedModel(
        name=name,
        version=version,
        card=card,
        backend=backend,
        preprocess=preprocess,
        batcher=batcher,
        source=source,
        typicality=typicality,
        drift=drift,
        gallery=gallery,
    )
    previous = registry.serve(model)
    readiness, default = registry.readiness(), registry.default_name()
    if readiness == "ready":
        said = "/readyz answers 200"
    elif default is not None and default != name and registry.served(default) is None:
        said = f"not the default model ({default!r}): /readyz answers 200 once that one serves"
    else:
        said = f"/readyz says {readiness!r}"
    providers = ", ".join(getattr(backend, "providers", ["?"]))
    log.info("ready: %s (%s) on %s; %s", name, version, providers, said)
    if previous is not None:  # retired even if this load is cancelled meanwhile
        await asyncio.shield(retire(state, previous))
    return model


async def unload_model(state: Host, name: str) -> bool:
    """Stop serving ``name``: new requests get 404, those in flight are answered; whether it
    was known."""
    known = name in state.registry.entries
    model = state.registry.withdraw(name)
    if model is not None:
        log.info("unloading %s (%s)", model.name, model.version)
        await retire(state, model)
    return known or model is not None


async def retire(state: Host, model: LoadedModel) -> None:
    """Stop ``model``'s batcher once no request holds it (or after ``request_timeout_s``, the
    longest a request may take); every image already queued is answered first."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(state.settings.request_timeout_s):
            await model.users.idle.wait()
    await model.batcher.stop()
    close_backend(model.backend)
    serving = {(m.name, m.version) for m in state.registry.serving()}
    if (model.name, model.version) not in serving:  # a file replaced under the same number
        state.metrics.forget(model.name, model.version)  # keeps its successor's series


def _without_paths(reason: str, source: Path | None) -> str:
    """``reason`` as clients may read it (503 bodies, the repository index): the model file
    named by its place in the repository (``name/version/model.onnx``) or its file name, not
    by the server's absolute path (the log keeps the path)."""
    if source is None:
        return reason
    return reason.replace(str(source), "/".join(source.parts[-3:]))


def close_backend(backend: Backend) -> None:
    """Let go of what a backend holds beyond its session (a hosted backend's shared memory)."""
    close = getattr(backend, "close", None)
    if close is not None:
        close()


def terminate_backend(backend: Backend) -> None:
    """Stop the backend's runs in progress, and all later ones, where it can
    (:meth:`service.runtime.backend.OnnxBackend.terminate`; a test's fake may not)."""
    terminate = getattr(backend, "terminate", None)
    if terminate is not None:
        terminate()


def _backend(source: Path, settings: Settings) -> Backend:
    """The model file's backend: its own session, or in a worker started with a session host
    (``--shared-session``) the host's (:mod:`service.runtime.session_host`)."""
    host = host_from_environment()
    if host is not None and source == settings.model_path:
        # one slot: the batcher's inference thread runs one batch at a time
        return HostedBackend(source, *host, timeout_s=settings.request_timeout_s)
    return OnnxBackend(source, BackendOptions.from_settings(settings))


async def _discard(
    state: Host,
    batcher: MicroBatcher | None,
    backend: Backend | None,
    name: str | None,
    version: str | None,
) -> None:
    """Stop the runs, the batcher and the backend of a model that failed to load (either may
    not exist yet), and drop the metric series it started unless that version serves."""
    if backend is not None:
        terminate_backend(backend)  # a warm-up run still going: it ends now
    if batcher is not None:
        await batcher.stop()
    if backend is not None:
        close_backend(backend)
    serving = state.registry.served(name) if name is not None else None
    if name is not None and version and (serving is None or serving.version != version):
        state.metrics.forget(name, version)


async def _warm_up(
    backend: Backend, run: RunFn, batcher: MicroBatcher, max_batch_size: int, name: str
) -> None:
    """Run the backend's warm-up batches (by default each batch-size bucket: 1, 2, 4, ...,
    ``max_batch_size``) so that no request pays for a first call: through ``run`` in a daemon
    thread (:func:`in_daemon_thread`), each batch's logits and embedding checked against the
    card's shapes (:func:`check_outputs`); then, known to end, once more on the batcher's own
    inference thread, the one that will serve (onnxruntime's CUDA provider keeps its handles
    and captured CUDA graphs per thread). Cancelled (the deadline, a shutdown), the backend's
    runs are terminated."""
    sizes = getattr(backend, "warmup_batches", None) or buckets(max_batch_size)
    card = backend.card

    def warm_up() -> None:
        for images in warm_up_inputs(card.input, sizes):
            check_outputs(card, len(images), run(images))

    done = in_daemon_thread(warm_up, name=f"warm up {name}")
    try:
        await asyncio.shield(done)
        for images in warm_up_inputs(card.input, sizes):
            await batcher.run_direct(images)
    except asyncio.CancelledError:
        terminate_backend(backend)
        # the run stops at its next node (or Loop iteration): wait for it, so that no run is in
        # the session when it is let go of, or when the process exits
        await asyncio.wait([done], timeout=STOPPING_S)
        if done.done() and not done.cancelled():
            done.exception()  # retrieved: the terminated run's error is no news
        raise
