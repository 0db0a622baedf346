"""One ``smso-embed`` job on Ray Data: the images not yet in OUT, decoded, embedded, written.

The pipeline (:func:`run_job`)::

    from_arrow(paths, a block per decode_batch images)       the images still to do
      .map_batches(decode, num_cpus=decode_cpus)             tasks: read + the service's decoding
      .map_batches(Embedder, concurrency=actors,             actors: one onnxruntime session each
                   num_cpus=actor_cpus, num_gpus=...)
      .write_datasink(PartsSink)                             parts renamed into place whole

Ray's CPU accounting is logical: an actor holds ``actor_cpus`` of the node's CPUs for its whole
life, and a task runs only where its ``num_cpus`` are free. Actors that together hold every
CPU leave none for the decode tasks that feed them, and the job waits forever; the defaults
(:func:`default_resources`) leave at least one CPU, or half of a 2-CPU machine, to the tasks,
while onnxruntime's threads use every core all the same.

:func:`connect` starts a local Ray for the job (no dashboard, no usage statistics, warnings
only) or joins a cluster (``--address`` or ``RAY_ADDRESS``); a Ray already started in this
process (a test's) is used as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import ray
import ray.data

from batch.embedder import DecodeOptions, Embedder, EmbedOptions, decode
from batch.inputs import Location
from batch.model import ModelFile
from batch.outputs import PartsSink
from batch.progress import Progress
from service.runtime.providers import quiet_native_output

__all__ = [
    "JobOptions",
    "JobResult",
    "ResourceError",
    "Resources",
    "check_resources",
    "connect",
    "default_resources",
    "run_job",
]


@dataclass(frozen=True)
class Resources:
    """How the job spreads over Ray's CPUs and GPUs."""

    actors: int  # inference actors (onnxruntime sessions)
    actor_cpus: float  # Ray CPUs each actor holds
    actor_gpus: float  # Ray GPUs each actor holds (0: the CPU provider)
    threads: int  # onnxruntime intra-op threads per actor (0: its default, every core)
    decode_cpus: float  # Ray CPUs each decode task asks for
    write_cpus: float  # Ray CPUs each write task asks for
    decode_in_actors: bool = False  # each actor decodes its own batches: no decode tasks


