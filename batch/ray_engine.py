"""The Ray engine (``--engine ray``): a job's stages as a Ray Data pipeline, for a cluster.

The pipeline (:func:`RayEngine.run`), on CPUs alone::

    from_arrow(chunks, a block per decode_batch images)      the images still to do
      .map_batches(RayEmbedder, concurrency=actors,          actors: read + the service's decoding
                   num_cpus=actor_cpus)                      + one onnxruntime session each
      .iter_batches()                                        the driver: rows -> PartCollector

With GPUs (or ``--no-decode-in-actors``) the images decode in tasks of their own, which feed the
actors::

    from_arrow(chunks, a block per decode_batch images)
      .map_batches(decode, num_cpus=decode_cpus)             tasks: read + the service's decoding
      .map_batches(RayEmbedder, concurrency=actors,          actors: one onnxruntime session each
                   num_cpus=actor_cpus, num_gpus=...)
      .iter_batches()

The decode and inference code is the embedded engine's (:mod:`batch.decoding`,
:mod:`batch.embedder`), and so are the parts (:mod:`batch.parts`): the driver receives every
image's row (a few hundred bytes: the embedding, the top-k, the state of the file) and writes
each chunk's parts once it is complete, as the embedded engine does. OUT is the same whichever
engine wrote it.

Ray's CPU accounting is logical: an actor holds ``actor_cpus`` of the node's CPUs for its whole
life, and a task runs only where its ``num_cpus`` are free. Actors that together hold every
CPU leave none for the decode tasks that feed them, and the job waits forever; where there are
decode tasks the defaults (:func:`default_resources`) leave at least one CPU, or half of a
2-CPU machine, to them, and :func:`check_resources` refuses settings that cannot run.

:func:`connect` starts a local Ray for the job (no dashboard, no usage statistics, warnings
only) or joins a cluster (``--address`` or ``RAY_ADDRESS``); a Ray already started in this
process (a test's) is used as it is. A worker killed mid-job is replaced by Ray Data (its tasks
retried, its actors restarted), and its images are still written once: a chunk is written when
all its rows have reached the driver.
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
from typing import Any

import ray
import ray.data

from batch.decoding import DecodeOptions, decode
from batch.embedder import Embedder, EmbedOptions
from batch.engine import LARGE_MODEL_BYTES, EngineRun, EngineSettingsError, Work
from batch.stages import StageWorkers
from service.runtime.providers import quiet_native_output

__all__ = [
    "RayEmbedder",
    "RayEngine",
    "ResourceError",
    "Resources",
    "check_resources",
    "connect",
    "default_resources",
]


@dataclass(frozen=True)
class Resources:
    """How the job spreads over Ray's CPUs and GPUs."""

    actors: int  # inference actors (onnxruntime sessions)
    actor_cpus: float  # Ray CPUs each actor holds
    actor_gpus: float  # Ray GPUs each actor holds (0: the CPU provider)
    threads: int  # onnxruntime intra-op threads per actor (0: its default, every core)
    decode_cpus: float  # Ray CPUs each decode task asks for
    decode_in_actors: bool = False  # each actor decodes its own batches: no decode tasks


