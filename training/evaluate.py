"""``smso-eval``: top-1 accuracy and confusion matrix of a checkpoint on one split of its dataset.

The checkpoint carries its model config, its training config (dataset, root, partition, seed) and
its preset, so ``smso-eval runs/x/best.pt --split test`` needs nothing else; ``--data-root``
points at the dataset where it lives on this machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from training.checkpoint import CheckpointError, check_finite, load_model
from training.cli import HelpFormatter, non_negative_int, positive_int, run_cli
from training.config import ConfigError, TrainConfig
from training.datasets import Preset, Splits, load_splits
from training.engine import EvalResult, evaluate, make_criterion
from training.json_lines import holds_record
from training.model import SecondOrderNet
from training.outputs import Replaceable, check_output_file, write_atomically
from training.runtime import DEVICES, setup_runtime

__all__ = ["evaluate_checkpoint", "format_confusion", "load_with_splits", "main"]

SPLITS = ("train", "val", "test")


def load_with_splits(
    checkpoint: str | Path, data_root: str | None = None, map_location: str = "cpu"
) -> tuple[SecondOrderNet, TrainConfig, Splits]:
    """A checkpoint written by smso-train, its training config, and its dataset's splits
    (transformed by the checkpoint's own preset; ``data_root`` overrides the stored root)."""
    model, payload = load_model(checkpoint, map_location=map_location)
    if "train_config" not in payload or "preset" not in payload:
        raise CheckpointError(f"{checkpoint} was not written by smso-train (no training config)")
    cfg = TrainConfig.from_dict(payload["train_config"])
    preset = Preset.from_dict(payload["preset"])
    splits, _ = load_splits(
        cfg.dataset,
        data_root or cfg.data_root,
        preset,
        cfg.partition,
        cfg.val_size,
        cfg.seed,
        cfg.classes,
    )
    if splits.classes != payload.get("classes", splits.classes):
        raise CheckpointError(
            f"{checkpoint} was trained on classes {payload['classes']}, the dataset has "
            f"{splits.classes}"
        )
    return model, cfg, splits


def evaluate_checkpoint(
    checkpoint: str | Path,
    split: str = "test",
    data_root: str | None = None,
    batch_size: int = 256,
    device: str = "auto",
    workers: int = 2,
) -> tuple[EvalResult, list[str]]:
    """Evaluate ``checkpoint`` on ``split``; returns the result and the class names."""
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    runtime = setup_runtime(device, "off")
    model, cfg, splits = load_with_splits(checkpoint, data_root, str(runtime.device))
    check_finite(model, checkpoint)  # NaN outputs would give an accuracy that means nothing
    loader = DataLoader(getattr(splits, split), batch_size, num_workers=workers)
    criterion = make_criterion(cfg.loss)
    with torch.inference_mode():
        result = evaluate(model, loader, criterion, len(splits.classes), runtime, description=split)
    return result, splits.classes


def format_confusion(confusion: torch.Tensor, classes: Sequence[str]) -> str:
    """The confusion matrix as an aligned text table (rows: true class, columns: predicted)."""
    width = max(5, *(len(str(int(v))) for v in confusion.flatten()))
    label_width = max(len(c) for c in classes)
    header = " " * label_width + " " + " ".join(f"{i:>{width}}" for i in range(len(classes)))
    rows = [
        f"{name:<{label_width}} " + " ".join(f"{int(v):>{width}}" for v in row) + f"  [{i}]"
        for i, (name, row) in enumerate(zip(classes, confusion, strict=True))
    ]
    return "\n".join([header, *rows])


def build_parser() -> argparse.ArgumentParser:
    """``smso-eval``'s flags."""
    parser = argparse.ArgumentParser(
        prog="smso-eval", description=__doc__.splitlines()[0], formatter_class=HelpFormatter
    )
    parser.add_argument("checkpoint", type=Path, help="a checkpoint written by smso-train")
    parser.add_argument(
        "--split",
        default="test",
        choices=SPLITS,
        help="which split of the checkpoint's dataset to evaluate",
    )
    parser.add_argument(
        "--data-root",
        help="the dataset's folder on this machine (default: the "
        "one the checkpoint was trained on)",
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=256, help="images per forward pass"
    )
    parser.add_argument("--device", default="auto", help=DEVICES)
    parser.add_argument(
        "--workers",
        type=non_negative_int,
        default=2,
        help="data-loading processes (0: load in this process)",
    )
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    return parser


#: What every report of ``smso-eval --json`` holds.
REPORT_FIELDS = ("checkpoint", "split", "accuracy", "images", "confusion")
#: What ``--json`` may write over: an earlier report, never a checkpoint or a run's
#: config.json (a device or pipe such as /dev/stdout is written, not read).
EARLIER_REPORT = Replaceable(
    lambda path: holds_record(path, REPORT_FIELDS), "an earlier smso-eval report"
)


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``smso-eval``; a user's mistake prints one error line and exits 2."""
    args = build_parser().parse_args(argv)

    def body() -> int:
        if args.json is not None:
            check_output_file(args.json, "--json", (args.checkpoint,), EARLIER_REPORT)
        result, classes = evaluate_checkpoint(
            args.checkpoint, args.split, args.data_root, args.batch_size, args.device, args.workers
        )
        print(
            f"{args.checkpoint}: top-1 accuracy on {args.split}: {result.accuracy:.4f} "
            f"({result.count} images)"
        )
        print(format_confusion(result.confusion, classes))
        if args.json:
            report = {
                "checkpoint": str(args.checkpoint),
                "split": args.split,
                "accuracy": result.accuracy,
                "loss": result.loss,
                "images": result.count,
                "classes": classes,
                "confusion": result.confusion.tolist(),
            }
            text = (json.dumps(report, indent=2) + "\n").encode()
            if args.json.exists() and not args.json.is_file():  # a device or pipe: /dev/stdout
                args.json.write_bytes(text)
            else:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                write_atomically(args.json, lambda file: file.write(text))
        return 0

    return run_cli("smso-eval", body)


if __name__ == "__main__":
    sys.exit(main())
