"""One ``smso-embed`` run: the images to do, cut into chunks, through an engine, into parts.

:func:`run_job` is the same whichever engine runs the stages (:mod:`batch.engine`): it cuts the
images to do into chunks (:func:`batch.parts.chunked`), sets up the part writer and collector,
the decoding options (the model card's preprocessing, the service's limits) and the progress
line, lets the engine hand every image's row to the collector, and checks that every chunk was
written.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from batch.decoding import DecodeOptions
from batch.embedder import EmbedOptions
from batch.engine import Engine, EngineRun, Work
from batch.inputs import Location
from batch.model import ModelFile
from batch.parts import PartCollector, PartWriter, WriteCounts, chunked
from batch.progress import Progress
from batch.stages import StageTimes

__all__ = ["JobOptions", "JobResult", "LostImagesError", "run_job"]


@dataclass(frozen=True)
class JobOptions:
    """What a run computes and how it is cut into parts."""

    embed: EmbedOptions
    rows_per_file: int = 8192  # images per output part, at most
    max_pixels: int = 50_000_000  # the service's default max_pixels
    max_bytes: int = 20 * 2**20  # the service's default max_upload_bytes
    dtype: str = "float32"  # the stored embedding's (--dtype)
    progress: bool = True


@dataclass(frozen=True)
class JobResult:
    """What a run did."""

    todo: int  # images this run set out to do
    counts: WriteCounts  # written in this run: embedded, refused by kind
    seconds: float  # from the engine's start (Ray's once started) to the last part written
    stages: StageTimes
    run: EngineRun | None  # None: nothing to do, no engine ran
    first_part_s: float = 0.0  # from the engine's start to the first part in OUT

    @property
    def embedded(self) -> int:
        return self.counts.embedded

    @property
    def refused(self) -> dict[str, int]:
        return self.counts.refused


class LostImagesError(RuntimeError):
    """The engine ended without handing on every image (a fault of the engine)."""


def run_job(
    model: ModelFile,
    inputs: Location,
    todo: list[str],
    out: Location,
    options: JobOptions,
    engine: Engine,
) -> JobResult:
    """Embed ``todo`` (sorted URIs on ``inputs``' filesystem) into ``out`` on ``engine``."""
    if not todo:
        return JobResult(0, WriteCounts(), 0.0, StageTimes(), None)
    embed = options.embed
    top_k = min(embed.top_k, len(model.card.classes))
    writer = PartWriter(
        out,
        model.card.classes,
        {
            "model_name": model.name,
            "model_version": model.version,
            "card_sha256": model.card_sha256,
        },
        model.card.model.embedding_dim,
        top_k,
        options.dtype,
    )
    chunks = chunked(todo, options.rows_per_file)
    collector = PartCollector(writer, chunks)
    decoding = DecodeOptions(
        inputs, model.card.preprocessing, options.max_pixels, options.max_bytes
    )
    work = Work(model, chunks, decoding, embed, collector)
    progress = Progress(len(todo), collector) if options.progress else None
    start = time.perf_counter()
    with progress or contextlib.nullcontext():
        run = engine.run(work)
    seconds = time.perf_counter() - start - run.start_s  # the job, not Ray's start
    if collector.missing():
        raise LostImagesError(
            f"the {engine.name} engine ended with {collector.missing():,} of {len(todo):,} "
            "images not written"
        )
    return JobResult(
        len(todo),
        collector.counts,
        seconds,
        collector.times(),
        run,
        collector.first_part_s - start - run.start_s if collector.first_part_s else 0.0,
    )
