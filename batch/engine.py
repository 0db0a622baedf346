"""What an engine is given and what it says it did: one job's work, however it is run.

An engine (:class:`batch.local_engine.LocalEngine`, :class:`batch.ray_engine.RayEngine`) is
only the way the stages are run: it takes a :class:`Work` (the model, the chunks of images to
do, how to decode and embed them) and hands every image's row to ``work.collector``
(:class:`batch.parts.PartCollector`), which writes the parts. Reading INPUT, the plan of a
resume, decoding, inference, the parts and the summary are the same code for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from batch.decoding import DecodeOptions
from batch.embedder import EmbedOptions
from batch.model import ModelFile
from batch.parts import PartCollector
from batch.stages import StageWorkers

__all__ = ["LARGE_MODEL_BYTES", "Engine", "EngineRun", "EngineSettingsError", "Work"]

#: A model file from this size on counts as large, for both engines' defaults: its sessions get
#: every core of their share rather than one each (ResNet-50 SMSO is about 100 MB, the shipped
#: Fashion-MNIST model under 1 MB).
LARGE_MODEL_BYTES = 16 * 2**20


class EngineSettingsError(ValueError):
    """An engine's settings that cannot run (the flags' mistake, said in one line)."""


@dataclass(frozen=True)
class Work:
    """One run's work."""

    model: ModelFile
    chunks: pa.Table  # batch.parts.chunked: path, chunk
    decoding: DecodeOptions
    embed: EmbedOptions
    collector: PartCollector


@dataclass(frozen=True)
class EngineRun:
    """What an engine did besides the rows: its fixed costs and its workers."""

    engine: str  # "local" or "ray"
    start_s: float  # starting or joining the engine (Ray's start; 0 for the embedded engine)
    workers: StageWorkers


class Engine(Protocol):
    name: str

    def run(self, work: Work) -> EngineRun:
        """Every image of ``work.chunks`` handed to ``work.collector`` once, or an error."""
        ...
