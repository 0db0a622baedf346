"""One rank of the two-process gloo test: train a tiny model, save this rank's final weights.

Run by ``torch.distributed.run`` from ``test_train.py``; argv: data root, output folder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from training.config import TrainConfig
from training.model import build_model
from training.train import fit


def main() -> None:
    data_root, out = sys.argv[1], Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    cfg = TrainConfig(
        dataset="fashion_mnist",
        data_root=data_root,
        val_size=40,
        backbone="small_cnn",
        head="smso",
        head_options={"dim": 4},
        reduce_dim=8,
        epochs=2,
        batch_size=16,
        lr=0.05,
        workers=0,
        out=str(out),
        channels_last=False,
        device="cpu",
        eval_test=False,
    )
    result = fit(cfg)
    torch.save(result.model.state_dict(), out / f"rank{rank}.pt")
    if rank == 0:  # the weights before training: fit seeds with cfg.seed right before building
        torch.manual_seed(cfg.seed)
        torch.save(build_model(cfg.model_config(10, 1)).state_dict(), out / "initial.pt")


if __name__ == "__main__":
    main()
