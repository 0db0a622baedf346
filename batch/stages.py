"""Where a job's time goes: the busy seconds of each stage, and which one bounds the job.

Every engine runs the same four stages: **read** (a file's bytes from its filesystem),
**decode** (the service's decoder and preprocessing), **infer** (the onnxruntime session, the
top-k and typicality), **write** (the Parquet parts). Read and decode are timed per image by
:func:`batch.decoding.decode`, inference per batch by :class:`batch.embedder.Embedder` (each
image's share); both travel with the image's row, so they are counted the same way whichever
engine ran them and wherever. Writing is timed where the parts are written.

Stages overlap, each with its own workers (decode threads or tasks, sessions, one writer): the
stage that bounds the job is the one with the most busy seconds per worker,
``busy_s / workers``. When that stage's share of the job's seconds is near 1, more of its
workers (``--decoders``, ``--sessions``) would make the job faster; adding to another would not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

__all__ = ["STAGES", "StageTimes", "StageWorkers"]

STAGES = ("read", "decode", "infer", "write")


@dataclass(frozen=True)
class StageWorkers:
    """How many workers ran each stage (read and decode share theirs)."""

    decode: float = 1.0  # threads or tasks reading and decoding at once
    infer: float = 1.0  # onnxruntime sessions running at once
    write: float = 1.0  # the part writer

    def of(self, stage: str) -> float:
        return self.decode if stage in ("read", "decode") else getattr(self, stage)


@dataclass
class StageTimes:
    """Busy seconds of each stage, summed over its workers."""

    read_s: float = 0.0
    decode_s: float = 0.0
    infer_s: float = 0.0
    write_s: float = 0.0

    def add_rows(self, rows: pa.Table) -> None:
        """Add the per-image seconds ``rows`` carry (``read_s``, ``decode_s``, ``infer_s``)."""
        for stage in ("read", "decode", "infer"):
            column = rows.column(f"{stage}_s")
            total = float(np.sum(column.to_numpy(zero_copy_only=False))) if len(column) else 0.0
            setattr(self, f"{stage}_s", getattr(self, f"{stage}_s") + total)

    def busy(self, stage: str) -> float:
        return float(getattr(self, f"{stage}_s"))

    def bound(self, workers: StageWorkers) -> str:
        """The stage with the most busy seconds per worker: read and decode together, as they
        share their workers (then named by the larger of the two)."""
        per_worker = {
            "decode": (self.read_s + self.decode_s) / workers.decode,
            "infer": self.infer_s / workers.infer,
            "write": self.write_s / workers.write,
        }
        stage = max(per_worker, key=lambda name: per_worker[name])
        if stage == "decode" and self.read_s > self.decode_s:
            return "read"
        return stage

    def as_dict(self) -> dict[str, float]:
        return {key: round(value, 3) for key, value in asdict(self).items()}

    def text(self, workers: StageWorkers) -> str:
        """``read 0.4 s, decode 2.1 s (2 threads), infer 1.3 s, write 0.2 s``."""
        said = []
        for stage in STAGES:
            count = workers.of(stage)
            who = f" over {count:g}" if count != 1 and stage != "read" else ""
            said.append(f"{stage} {self.busy(stage):.1f} s{who}")
        return ", ".join(said)
