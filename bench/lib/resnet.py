"""ResNet-50 (or another ResNet) SMSO, p = 2,048, with random weights, exported to ONNX: a model
the size of those a GPU serves (speed does not depend on the weights).

Exporting needs torch and the training code: they are imported by the functions that export,
so that a serving benchmark imports this module without them.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: An export's preset by image side: ``image_folder`` (224 px, resize 256) or ``dtd`` (448 px,
#: resize 512), both with ImageNet's mean and std.
PRESETS = {224: "image_folder", 448: "dtd"}


def resnet_model(
    workdir: Path,
    name: str = "resnet50",
    preset: str = "dtd",
    classes: int = 47,
    form: str = "conv",
    fp16: bool = False,
    backbone: str = "resnet50",
) -> Path:
    """ResNet SMSO (``backbone``: ResNet-50 unless told), p = 2,048, seed 0, at ``preset``'s
    size, exported to ``workdir/<name>.onnx`` in SMSO ``form`` (parity checked)."""
    import torch

    from export.onnx_export import export_checkpoint
    from training.checkpoint import save_checkpoint
    from training.datasets.presets import PRESETS as TRAINING_PRESETS
    from training.model import ModelConfig, build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(classes, backbone, "smso", {"dim": 2048})).eval()
    checkpoint = save_checkpoint(
        workdir / f"{name}.pt",
        model,
        preset=TRAINING_PRESETS[preset].to_dict(),
        classes=[f"class{k}" for k in range(classes)],
    )
    return export_checkpoint(
        checkpoint,
        workdir / f"{name}.onnx",
        form=form,  # type: ignore[arg-type]
        fp16=fp16,
        batch_sizes=(1, 2),
    ).path


def _export(workdir: str, name: str, form: str, fp16: bool, side: int) -> tuple[str, float]:
    """One export of 1,000 classes in a process of its own (a third of the cores' threads)."""
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 3))
    start = time.perf_counter()
    path = resnet_model(Path(workdir), name, PRESETS[side], 1000, form, fp16)
    return str(path), time.perf_counter() - start


def export_all(workdir: Path, exports: Mapping[str, tuple[str, bool, int]]) -> dict[str, Any]:
    """``exports`` (name -> SMSO form, float16, image side) as ``workdir/<name>.onnx``, those not
    there yet in parallel processes: ``{"paths": name -> path, "export_s": name -> seconds}``."""
    paths = {name: str(workdir / f"{name}.onnx") for name in exports}
    missing = [name for name in exports if not Path(paths[name]).exists()]
    seconds: dict[str, float] = {}
    if missing:
        spawn = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(len(missing), mp_context=spawn) as pool:
            jobs = {
                name: pool.submit(_export, str(workdir), name, *exports[name]) for name in missing
            }
            for name, job in jobs.items():
                paths[name], seconds[name] = job.result()
    return {"paths": paths, "export_s": seconds}
