"""Copy a finished run into ``models/``: a slim checkpoint and the evidence of how good it is.

``python -m training.ship RUN_DIR MODEL_DIR`` keeps ``best.pt`` without its optimizer, scheduler
and RNG states (the model config, weights, training config, classes and preset stay, so
``smso-eval`` and ``smso-export`` read it), plus ``config.json``, ``metrics.jsonl``,
``test.json`` and the run's figures.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch

from training.checkpoint import load_checkpoint

__all__ = ["ship"]

RESUME_ONLY = ("optimizer", "scheduler", "scaler", "rng")
EVIDENCE = ("config.json", "metrics.jsonl", "test.json")


def ship(run: Path, dest: Path) -> Path:
    """Write ``dest/model.pt`` (slim ``best.pt``) and copy the run's evidence; returns ``dest``."""
    payload = load_checkpoint(run / "best.pt")
    missing = [name for name in EVIDENCE if not (run / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{run} is not a finished run: missing {', '.join(missing)}")
    dest.mkdir(parents=True, exist_ok=True)
    torch.save({k: v for k, v in payload.items() if k not in RESUME_ONLY}, dest / "model.pt")
    for path in [*(run / name for name in EVIDENCE), *run.glob("*.png"), *run.glob("fig*.json")]:
        shutil.copy2(path, dest / path.name)
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m training.ship RUN_DIR MODEL_DIR")
    print(f"shipped {ship(Path(sys.argv[1]), Path(sys.argv[2]))}")
