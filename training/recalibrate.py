"""Re-estimate a trained head's input statistics over the training images; ``smso-recalibrate``.

SMSO standardises ``z`` with ``Sigma``, the covariance of its input. During training ``Sigma`` is
a running average (``momentum = 0.1``) that follows the last few dozen batches, so in eval mode
every output of ``z'`` keeps a constant offset from ``N(0, 1)``. After training it is re-estimated
in one pass with a cumulative average, in the spirit of "precise BatchNorm":

* the images are the training split with the evaluation transform (``Splits.train_eval``: no
  augmentation); validation and test images are never used;
* ``training.head_statistics`` runs the pass: the model in eval mode (its BatchNorm uses the
  running statistics, as at test time and in the exported graph), in float32 without autocast,
  the head summing ``input_statistics`` over every image in float64 (SMSO: ``sum_b sum_i x~_i
  x~_i^T`` and ``sum_b (n - 1)``). Under DDP each process sums its share of the images and the
  sums and counts are all-reduced, so every rank ends with the estimate over all the images, not
  rank 0's;
* ``set_input_statistics`` writes the result (SMSO: ``running_cov = sums / count``), which the
  exporter folds into the ONNX graph;
* the re-estimate is kept unless it lowers the validation accuracy by more than two standard
  errors (then the running average is put back and the report says so).

``smso-train`` does this at the end of a finished run, on ``best.pt`` before its test
(``--no-recalibrate`` skips it); ``smso-recalibrate CHECKPOINT [-o OUT]`` does it for a checkpoint
written earlier. The checkpoint records what was done under ``"recalibration"``.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from training.checkpoint import is_checkpoint, load_checkpoint, resave_checkpoint
from training.cli import non_negative_int, positive_int, run_cli
from training.config import ConfigError
from training.engine import evaluate, make_criterion
from training.evaluate import load_with_splits
from training.head_statistics import fit_input_statistics
from training.heads import head_spec
from training.model import SecondOrderNet
from training.outputs import Replaceable, check_output_file, check_writable
from training.runtime import DEVICES, Runtime, setup_runtime

__all__ = ["main", "recalibrate", "recalibrate_checkpoint"]

log = logging.getLogger(__name__)

#: What ``-o`` may write over: an SMSO checkpoint (the input, an earlier recalibrated copy).
CHECKPOINT = Replaceable(
    is_checkpoint, "an SMSO checkpoint", "give another file name such as recalibrated.pt"
)


def recalibrate(
    model: SecondOrderNet,
    train_images: Iterable[tuple[Tensor, Tensor]],
    val_images: Iterable[tuple[Tensor, Tensor]],
    criterion: Callable[[Tensor, Tensor], Tensor],
    num_classes: int,
    runtime: Runtime,
) -> dict[str, Any]:
    """Re-estimate ``model``'s head statistics over ``train_images`` in place; the report.

    The re-estimate is kept unless it lowers the validation accuracy ``a`` by more than its
    noise, two standard errors ``2 sqrt(a (1 - a) / n)`` over the ``n`` validation images (or
    the running statistics hold NaN or infinite values: always kept then); then
    the running statistics training ended with are put back (a choice made on validation images,
    as the checkpoint was): on a small or easy dataset the running average can suit the weights
    trained with it better than the cumulative one.

    Under DDP each process passes its share of the images (every image once over all ranks).
    The report: images used, seconds, the validation accuracy before and after, and ``kept``
    (whether the re-estimate is what the model now holds).
    """
    before = evaluate(model, val_images, criterion, num_classes, runtime, description="val")
    running = {name: buffer.clone() for name, buffer in model.head.named_buffers()}
    start = time.perf_counter()
    images = fit_input_statistics(model, train_images, runtime)
    seconds = time.perf_counter() - start
    after = evaluate(model, val_images, criterion, num_classes, runtime, description="val")
    noise = 2 * math.sqrt(before.accuracy * (1 - before.accuracy) / max(before.count, 1))
    # a running estimate with NaN or infinite values gives NaN outputs: whatever accuracy it
    # seems to have is not a measure of anything, and it is never put back
    broken = not all(
        bool(torch.isfinite(b).all()) for b in running.values() if b.is_floating_point()
    )
    kept = broken or after.accuracy >= before.accuracy - noise
    if not kept:
        with torch.no_grad():
            for name, buffer in model.head.named_buffers():
                buffer.copy_(running[name])
    report = {
        "split": "train",
        "transform": "eval",
        "images": images,
        "seconds": seconds,
        "val_accuracy_before": before.accuracy,
        "val_accuracy_after": after.accuracy,
        "kept": kept,
        "tolerance": noise,
    }
    log.info(
        "re-estimated the head's statistics over %d training images in %.1f s: validation "
        "accuracy %.4f -> %.4f; %s",
        images,
        seconds,
        before.accuracy,
        after.accuracy,
        "kept"
        if kept
        else f"lower by more than {noise:.4f} (2 standard errors), so the "
        "running statistics are kept",
    )
    return report


def recalibrate_checkpoint(
    checkpoint: str | Path,
    out: str | Path | None = None,
    data_root: str | None = None,
    batch_size: int = 256,
    device: str = "auto",
    workers: int = 2,
) -> dict[str, Any]:
    """Recalibrate a checkpoint written by smso-train; write it to ``out`` (default: in place).

    Raises ``ConfigError`` for a head with nothing to re-estimate after training, and
    ``OutputError`` before any work for an ``out`` that is a file of another kind (a run's
    ``metrics.jsonl``, a model.onnx: only an SMSO checkpoint, such as an earlier output, is
    replaced) or that cannot be written, or a checkpoint whose folder is not writable.
    """
    if out is not None:  # the checkpoint itself is fine: that is recalibrating in place
        check_output_file(out, "the output", replaces=CHECKPOINT)
    elif Path(checkpoint).is_file():  # else loading it says what is wrong with it
        check_writable(Path(checkpoint).parent, f"the checkpoint {checkpoint} (in place)")
    runtime = setup_runtime(device, "off")
    model, cfg, splits = load_with_splits(checkpoint, data_root, str(runtime.device))
    if head_spec(model.config.head).input_statistics != "after_training":
        raise ConfigError(
            f"{checkpoint}: head {model.config.head!r} has no statistics to re-estimate after "
            "training (only SMSO's Sigma is)"
        )
    payload = load_checkpoint(checkpoint)
    train = DataLoader(splits.train_eval, batch_size, num_workers=workers)
    val = DataLoader(splits.val, batch_size, num_workers=workers)
    criterion = make_criterion(cfg.loss)
    report = recalibrate(model, train, val, criterion, len(splits.classes), runtime)
    destination = Path(out) if out is not None else Path(checkpoint)
    resave_checkpoint(destination, model.cpu(), payload, recalibration=report)
    return {**report, "checkpoint": str(destination)}


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``smso-recalibrate``; a user's mistake prints one error line and exits 2."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(
        prog="smso-recalibrate",
        description="Re-estimate SMSO's Sigma of a checkpoint over its training images "
        "(cumulative average, eval mode, no augmentation).",
    )
    parser.add_argument("checkpoint", type=Path, help="a checkpoint written by smso-train")
    parser.add_argument("-o", "--out", type=Path, help="where to write it (default: in place)")
    parser.add_argument("--data-root", help="the dataset's folder on this machine")
    parser.add_argument("--batch-size", type=positive_int, default=256)
    parser.add_argument("--device", default="auto", help=DEVICES)
    parser.add_argument("--workers", type=non_negative_int, default=2)
    args = parser.parse_args(argv)

    def body() -> int:
        report = recalibrate_checkpoint(
            args.checkpoint, args.out, args.data_root, args.batch_size, args.device, args.workers
        )
        outcome = "kept" if report["kept"] else "lower: the running Sigma is kept"
        print(
            f"{report['checkpoint']}: Sigma from {report['images']} training images; "
            f"validation accuracy {report['val_accuracy_before']:.4f} -> "
            f"{report['val_accuracy_after']:.4f} ({outcome})"
        )
        return 0

    return run_cli("smso-recalibrate", body)


if __name__ == "__main__":
    sys.exit(main())