def default_resources(cpus: float, gpus: float, actors: int | None = None) -> Resources:
    """Defaults for a cluster of ``cpus`` CPUs and ``gpus`` GPUs (and ``actors`` actors, where
    given: the CPUs each holds follow).

    With GPUs: one actor per GPU. On CPUs alone: one actor per 4 CPUs, its session's threads on
    4 cores (on fewer than 8 CPUs one actor, its threads on every core). Either way the actors
    together hold at most all CPUs but one (each at most one; on one CPU, half of it), and the
    decode tasks ask for half a CPU each: on a 2-CPU machine one actor holding one CPU and two
    decode tasks at once, which keeps up with inference for the shipped model.
    """
    actors = actors or (int(gpus) if gpus >= 1 else max(1, int(cpus) // 4))
    threads = 0 if gpus >= 1 or actors == 1 else max(1, min(4, int(cpus) // actors))
    actor_cpus = min(1.0, max(cpus - 1, 0.5) / actors)
    return Resources(actors, actor_cpus, 1.0 if gpus >= 1 else 0.0, threads, 0.5, 0.25)


class ResourceError(ValueError):
    """The actors would hold the CPUs the job's tasks need: it would wait forever."""


def check_resources(resources: Resources, cpus: float) -> None:
    """:class:`ResourceError` where, on a cluster of ``cpus`` CPUs, the actors leave no room for
    a decode task (or, decoding in the actors, a write task) next to them."""
    held = resources.actors * resources.actor_cpus
    task = resources.write_cpus if resources.decode_in_actors else resources.decode_cpus
    if held + task > cpus:
        raise ResourceError(
            f"{resources.actors} actors holding {resources.actor_cpus:g} CPUs each leave "
            f"{max(cpus - held, 0):g} of the cluster's {cpus:g} CPUs, and each "
            f"{'write' if resources.decode_in_actors else 'decode'} task needs {task:g}: the "
            "job would wait forever; give fewer --actors or a smaller --actor-cpus"
        )


@dataclass(frozen=True)
class JobOptions:
    """What a job computes and how it is cut into work."""

    embed: EmbedOptions
    resources: Resources | None  # None: default_resources of the cluster
    decode_batch: int = 1024  # images per decode task (a block of paths)
    rows_per_file: int = 8192  # images per output part, at least
    max_pixels: int = 50_000_000  # the service's default max_pixels
    max_bytes: int = 20 * 2**20  # the service's default max_upload_bytes
    progress: bool = True


@dataclass(frozen=True)
class JobResult:
    """What a job did."""

    todo: int  # images this run set out to do
    embedded: int
    refused: dict[str, int]  # images refused, by error kind
    seconds: float  # from building the pipeline to the last part written
    resources: Resources | None  # None: no job ran (nothing to do)


@contextlib.contextmanager
def connect(address: str | None, cpus: int | None = None) -> Iterator[float]:
    """Ray for the job; yields the seconds it took to start or join. Shut down afterwards only
    if started here."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray Data hands its actors their work through the object store, which Ray's core logs as
    # an error at every actor start (ray-project/ray#53727); its real failures reach Python
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    start = time.perf_counter()
    if ray.is_initialized():
        yield 0.0
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    quiet = {"logging_level": logging.ERROR, "log_to_driver": False}
    # what Ray's C++ side prints while it starts (the log level just set, token authentication)
    # is silenced with the service's quiet_native_output; a failure still raises
    with warnings.catch_warnings(), quiet_native_output():
        warnings.simplefilter("ignore")  # Ray's FutureWarnings about its own defaults
        if address:
            try:
                ray.init(address=address, **quiet)  # type: ignore[arg-type]
            except ConnectionError as error:
                raise ConnectionError(
                    f"{error}: is the cluster up, and if it uses token authentication (Ray's "
                    "default for `ray start` where ~/.ray/auth_token exists), is RAY_AUTH_MODE="
                    "token set here with the cluster's token (`ray get-auth-token`)?"
                ) from None
        else:
            # "local": a Ray of the job's own even where one from `ray start` runs here, which
            # ray.init() would otherwise join (and then refuse num_cpus); --address auto joins it
            ray.init(
                address="local",
                num_cpus=cpus or os.cpu_count() or 1,
                include_dashboard=False,
                **quiet,  # type: ignore[arg-type]
            )
    try:
        yield time.perf_counter() - start
    finally:
        ray.shutdown()


def _quiet_ray_data(progress_bars: bool) -> None:
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = progress_bars
    context.print_on_execution_start = False
    context.enable_auto_log_stats = False
    context.verbose_stats_logs = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)


def run_job(
    model: ModelFile,
    inputs: Location,
    todo: list[str],
    out: Location,
    options: JobOptions,
) -> JobResult:
    """Embed ``todo`` (URIs on ``inputs``' filesystem) into ``out``, on the Ray this process is
    connected to."""
    cluster = ray.cluster_resources()
    resources = options.resources or default_resources(
        cluster.get("CPU", 1.0), cluster.get("GPU", 0.0)
    )
    check_resources(resources, cluster.get("CPU", 1.0))
    embed = options.embed
    if embed.threads == 0 and resources.threads:
        embed = dataclasses.replace(embed, threads=resources.threads)
    if resources.actor_gpus == 0 and embed.providers == "auto":
        embed = dataclasses.replace(embed, providers="CPUExecutionProvider")
    _quiet_ray_data(progress_bars=False)
    start = time.perf_counter()
    if not todo:
        return JobResult(0, 0, {}, 0.0, resources)
    batches = -(-len(todo) // embed.batch_size)
    if resources.actors > batches:  # a small job: no actor without a batch to run
        resources = dataclasses.replace(resources, actors=batches)
    paths = pa.table({"path": pa.array(todo, pa.string())})
    size = options.decode_batch
    blocks = [paths.slice(i, size) for i in range(0, len(todo), size)]
    decoding = DecodeOptions(
        inputs, model.card.preprocessing, options.max_pixels, options.max_bytes
    )
    model_ref = ray.put(model.data)
    dataset: ray.data.Dataset = ray.data.from_arrow(blocks)
    if not resources.decode_in_actors:
        dataset = dataset.map_batches(
            functools.partial(decode, options=decoding),
            batch_size=None,
            batch_format="numpy",
            num_cpus=resources.decode_cpus,
        )
    dataset = dataset.map_batches(
        Embedder,
        fn_constructor_args=(
            [model_ref],
            embed,
            decoding if resources.decode_in_actors else None,
        ),
        batch_size=embed.batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=resources.actors),
        num_cpus=resources.actor_cpus,
        num_gpus=resources.actor_gpus or None,
    )
    top_k = min(embed.top_k, len(model.card.classes))
    sink = PartsSink(
        out,
        model.card.classes,
        {
            "model_name": model.name,
            "model_version": model.version,
            "card_sha256": model.card_sha256,
        },
        model.card.model.embedding_dim,
        top_k,
        options.rows_per_file,
    )
    progress = Progress(out, len(todo)) if options.progress else None
    with progress or contextlib.nullcontext(), warnings.catch_warnings():
        # Ray Data's advice when the last batches are fewer than the actors: nothing to act on
        warnings.filterwarnings("ignore", "The minimum number of concurrent actors", UserWarning)
        dataset.write_datasink(sink, ray_remote_args={"num_cpus": resources.write_cpus})
    seconds = time.perf_counter() - start
    refused: dict[str, int] = {}
    for counts in sink.counts:
        for kind, images in counts.refused:
            refused[kind] = refused.get(kind, 0) + images
    embedded = sum(counts.embedded for counts in sink.counts)
    return JobResult(len(todo), embedded, refused, seconds, resources)
