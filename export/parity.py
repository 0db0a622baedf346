"""Parity of an exported file with the PyTorch model it came from, checked at every export.

For each named input set and each batch size, both models run on the same float32 images and each
output is compared by its max relative difference::

    rel(out) = max |onnx - torch| / max |torch|          (over the whole output tensor)

A difference relative to the output's scale, not element by element, so that entries near zero do
not turn rounding noise into huge ratios. Top-1 classes must agree exactly. Float32 passes at
``rel <= 1e-4``; float16 weights and compute at ``rel <= 2e-2`` (:data:`TOLERANCE`), with top-1
disagreements allowed only where the model's own top-2 logits are within that tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from modelcard.card import ExportPrecision, ParityReport

__all__ = ["TOLERANCE", "ParityError", "ParityReport", "check_parity"]

#: Max relative difference allowed per precision.
TOLERANCE = {"float32": 1e-4, "float16": 2e-2}
OUTPUTS = ("logits", "embedding", "features")


class ParityError(RuntimeError):
    """The exported file does not compute what the PyTorch model computes."""


def _run_torch(module: nn.Module, images: np.ndarray) -> dict[str, np.ndarray]:
    with torch.inference_mode():
        outputs = module(torch.from_numpy(images))
    return {name: out.float().numpy() for name, out in zip(OUTPUTS, outputs, strict=True)}


def check_parity(
    session: Any,
    module: nn.Module,
    input_sets: dict[str, np.ndarray],
    batch_sizes: Sequence[int] = (1, 3, 8),
    precision: ExportPrecision = "float32",
) -> ParityReport:
    """Compare ``session`` (an onnxruntime session) with ``module`` (eval mode); raise on failure.

    ``input_sets`` maps a name to float32 images ``(M, C, H, W)``; each batch size ``b`` uses the
    first ``b`` images of each set (a set smaller than ``b`` is repeated to fill the batch).
    Returns the card's :class:`~modelcard.card.ParityReport`; raises :class:`ParityError`
    naming every output over tolerance and its max difference, or the number of top-1
    disagreements.
    """
    tolerance = TOLERANCE[precision]
    worst = dict.fromkeys(OUTPUTS, 0.0)
    agree = total = allowed = 0
    for images in input_sets.values():
        for b in batch_sizes:
            batch = np.ascontiguousarray(np.resize(images, (b, *images.shape[1:])), np.float32)
            expected = _run_torch(module, batch)
            got = dict(zip(OUTPUTS, session.run(list(OUTPUTS), {"image": batch}), strict=True))
            for name in OUTPUTS:
                if not np.isfinite(expected[name]).all():
                    raise ParityError(
                        f"the checkpoint's own {name} (in PyTorch) holds NaN or infinite values "
                        "on these inputs: its weights are broken (a run that diverged?), and "
                        "there is nothing correct to export"
                    )
                scale = max(float(np.abs(expected[name]).max()), float(np.finfo(np.float32).tiny))
                diff = float(np.abs(got[name].astype(np.float32) - expected[name]).max()) / scale
                worst[name] = float(np.maximum(worst[name], diff))  # NaN, once seen, stays
            ref_top1 = expected["logits"].argmax(1)
            same = got["logits"].argmax(1) == ref_top1
            agree += int(same.sum())
            total += b
            if precision != "float32":  # a near-tie may flip under float16 rounding
                top2 = np.sort(expected["logits"], axis=1)[:, -2:]
                near = (top2[:, 1] - top2[:, 0]) <= tolerance * np.abs(expected["logits"]).max()
                allowed += int((~same & near).sum())
    problems = [
        f"{name}: max relative difference {diff:.3g} > {tolerance:g}"
        for name, diff in worst.items()
        if not diff <= tolerance  # NaN fails too
    ]
    mismatches = total - agree - allowed
    if mismatches:
        problems.append(f"top-1 class differs on {mismatches} of {total} images")
    if problems:
        raise ParityError(
            f"the exported model does not match PyTorch ({precision}): " + "; ".join(problems)
        )
    return ParityReport(
        precision=precision,
        tolerance=tolerance,
        batch_sizes=list(batch_sizes),
        inputs=list(input_sets),
        max_relative_difference=worst,
        top1_agreement=agree / max(total, 1),
        top1_mismatches_allowed=allowed,
        images=total,
        passed=True,
    )
