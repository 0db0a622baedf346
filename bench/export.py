"""onnxruntime (CPU provider) against PyTorch eager on the same weights and inputs.

For each model: export with ``smso-export``'s pipeline (parity checked as always), then time one
forward call of a batch in PyTorch eager (``torch.inference_mode``, float32) and in onnxruntime
on the CPU, at batch 1 and at the other batch sizes given; the "best batch" of each engine is the
one with the most images per second. Models: the shipped Fashion-MNIST SMSO model, and ResNet-50
SMSO at 448 px with p = 64 and p = 2,048 (random weights: speed does not depend on them), each in
the 1x1-conv and the covariance form of the head.

    python -m bench.export                        # everything (about 10 minutes on 2 cores)
    python -m bench.export --quick                # the shipped model only, fewer repeats

Prints a markdown table and writes ``bench/results/export.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.lib import torch_device  # before torch (see bench/heads.py)

# isort: split
import numpy as np
import onnxruntime as ort
import torch

from bench.lib import RESULTS, ROOT, report
from bench.lib.timing import TimingPolicy, measure_time
from export.graph import ExportForm, exportable
from export.onnx_export import export_checkpoint
from training.checkpoint import load_model, save_checkpoint
from training.model import ModelConfig, build_model

SHIPPED = ROOT / "models" / "fashion-mnist-smso" / "model.pt"
log = logging.getLogger("bench.export")


@dataclasses.dataclass(frozen=True)
class Case:
    """One model to export and time."""

    name: str
    form: ExportForm
    p: int
    side: int
    batches: tuple[int, ...]
    checkpoint: Path | None = None  # None: ResNet-50 SMSO with random weights


def cases(quick: bool) -> list[Case]:
    shipped = [
        Case("fashion-mnist (shipped)", form, 64, 28, (1, 32, 128, 512), SHIPPED)
        for form in ("conv", "covariance")
    ]
    if quick:
        return shipped[:1]
    resnet = [
        Case("resnet50 448 px", form, p, 448, (1, 4, 8))
        for p in (64, 2048)
        for form in ("conv", "covariance")
    ]
    return shipped + resnet


def _checkpoint(case: Case, workdir: Path) -> Path:
    if case.checkpoint is not None:
        return case.checkpoint
    torch.manual_seed(0)
    config = ModelConfig(47, backbone="resnet50", head="smso", head_options={"dim": case.p})
    return save_checkpoint(workdir / f"resnet50-p{case.p}.pt", build_model(config).eval())


def measure(case: Case, workdir: Path, policy: TimingPolicy) -> list[dict[str, Any]]:
    checkpoint = _checkpoint(case, workdir)
    onnx_path = workdir / f"{case.name.split()[0]}-{case.form}-{case.p}.onnx"
    start = time.perf_counter()
    # the model alone: no typicality score in the graph (its reference would need the dataset)
    result = export_checkpoint(checkpoint, onnx_path, form=case.form, typicality=False)
    export_s = time.perf_counter() - start
    model, _ = load_model(checkpoint)
    module = exportable(model, case.form)  # what was traced: PyTorch runs the same head form
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    channels = result.card.input.channels
    rows = []
    for batch in case.batches:
        images = torch.randn(batch, channels, case.side, case.side)
        feed = {"image": images.numpy()}

        def run_torch(images: torch.Tensor = images) -> None:
            with torch.inference_mode():
                module(images)

        def run_ort(feed: dict[str, np.ndarray] = feed) -> None:
            session.run(None, feed)

        torch_ms = measure_time(run_torch, policy).median_ms
        ort_ms = measure_time(run_ort, policy).median_ms
        log.info(
            "%s %s p=%d batch %d: torch %.1f ms, onnxruntime %.1f ms",
            case.name,
            case.form,
            case.p,
            batch,
            torch_ms,
            ort_ms,
        )
        rows.append(
            {
                "model": case.name,
                "form": case.form,
                "p": case.p,
                "side": case.side,
                "batch": batch,
                "torch_ms": torch_ms,
                "onnxruntime_ms": ort_ms,
                "speedup": torch_ms / ort_ms,
                "torch_images_per_second": 1e3 * batch / torch_ms,
                "onnxruntime_images_per_second": 1e3 * batch / ort_ms,
                "export_seconds": export_s,
                "onnx_bytes": result.size_bytes,
                "parity_max_relative_difference": result.parity.max_relative_difference,
            }
        )
    return rows


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and form: batch 1 and each engine's best batch, and their speed ratios."""
    out = []
    keys = sorted({(r["model"], r["form"], r["p"]) for r in rows}, key=str)
    for model, form, p in keys:
        mine = [r for r in rows if (r["model"], r["form"], r["p"]) == (model, form, p)]
        one = next(r for r in mine if r["batch"] == 1)
        best_t = max(mine, key=lambda r: r["torch_images_per_second"])
        best_o = max(mine, key=lambda r: r["onnxruntime_images_per_second"])
        out.append(
            {
                "model": model,
                "form": form,
                "p": p,
                "batch1_speedup": one["speedup"],
                "best_batch_torch": best_t["batch"],
                "best_batch_onnxruntime": best_o["batch"],
                "best_speedup": best_o["onnxruntime_images_per_second"]
                / best_t["torch_images_per_second"],
            }
        )
    return out


