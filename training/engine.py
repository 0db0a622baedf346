"""One training epoch and one evaluation pass: the loops, with AMP and distributed reduction."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from training.progress import progress
from training.runtime import Runtime

__all__ = ["EpochStats", "EvalResult", "evaluate", "make_criterion", "train_one_epoch"]


@dataclass(frozen=True)
class EpochStats:
    """What one training epoch measured (over all processes)."""

    loss: float
    accuracy: float
    images_per_second: float
    seconds: float


@dataclass(frozen=True)
class EvalResult:
    """Loss, top-1 accuracy and confusion matrix (rows: true class, columns: predicted)."""

    loss: float
    accuracy: float
    confusion: Tensor  # (K, K) int64
    count: int


def make_criterion(loss: str, label_smoothing: float = 0.0) -> nn.Module:
    """``"cross_entropy"`` (softmax classifier) or ``"hinge"`` (LRBP's multi-class hinge)."""
    if loss == "hinge":
        return nn.MultiMarginLoss()
    return nn.CrossEntropyLoss(label_smoothing=label_smoothing)


def _autocast(runtime: Runtime) -> contextlib.AbstractContextManager:
    if runtime.amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=runtime.device.type, dtype=runtime.amp_dtype)


def _to_device(
    images: Tensor, labels: Tensor, runtime: Runtime, channels_last: bool
) -> tuple[Tensor, Tensor]:
    images = images.to(runtime.device, non_blocking=True)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels.to(runtime.device, non_blocking=True)


def _all_reduce(values: Tensor, runtime: Runtime) -> Tensor:
    if runtime.distributed:
        dist.all_reduce(values)
    return values


def train_one_epoch(
    model: nn.Module,
    loader: Iterable[tuple[Tensor, Tensor]],
    criterion: Callable[[Tensor, Tensor], Tensor],
    optimizer: torch.optim.Optimizer,
    runtime: Runtime,
    scaler: torch.amp.GradScaler,
    step_scheduler: Callable[[], None] | None = None,
    channels_last: bool = False,
    description: str = "train",
) -> EpochStats:
    """One pass over ``loader``; ``step_scheduler`` is called after every optimiser step."""
    model.train()
    sums = torch.zeros(3, dtype=torch.float64, device=runtime.device)  # loss, correct, count
    start = time.perf_counter()
    bar = progress(loader, description, runtime.is_main)
    for step, (images, labels) in enumerate(bar):
        images, labels = _to_device(images, labels, runtime, channels_last)
        with _autocast(runtime):
            logits, _ = model(images)
        loss = criterion(logits.float(), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scale = scaler.get_scale()  # 1.0 without fp16; a host sync only with fp16
        scaler.step(optimizer)
        scaler.update()
        # fp16: a step with inf/NaN gradients is skipped and the scale lowered; the schedule
        # then waits too (stepping it would skip its first value and make torch warn)
        if step_scheduler is not None and scaler.get_scale() >= scale:
            step_scheduler()
        batch = labels.shape[0]
        # in place on the device: no host sync per batch, no CPU tensor mixed into a CUDA one
        sums[0] += loss.detach() * batch
        sums[1] += (logits.argmax(1) == labels).sum()
        sums[2] += batch
        if runtime.is_main and step % 20 == 0:
            bar.set_postfix(loss=f"{sums[0].item() / sums[2].item():.3f}")
    seconds = time.perf_counter() - start
    loss_sum, correct, count = _all_reduce(sums, runtime).tolist()
    return EpochStats(loss_sum / count, correct / count, count / seconds, seconds)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable[tuple[Tensor, Tensor]],
    criterion: Callable[[Tensor, Tensor], Tensor],
    num_classes: int,
    runtime: Runtime,
    channels_last: bool = False,
    description: str = "eval",
) -> EvalResult:
    """Loss, accuracy and confusion matrix of ``model`` in eval mode over ``loader``.

    Under DDP each process evaluates its shard and the sums are all-reduced.
    """
    model.eval()
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=runtime.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=runtime.device)
    for images, labels in progress(loader, description, runtime.is_main):
        images, labels = _to_device(images, labels, runtime, channels_last)
        with _autocast(runtime):
            logits, _ = model(images)
        loss_sum += criterion(logits.float(), labels).double() * labels.shape[0]
        confusion += torch.bincount(
            labels * num_classes + logits.argmax(1), minlength=num_classes * num_classes
        )
    _all_reduce(confusion, runtime)
    _all_reduce(loss_sum, runtime)
    confusion = confusion.view(num_classes, num_classes).cpu()
    count = int(confusion.sum())
    accuracy = float(confusion.diag().sum()) / max(count, 1)
    return EvalResult(loss_sum.item() / max(count, 1), accuracy, confusion, count)