def default_resources(
    cpus: float, gpus: float, actors: int | None = None, model_bytes: int = 0
) -> Resources:
    """Defaults for a cluster of ``cpus`` CPUs and ``gpus`` GPUs, a model file of
    ``model_bytes`` (and ``actors`` actors, where given: the CPUs and threads each holds follow).

    **On CPUs alone** each actor decodes its own batches (no decode tasks), as the embedded
    engine's sessions do: a small model gets an actor per CPU with one intra-op thread each, a
    large one (:data:`batch.engine.LARGE_MODEL_BYTES`) an actor per 4 CPUs with 4 threads (on
    fewer than 8 CPUs one actor on every core). Decode tasks beside the actors cost a process's
    copy of every decoded image and Ray Data's conversions on the way to the actor: on 2 cores,
    two one-thread actors decoding their own images ran the shipped model's job at 2.2 to 2.9
    times the marginal rate of one actor fed by decode tasks (docs/batch.md).

    **With GPUs**: one actor per GPU, and decode tasks of half a CPU each on the CPUs (decoding
    is then what bounds the job); the actors together hold at most all CPUs but one (each at
    most one; on one CPU, half of it), so that the tasks that feed them can run.
    """
    if gpus >= 1:
        actors = actors or int(gpus)
        actor_cpus = min(1.0, max(cpus - 1, 0.5) / actors)
        return Resources(actors, actor_cpus, 1.0, 0, 0.5)
    large = model_bytes >= LARGE_MODEL_BYTES
    actors = actors or (max(1, int(cpus) // 4) if large else max(1, int(cpus)))
    share = cpus / actors
    # whole CPUs where there is at least one each (an actor's CPUs must fit on one node)
    actor_cpus = float(int(share)) if share >= 1 else share
    # a large model's one actor: onnxruntime's threads on every core
    threads = max(1, int(share)) if not large else 0 if actors == 1 else max(1, min(4, int(share)))
    return Resources(actors, actor_cpus, 0.0, threads, 0.5, decode_in_actors=True)


class ResourceError(EngineSettingsError):
    """The actors would hold the CPUs the job's tasks need: it would wait forever."""


def check_resources(resources: Resources, cpus: float) -> None:
    """:class:`ResourceError` where, on a cluster of ``cpus`` CPUs, the actors leave no room for
    a decode task next to them (or, decoding in the actors, hold more CPUs than there are).
    The parts are written by the driver, which holds no Ray CPU."""
    held = resources.actors * resources.actor_cpus
    task = 0.0 if resources.decode_in_actors else resources.decode_cpus
    if held + task > cpus:
        needs = "" if resources.decode_in_actors else f", and each decode task needs {task:g}"
        raise ResourceError(
            f"{resources.actors} actors holding {resources.actor_cpus:g} CPUs each leave "
            f"{max(cpus - held, 0):g} of the cluster's {cpus:g} CPUs{needs}: the job would wait "
            "forever; give fewer --actors or a smaller --actor-cpus"
        )


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


class RayEmbedder(Embedder):
    """An inference actor: the model file's bytes from Ray's object store (put there once by
    the driver, so that every node gets the same file)."""

    def __init__(
        self,
        model: list[ray.ObjectRef],
        options: EmbedOptions,
        decoding: DecodeOptions | None = None,
    ) -> None:
        super().__init__(ray.get(model[0]), options, decoding)


@dataclass(frozen=True)
class RayEngine:
    """Ray Data over the cluster at ``address`` (None: ``RAY_ADDRESS``, else a local Ray of
    ``cpus`` CPUs started for the job)."""

    address: str | None = None
    cpus: int | None = None
    resources: Resources | None = None  # None: default_resources of the cluster
    overrides: dict[str, Any] | None = (
        None  # Resources' fields given (--actors...): the rest default
    )
    decode_batch: int = 1024  # images per decode task (a block of paths)

    name = "ray"

    def _resources(self, model_bytes: int) -> tuple[Resources, float]:
        """The given resources, the others the cluster's defaults (:func:`default_resources`
        with the ``--actors`` given, if any); :class:`ResourceError` where they cannot run.
        ``--decode-cpus`` alone asks for decode tasks."""
        cluster = ray.cluster_resources()
        cpus, gpus = cluster.get("CPU", 1.0), cluster.get("GPU", 0.0)
        given = {key: value for key, value in (self.overrides or {}).items() if value is not None}
        if "decode_cpus" in given:
            given.setdefault("decode_in_actors", False)
        actors = int(given["actors"]) if "actors" in given else None
        resources = self.resources or default_resources(cpus, gpus, actors, model_bytes)
        resources = dataclasses.replace(resources, **given)
        check_resources(resources, cpus)
        return resources, cpus

    def run(self, work: Work) -> EngineRun:
        """Embed ``work``'s chunks on the Ray this process joins or starts."""
        with connect(self.address, self.cpus) as started_s:
            return self._run(work, started_s)

    def _run(self, work: Work, started_s: float) -> EngineRun:
        resources, cpus = self._resources(len(work.model.data))
        embed = work.embed
        if embed.threads == 0 and resources.threads:
            embed = dataclasses.replace(embed, threads=resources.threads)
        if resources.actor_gpus == 0 and embed.providers == "auto":
            embed = dataclasses.replace(embed, providers="CPUExecutionProvider")
        _quiet_ray_data(progress_bars=False)
        images = work.chunks.num_rows
        batches = -(-images // embed.batch_size)
        if resources.actors > batches:  # a small job: no actor without a batch to run
            resources = dataclasses.replace(resources, actors=batches)
        size = self.decode_batch
        blocks = [work.chunks.slice(i, size) for i in range(0, images, size)]
        model_ref = ray.put(work.model.data)
        dataset: ray.data.Dataset = ray.data.from_arrow(blocks)
        if not resources.decode_in_actors:
            dataset = dataset.map_batches(
                functools.partial(decode, options=work.decoding),
                batch_size=None,
                batch_format="numpy",
                num_cpus=resources.decode_cpus,
            )
        dataset = dataset.map_batches(
            RayEmbedder,
            fn_constructor_args=(
                [model_ref],
                embed,
                work.decoding if resources.decode_in_actors else None,
            ),
            batch_size=embed.batch_size,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=resources.actors),
            num_cpus=resources.actor_cpus,
            num_gpus=resources.actor_gpus or None,
        )
        free = max(cpus - resources.actors * resources.actor_cpus, resources.decode_cpus)
        decoders = resources.actors if resources.decode_in_actors else free / resources.decode_cpus
        workers = StageWorkers(decode=decoders, infer=resources.actors, write=1)
        with warnings.catch_warnings():
            # Ray Data's advice when the last batches are fewer than the actors: nothing to act on
            warnings.filterwarnings(
                "ignore", "The minimum number of concurrent actors", UserWarning
            )
            for rows in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
                work.collector.add(rows)
        return EngineRun(engine=self.name, start_s=started_s, workers=workers)