def form_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """onnxruntime time of the covariance form over the conv form, per model, p and batch."""
    out = []
    for r in rows:
        if r["form"] != "conv":
            continue
        twin = [
            c
            for c in rows
            if c["form"] == "covariance"
            and (c["model"], c["p"], c["batch"]) == (r["model"], r["p"], r["batch"])
        ]
        if twin:
            out.append(
                {
                    "model": r["model"],
                    "p": r["p"],
                    "batch": r["batch"],
                    "covariance_over_conv": twin[0]["onnxruntime_ms"] / r["onnxruntime_ms"],
                }
            )
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the shipped model only")
    parser.add_argument("--repeats", type=int, default=20, help="most timed calls per point")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds per point")
    parser.add_argument("--json", type=Path, default=RESULTS / "export.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    log.setLevel(logging.INFO)  # progress; the exporter's own notes (and onnxscript's) stay quiet
    logging.getLogger("export").setLevel(logging.ERROR)
    args = parse_args(argv)
    policy = TimingPolicy(max_repeats=args.repeats, budget_s=args.budget)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        for case in cases(args.quick):
            rows += measure(case, Path(tmp), policy)
    table = [
        [
            r["model"],
            r["form"],
            str(r["p"]),
            str(r["batch"]),
            report.format_ms(r["torch_ms"]),
            report.format_ms(r["onnxruntime_ms"]),
            f"{r['onnxruntime_images_per_second']:.1f}",
            f"{r['speedup']:.2f}x",
        ]
        for r in rows
    ]
    header = [
        "model",
        "form",
        "p",
        "batch",
        "torch ms",
        "onnxruntime ms",
        "ORT images/s",
        "ORT speedup",
    ]
    print(report.markdown_table(header, table))
    best = summary(rows)
    print()
    print(
        report.markdown_table(
            [
                "model",
                "form",
                "p",
                "batch 1 speedup",
                "best batch (torch / ORT)",
                "best-batch speedup",
            ],
            [
                [
                    s["model"],
                    s["form"],
                    str(s["p"]),
                    f"{s['batch1_speedup']:.2f}x",
                    f"{s['best_batch_torch']} / {s['best_batch_onnxruntime']}",
                    f"{s['best_speedup']:.2f}x",
                ]
                for s in best
            ],
        )
    )
    forms = form_ratios(rows)
    if forms:
        print()
        print(
            report.markdown_table(
                ["model", "p", "batch", "ORT covariance / conv time"],
                [
                    [f["model"], str(f["p"]), str(f["batch"]), f"{f['covariance_over_conv']:.2f}x"]
                    for f in forms
                ],
            )
        )
    print(
        f"\nExpectation: onnxruntime at least 1.5x PyTorch eager on this CPU "
        f"({torch.get_num_threads()} threads)."
    )
    payload = {
        "machine": torch_device.machine_info(torch.device("cpu")),
        "settings": vars(args),
        "results": rows,
        "summary": best,
        "forms": forms,
    }
    report.save(args.json, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
