"""The inference backend: a small interface, and its onnxruntime implementation.

The app talks to a :class:`Backend` only, so tests can put a fake, slow or failing one in its
place. :class:`OnnxBackend` loads a file written by smso-export, reads its model card, starts a
session on the providers :func:`service.runtime.providers.choose_providers` picks, and runs batches
through a :mod:`service.runtime.runner` (padded to batch-size buckets on a GPU, through IO binding
and CUDA graphs where asked). On CUDA every bucket gets a session of its own with all shapes fixed
(see :mod:`service.runtime.runner` for why); the session that chose the providers is kept for the
largest bucket's shape-independent uses (metadata) only until those are built.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from service.core.card import CardError, InputSpec, ModelCard, parse_card
from service.core.settings import Settings
from service.runtime.graph import check_graph
from service.runtime.providers import (
    ACCELERATED,
    CPU,
    CUDA,
    Accelerator,
    choose_providers,
    runs_on_gpu,
    shaped_session,
)
from service.runtime.runner import Batch, BoundRunner, PlainRunner, buckets

__all__ = [
    "Backend",
    "BackendOptions",
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

    def run(self, images: Batch) -> tuple[np.ndarray, ...]:
        """N images ``(C, H, W)`` float32 (:data:`service.runtime.runner.Batch`) -> ``(logits (N,
        K), embedding (N, p)[, typicality (N,) or features (N, C_b)])``
        (:data:`service.runtime.runner. Runner`); thread-safe."""
        ...


@dataclass(frozen=True)
class BackendOptions:
    """How the session is set up and run (the service's settings of the same names)."""

    providers: str = "auto"  # "auto" or a comma-separated list of execution providers
    threads: int = 0  # onnxruntime's intra-op threads; 0: its default
    spinning: bool = False  # let those threads busy-wait between operators
    max_batch: int = 16  # largest batch the batcher forms (buckets, TensorRT's profile)
    engine_cache_dir: Path | None = None  # TensorRT engines and timing cache
    trt_fp16: bool = False  # TensorRT may choose float16 kernels
    io_binding: bool = False  # CUDA: device buffers per bucket, reused by every call
    cuda_graphs: bool = False  # CUDA: one CUDA graph per bucket (implies io_binding)

    @classmethod
    def from_settings(cls, settings: Settings) -> BackendOptions:
        """What :class:`OnnxBackend` needs of the service's settings."""
        return cls(
            settings.providers,
            settings.intra_op_threads,
            settings.intra_op_spinning,
            settings.max_batch_size,
            settings.engine_cache,
            settings.trt_fp16,
            settings.io_binding,
            settings.cuda_graphs,
        )


def _cpu_session(path: Path) -> ort.InferenceSession:
    """A session that only reads the file (no graph optimisation): for its metadata."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=[CPU])


def read_card(path: str | Path) -> ModelCard:
    """The model card of an ONNX file, without setting up a session to run it (quick, and no
    GPU context: what a parent process checks before its workers load the model)."""
    try:
        metadata = _cpu_session(Path(path)).get_modelmeta().custom_metadata_map
    except Exception as error:  # onnxruntime's own types: Fail, InvalidProtobuf, ...
        message = str(error).splitlines()[0][:300]
        raise ValueError(f"{path} is not a loadable ONNX model: {message}") from None
    return _card_of(path, metadata)[0]


def _card_of(path: str | Path, metadata: dict[str, str]) -> tuple[ModelCard, dict[str, Any]]:
    """The card in ``metadata``; :class:`CardError` naming the file when it has none or a bad
    one."""
    try:
        return parse_card(metadata)
    except CardError as error:
        raise CardError(f"{path}: {error}") from None


def warm_up_inputs(spec: InputSpec, sizes: Sequence[int]) -> Iterator[np.ndarray]:
    """What warm-up runs: one batch ``(size, C, H, W)`` float32 of standard normal values
    (seed 0) per size in ``sizes``, for the input ``spec``."""
    rng = np.random.default_rng(0)
    for size in sizes:
        yield rng.standard_normal((size, spec.channels, spec.height, spec.width), np.float32)


class OnnxBackend:
    """An ONNX file written by smso-export, run by onnxruntime."""

    def __init__(self, path: str | Path, options: BackendOptions | None = None) -> None:
        path = Path(path)
        options = options or BackendOptions()
        try:
            self._accelerator = None
            probe = None
            if runs_on_gpu(options.providers):  # TensorRT's profile needs the input size
                spec = read_card(path).input
                self._accelerator = Accelerator(
                    (spec.channels, spec.height, spec.width),
                    options.max_batch,
                    options.engine_cache_dir,
                    options.trt_fp16,
                    options.cuda_graphs,
                )
                # CUDA graphs are captured by the per-bucket sessions, whose shapes are fixed
                probe = dataclasses.replace(self._accelerator, cuda_graphs=False)
            self.session, self.providers = choose_providers(
                options.providers, path, options.threads, options.spinning, probe
            )
        except ValueError:
            raise
        except Exception as error:  # onnxruntime's own types: Fail, InvalidProtobuf, ...
            message = str(error).splitlines()[0][:300]
            raise ValueError(f"{path} is not a loadable ONNX model: {message}") from None
        metadata = self.session.get_modelmeta().custom_metadata_map
        self.card, self.card_dict = _card_of(path, metadata)
        try:  # what the card says of the graph, where the graph says it as numbers
            check_graph(self.card, self.session.get_inputs(), self.session.get_outputs())
        except CardError as error:
            raise CardError(f"{path}: {error}") from None
        names = [o.name for o in self.session.get_outputs()]
        if not {"logits", "embedding"} <= set(names):
            raise ValueError(f"{path} has outputs {names}; expected logits and embedding")
        #: what run() returns, in order: logits and embedding, then the typicality score where
        #: the file computes it (``export.typicality_graph``), else the backbone's averaged
        #: features where it has them (for the score in numpy: ``modelcard.typicality``)
        scoring = next((name for name in ("typicality", "features") if name in names), None)
        self.outputs = ["logits", "embedding", *([scoring] if scoring else [])]
        self.warmup_batches, self._runner = self._runner_for(path, options)
        log.info("loaded %s on %s (%s)", path, ", ".join(self.providers), self.mode)

    def _bucket_sessions(
        self, path: Path, options: BackendOptions, sizes: list[int]
    ) -> dict[int, ort.InferenceSession]:
        """A CUDA session per bucket, its input's symbolic dimensions fixed to the bucket's
        size and the card's image size."""
        spec = self.card.input
        fixed = (None, spec.channels, spec.height, spec.width)
        dims = self.session.get_inputs()[0].shape  # e.g. ["batch", 1, "height", "width"]
        sessions = {}
        for size in sizes:
            free = {
                name: value or size
                for name, value in zip(dims, fixed, strict=True)
                if isinstance(name, str)
            }
            try:
                sessions[size] = shaped_session(
                    path,
                    self.providers,
                    options.threads,
                    options.spinning,
                    self._accelerator,
                    free,
                )
            except Exception as error:  # onnxruntime's own types
                message = str(error).splitlines()[0][:300]
                if "graph capture" in message:  # enable_cuda_graph with nodes on the CPU
                    raise ValueError(
                        f"{path} cannot run in CUDA graphs: onnxruntime places some of its "
                        "nodes on the CPU even with every shape fixed (operators its CUDA "
                        "provider lacks); turn cuda_graphs off"
                    ) from None
                raise ValueError(
                    f"{path}: no CUDA session for batches of {size}: {message}"
                ) from None
        return sessions

    def _runner_for(
        self, path: Path, options: BackendOptions
    ) -> tuple[list[int], PlainRunner | BoundRunner]:
        """Warm-up batches and the runner: buckets padded on an accelerator, exact on the CPU."""
        sizes = buckets(options.max_batch)
        first = self.providers[0]
        #: the batch sizes the runner pads to (None: every size as it comes, on the CPU)
        self.buckets: list[int] | None = sizes
        if first not in ACCELERATED:
            self.mode = "plain"
            self.buckets = None
            return sizes, PlainRunner(self.session, outputs=self.outputs)
        sessions: ort.InferenceSession | dict[int, ort.InferenceSession] = self.session
        if first == CUDA:
            sessions = self._bucket_sessions(path, options, sizes)
            self.session = sessions[sizes[-1]]  # the probe's memory goes
        if first == CUDA and (options.io_binding or options.cuda_graphs):
            spec = self.card.input
            extra = [(name, self._tail(name)) for name in self.outputs[2:]]
            runner = BoundRunner(
                sessions,
                (spec.channels, spec.height, spec.width),
                len(self.card.classes),
                self.card.model.embedding_dim,
                sizes,
                graphs=options.cuda_graphs,
                extra=extra,
            )
            self.mode = "cuda-graphs" if options.cuda_graphs else "io-binding"
            # a CUDA graph is captured on a bucket's second run, after one ordinary run
            return [s for s in sizes for _ in range(2 if options.cuda_graphs else 1)], runner
        self.mode = "buckets"
        return sizes, PlainRunner(sessions, sizes, outputs=self.outputs)

    def _tail(self, name: str) -> tuple[int, ...]:
        """The shape of output ``name`` after its batch dimension (fixed in every exported
        file): ``(128,)`` for features, ``()`` for the typicality score."""
        shape = next(o.shape for o in self.session.get_outputs() if o.name == name)
        return tuple(int(d) for d in shape[1:])

    def run(self, images: Batch) -> tuple[np.ndarray, ...]:
        """``(logits, embedding)``, then the typicality score or the features (``outputs``)."""
        return self._runner(images)

    def terminate(self) -> None:
        """Stop the onnxruntime calls running now, from any thread (each raises), and every
        later one: for a model given up on (its warm-up past the load deadline)."""
        self._runner.terminate()
