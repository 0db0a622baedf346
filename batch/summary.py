"""The end of a job: what it did, what OUT now holds, and whether anything was lost.

What a folder or glob left out of INPUT (links leading outside it, loops, FIFOs: batch.walk) is
said on a line of its own: those entries are not images of INPUT, and their absence is not a
fault.

A job's own faults (exit status 1): an image of INPUT missing from OUT after the job, an image in
OUT twice, or a model whose outputs were not finite. Images refused by the service's rules are
not faults of the job: they are in the errors table, and the job succeeds (exit status 0).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from batch.decoding import NOT_FINITE
from batch.progress import format_duration, format_rate
from batch.stages import StageTimes, StageWorkers

__all__ = ["Summary"]

#: What each reason of ``input_skipped`` says in the text summary.
SKIPPED_WORDS = {
    "links_outside_input": ("links leading outside INPUT", "not followed: --follow-symlinks"),
    "folders_already_walked": ("folders already walked", "a loop, or a second link to one"),
    "not_regular_files": ("FIFOs, sockets or devices", "never opened"),
    "broken_or_unlistable": ("broken links or unlistable folders", "not read"),
}


def _skipped(counts: dict[str, int]) -> str:
    said = []
    for reason, n in counts.items():
        words, why = SKIPPED_WORDS.get(reason, (reason, ""))
        said.append(f"{words} {n:,}" + (f" ({why})" if why else ""))
    return "; ".join(said)


@dataclass(frozen=True)
class Summary:
    """A job's figures; :attr:`faults` lists what makes it fail."""

    inputs: int  # images INPUT names
    skipped: int  # already in OUT and unchanged (--resume): not read
    todo: int  # set out to do in this run: new + changed + retried
    embedded: int  # written to the embeddings table in this run
    refused: dict[str, int]  # written to the errors table in this run, by kind
    seconds: float  # the engine's run, from its start to the last part written
    engine: str  # "local" or "ray" ("" where nothing was to do)
    start_seconds: float  # starting or joining Ray (0 for the embedded engine)
    out_embedded: int  # rows of OUT's embeddings table now
    out_refused: int  # rows of OUT's errors table now
    missing: int  # images of INPUT in neither table
    duplicates: int  # rows of OUT whose image is in another row too
    out: str
    # what a folder or glob left out of INPUT, by reason (batch.walk.Skipped.as_dict)
    input_skipped: dict[str, int] = field(default_factory=dict)
    new: int = 0  # in INPUT, not in OUT
    changed: int = 0  # in OUT from another size or modification time: embedded again
    retried: int = 0  # in OUT's errors table, embedded again (--retry-errors)
    deleted: int = 0  # rows of OUT whose image is no longer in INPUT: taken out
    stages: dict[str, float] = field(default_factory=dict)  # busy seconds: StageTimes.as_dict
    workers: dict[str, float] = field(default_factory=dict)  # StageWorkers, as a dict
    bound: str = ""  # the stage that bounds the job (batch.stages)
    first_part_seconds: float = 0.0  # from the engine's start to the first part in OUT
    faults: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, **figures: Any) -> Summary:
        summary = cls(**figures)
        faults = summary.faults
        if summary.missing:
            faults.append(
                f"{summary.missing:,} images of INPUT are not in OUT: run the same command "
                "with --resume to finish them"
            )
        if summary.duplicates:
            faults.append(f"{summary.duplicates:,} rows of OUT repeat an image")
        if summary.refused.get(NOT_FINITE):
            faults.append(
                f"the model's outputs were NaN or infinite for {summary.refused[NOT_FINITE]:,} "
                "images (the model file is at fault)"
            )
        return summary

    @property
    def images_per_s(self) -> float:
        done = self.embedded + sum(self.refused.values())
        return done / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"images_per_s": round(self.images_per_s, 1)}

    def text(self) -> str:
        """A few lines for a person."""
        refused = sum(self.refused.values())
        kinds = ", ".join(f"{kind} {n:,}" for kind, n in sorted(self.refused.items()))
        why = [
            f"{n:,} {word}"
            for n, word in ((self.new, "new"), (self.changed, "changed"), (self.retried, "retried"))
            if n
        ]
        head = (
            f"smso-embed: {self.inputs:,} images in INPUT, {self.skipped:,} already in OUT, "
            f"{self.todo:,} to do"
        )
        if why and (self.changed or self.retried or self.skipped):
            head += f" ({', '.join(why)})"
        if self.deleted:
            head += f"; {self.deleted:,} gone from INPUT, taken out of OUT"
        lines = [
            head,
            f"  embedded   {self.embedded:,}",
            f"  refused    {refused:,}" + (f" ({kinds}): see {self.out}/errors" if kinds else ""),
        ]
        if self.todo:
            started = (
                f"Ray started in {self.start_seconds:.1f} s"
                if self.engine == "ray"
                else f"first part after {self.first_part_seconds:.1f} s"
            )
            lines.append(
                f"  speed      {format_rate(self.images_per_s)} images/s "
                f"({format_duration(self.seconds)}, {self.engine} engine; {started})"
            )
            if self.stages:
                times = StageTimes(**self.stages)
                workers = StageWorkers(**self.workers) if self.workers else StageWorkers()
                lines.append(
                    f"  stages     {times.text(workers)}: {self.bound or times.bound(workers)} "
                    "bounds the job"
                )
        lines.append(
            f"  OUT        {self.out_embedded:,} embeddings, {self.out_refused:,} errors: "
            + (
                "every image of INPUT once"
                if not (self.missing or self.duplicates)
                else f"{self.missing:,} missing, {self.duplicates:,} repeated"
            )
        )
        if self.input_skipped:
            lines.append(f"  skipped    {_skipped(self.input_skipped)}")
        lines += [f"  fault      {fault}" for fault in self.faults]
        return "\n".join(lines)
