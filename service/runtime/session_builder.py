"""An ONNX file written by smso-export, made ready to run: :func:`build_session`, the one place
where a model's sessions and runner are put together, in this order:

1. the card, read without running anything, where the providers may run on a GPU: TensorRT's
   optimisation profile needs the input's size (:class:`service.runtime.providers.Accelerator`);
2. a session on the providers the options name, and the providers it really runs on
   (:func:`service.runtime.providers.choose_providers`);
3. the card from that session's metadata, checked against its graph
   (:func:`~service.runtime.graph.check_graph`), and the outputs the runner answers;
4. the runner (:mod:`service.runtime.runner`): on the CPU the session itself, every batch as it
   comes; on TensorRT the session, batches padded to buckets; on CUDA a session per bucket with
   every shape fixed (the first session's memory then goes), run plainly or through IO binding
   and CUDA graphs where asked.

What it gives (:class:`ReadySession`) is immutable: the backend only runs it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnxruntime as ort

from service.core.card import CardError, ModelCard, parse_card
from service.core.settings import Settings
from service.runtime.graph import OUTPUTS, check_graph
from service.runtime.providers import (
    ACCELERATED,
    CPU,
    CUDA,
    Accelerator,
    choose_providers,
    runs_on_gpu,
    shaped_session,
)
from service.runtime.runner import BoundRunner, PlainRunner, buckets

__all__ = ["BackendOptions", "ReadySession", "build_session", "read_card"]

#: The outputs that give a typicality score, preferred first: the file's own score
#: (``export.typicality_graph``), else the backbone's features to compute it from in numpy.
SCORING = ("typicality", "features")


@dataclass(frozen=True, kw_only=True)
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
        """What :func:`build_session` needs of the service's settings."""
        return cls(
            providers=settings.providers,
            threads=settings.session_threads,
            spinning=settings.intra_op_spinning,
            max_batch=settings.max_batch_size,
            engine_cache_dir=settings.engine_cache,
            trt_fp16=settings.trt_fp16,
            io_binding=settings.io_binding,
            cuda_graphs=settings.cuda_graphs,
        )


@dataclass(frozen=True, kw_only=True)
class ReadySession:
    """A model file ready to run: its card, where it runs and the runner that runs it."""

    card: ModelCard
    card_dict: dict[str, Any]  # the card as the file holds it (its typicality section, ...)
    providers: list[str]  # the execution providers it runs on, the leading one first
    #: what the runner answers, in order: logits and embedding, then the typicality score
    #: where the file computes it, else the backbone's features where it has them
    outputs: list[str]
    runner: PlainRunner | BoundRunner
    #: the batch sizes warm-up runs, in order (each bucket; twice where a CUDA graph is captured)
    warmup_batches: list[int]

    @property
    def session(self) -> ort.InferenceSession:
        """The session kept for what does not depend on the batch's shape (the metadata)."""
        return self.runner.session

    @property
    def buckets(self) -> list[int] | None:
        """The batch sizes the runner pads to; None: every size as it comes (the CPU)."""
        return self.runner.sizes

    @property
    def mode(self) -> str:
        """How it runs: ``plain``, ``buckets``, ``io-binding`` or ``cuda-graphs``."""
        return self.runner.mode


