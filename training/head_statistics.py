"""Head state from statistics of the head's input over a dataset, in one pass.

Some heads set part of their state from data rather than by gradient descent: LRBP's projection
(the top eigenvectors of the features' Gram matrix, before training) and SMSO's ``Sigma``
(re-estimated after training, ``training.recalibrate``). Such a head implements
``Head.input_statistics`` (float64 sums over a batch and the number of terms they add) and
``Head.set_input_statistics``, and its ``HeadSpec`` says when smso-train runs the pass.

The pass runs the model in eval mode (BatchNorm with its running statistics), in float32 without
autocast, and sums over every image; under DDP each process passes its share of the images and
the sums and counts are all-reduced, so every rank sets the estimate over all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from training.heads import Head
from training.model import SecondOrderNet
from training.runtime import Runtime

__all__ = ["accumulate_input_statistics", "fit_input_statistics", "head_inputs"]


@torch.no_grad()
def accumulate_input_statistics(
    head: Head, features: Iterable[Tensor], distributed: bool = False
) -> int:
    """Sum ``head.input_statistics`` over ``features`` (batches ``(B, c, h, w)``), reduce the sums
    and counts over all processes when ``distributed``, and set them on the head.

    Returns the number of images summed (over all processes). Raises ``ValueError`` when there
    are none.
    """
    sums: Tensor | None = None
    totals: Tensor | None = None  # (count, images), float64 so that one all-reduce carries both
    for x in features:
        batch_sums, count = head.input_statistics(x)
        batch_totals = torch.tensor([count, x.shape[0]], dtype=torch.float64, device=x.device)
        sums = batch_sums if sums is None else sums + batch_sums
        totals = batch_totals if totals is None else totals + batch_totals
    if sums is None or totals is None:
        raise ValueError("no images to estimate the head's input statistics from")
    if distributed:
        dist.all_reduce(sums)
        dist.all_reduce(totals)
    count, images = (int(v) for v in totals.tolist())
    head.set_input_statistics(sums, count)
    return images


@torch.no_grad()
def head_inputs(
    model: SecondOrderNet, loader: Iterable[tuple[Tensor, Tensor]], device: torch.device
) -> Iterator[Tensor]:
    """The head's input ``(B, c, h, w)`` for every batch, eval mode, float32."""
    model.eval()
    for images, _ in loader:
        with torch.autocast(device_type=device.type, enabled=False):
            features = model.forward_features(images.to(device, non_blocking=True))
        yield features


def fit_input_statistics(
    model: SecondOrderNet, loader: Iterable[tuple[Tensor, Tensor]], runtime: Runtime
) -> int:
    """Set ``model.head``'s state from its input statistics over ``loader``'s images (this
    process's share under DDP); returns the number of images over all processes."""
    features = head_inputs(model, loader, runtime.device)
    return accumulate_input_statistics(model.head, features, runtime.distributed)