def _cpu_session(path: Path) -> ort.InferenceSession:
    """A session that only reads the file (no graph optimisation): for its metadata."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=[CPU])


def _not_loadable(path: str | Path, error: Exception) -> ValueError:
    message = str(error).splitlines()[0][:300]
    return ValueError(f"{path} is not a loadable ONNX model: {message}")


def read_card(path: str | Path) -> ModelCard:
    """The model card of an ONNX file, without setting up a session to run it (quick, and no
    GPU context: what a parent process checks before its workers load the model)."""
    try:
        metadata = _cpu_session(Path(path)).get_modelmeta().custom_metadata_map
    except Exception as error:  # onnxruntime's own types: Fail, InvalidProtobuf, ...
        raise _not_loadable(path, error) from None
    return _card_of(path, metadata)[0]


def _card_of(path: str | Path, metadata: dict[str, str]) -> tuple[ModelCard, dict[str, Any]]:
    """The card in ``metadata``; :class:`CardError` naming the file when it has none or a bad
    one."""
    try:
        return parse_card(metadata)
    except CardError as error:
        raise CardError(f"{path}: {error}") from None


def build_session(path: str | Path, options: BackendOptions) -> ReadySession:
    """``path`` made ready to run with ``options``: the steps of this module's docstring.
    Raises ValueError (a file onnxruntime cannot load, a provider that cannot start) or
    :class:`CardError` (no card, a bad one, or one its graph contradicts), naming the file."""
    path = Path(path)
    accelerator = _accelerator(path, options)
    session, providers = _first_session(path, options, accelerator)
    card, card_dict = _card_of(path, session.get_modelmeta().custom_metadata_map)
    outputs = _checked_outputs(path, card, session)
    sizes = buckets(options.max_batch)
    runner: PlainRunner | BoundRunner
    if providers[0] not in ACCELERATED:  # the CPU: every batch as it comes
        runner = PlainRunner(session, outputs=outputs)
    elif providers[0] != CUDA:  # TensorRT: its profile covers every bucket in one session
        runner = PlainRunner(session, sizes=sizes, outputs=outputs)
    else:  # CUDA: a session per bucket, the first one's memory let go of
        sessions = _bucket_sessions(
            path,
            options=options,
            providers=providers,
            accelerator=accelerator,
            card=card,
            probe=session,
        )
        runner = _cuda_runner(sessions, options=options, card=card, outputs=outputs)
    # a CUDA graph is captured on a bucket's second run, after one ordinary run
    runs = 2 if isinstance(runner, BoundRunner) and runner.graphs else 1
    return ReadySession(
        card=card,
        card_dict=card_dict,
        providers=providers,
        outputs=outputs,
        runner=runner,
        warmup_batches=[size for size in sizes for _ in range(runs)],
    )


def _first_session(
    path: Path, options: BackendOptions, accelerator: Accelerator | None
) -> tuple[ort.InferenceSession, list[str]]:
    """The session that chooses the providers, and the providers it really runs on. Its
    accelerator captures no CUDA graphs: the per-bucket sessions do, whose shapes are fixed."""
    probe = None if accelerator is None else dataclasses.replace(accelerator, cuda_graphs=False)
    try:
        return choose_providers(
            options.providers,
            path,
            threads=options.threads,
            spinning=options.spinning,
            accelerator=probe,
        )
    except ValueError:
        raise
    except Exception as error:  # onnxruntime's own types: Fail, InvalidProtobuf, ...
        raise _not_loadable(path, error) from None


def _accelerator(path: Path, options: BackendOptions) -> Accelerator | None:
    """How the GPU providers are configured for the file, where the options may run on one
    (TensorRT's profile needs the input's size: the card is read first); None on the CPU."""
    if not runs_on_gpu(options.providers):
        return None
    spec = read_card(path).input
    return Accelerator(
        input_shape=(spec.channels, spec.height, spec.width),
        max_batch=options.max_batch,
        engine_cache_dir=options.engine_cache_dir,
        trt_fp16=options.trt_fp16,
        cuda_graphs=options.cuda_graphs,
    )


def _checked_outputs(path: Path, card: ModelCard, session: ort.InferenceSession) -> list[str]:
    """The outputs the runner answers (:attr:`ReadySession.outputs`), once the card is checked
    against the graph; :class:`CardError` or ValueError naming the file otherwise."""
    try:  # what the card says of the graph, where the graph says it as numbers
        check_graph(card, session.get_inputs(), session.get_outputs())
    except CardError as error:
        raise CardError(f"{path}: {error}") from None
    names = [o.name for o in session.get_outputs()]
    if not set(OUTPUTS) <= set(names):
        raise ValueError(f"{path} has outputs {names}; expected logits and embedding")
    scoring = next((name for name in SCORING if name in names), None)
    return [*OUTPUTS, *([scoring] if scoring else [])]


def _bucket_sessions(
    path: Path,
    *,
    options: BackendOptions,
    providers: list[str],
    accelerator: Accelerator | None,
    card: ModelCard,
    probe: ort.InferenceSession,
) -> dict[int, ort.InferenceSession]:
    """A CUDA session per bucket, its input's symbolic dimensions (named as in ``probe``'s
    input) fixed to the bucket's size and the card's channels, height and width."""
    spec = card.input
    fixed = (None, spec.channels, spec.height, spec.width)
    dims = probe.get_inputs()[0].shape  # e.g. ["batch", 1, "height", "width"]
    sessions = {}
    for size in buckets(options.max_batch):
        free = {
            name: value or size
            for name, value in zip(dims, fixed, strict=True)
            if isinstance(name, str)
        }
        try:
            sessions[size] = shaped_session(
                path,
                providers,
                threads=options.threads,
                spinning=options.spinning,
                accelerator=accelerator,
                free_dims=free,
            )
        except Exception as error:  # onnxruntime's own types
            message = str(error).splitlines()[0][:300]
            if "graph capture" in message:  # enable_cuda_graph with nodes on the CPU
                raise ValueError(
                    f"{path} cannot run in CUDA graphs: onnxruntime places some of its "
                    "nodes on the CPU even with every shape fixed (operators its CUDA "
                    "provider lacks); turn cuda_graphs off"
                ) from None
            raise ValueError(f"{path}: no CUDA session for batches of {size}: {message}") from None
    return sessions


def _cuda_runner(
    sessions: dict[int, ort.InferenceSession],
    *,
    options: BackendOptions,
    card: ModelCard,
    outputs: list[str],
) -> PlainRunner | BoundRunner:
    """The runner of the per-bucket sessions: plain, or through IO binding (and CUDA graphs)
    where asked, its device buffers shaped by the card (logits, embedding) and the graph (the
    outputs after them)."""
    sizes = sorted(sessions)
    if not (options.io_binding or options.cuda_graphs):
        return PlainRunner(sessions, sizes=sizes, outputs=outputs)
    spec, largest = card.input, sessions[sizes[-1]]
    shapes = {
        "logits": (len(card.classes),),
        "embedding": (card.model.embedding_dim,),
        **{name: _tail(largest, name) for name in outputs[len(OUTPUTS) :]},
    }
    return BoundRunner(
        sessions,
        input_shape=(spec.channels, spec.height, spec.width),
        outputs=shapes,
        sizes=sizes,
        graphs=options.cuda_graphs,
    )


def _tail(session: ort.InferenceSession, name: str) -> tuple[int, ...]:
    """The shape of output ``name`` after its batch dimension (fixed in every exported file):
    ``(128,)`` for features, ``()`` for the typicality score."""
    shape = next(o.shape for o in session.get_outputs() if o.name == name)
    return tuple(int(d) for d in shape[1:])
