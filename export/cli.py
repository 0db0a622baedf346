"""``smso-export``: a checkpoint written by smso-train -> a verified ONNX file with its model card.

    smso-export runs/x/best.pt                      # -> runs/x/model.onnx, 1x1-conv form
    smso-export runs/x/best.pt -o m.onnx --form covariance --opset 18
    smso-export runs/x/best.pt --form auto          # the SMSO form with the smaller modelled cost
    smso-export runs/x/best.pt --fp16               # backbone in float16, SMSO head in float32
    smso-export runs/x/best.pt --name leaves --version 2   # served as /v2/models/leaves

Exit status 0 on success, 2 for a user's mistake (missing or corrupt checkpoint, one with NaN
weights, a head ONNX cannot express, a bad option, a --data-root without the checkpoint's dataset,
an output that cannot or must not be written), 1 when the exported file fails its parity check
(no file is written then).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

import onnx
import onnxruntime as ort

from export.onnx_export import (
    DEFAULT_OPSET,
    ExportError,
    FormChoice,
    export_checkpoint,
    newest_opset,
)
from export.parity import ParityError
from training.cli import HelpFormatter, run_cli

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """``smso-export``'s parser."""
    parser = argparse.ArgumentParser(
        prog="smso-export",
        description=__doc__.splitlines()[0].split(": ", 1)[1],
        formatter_class=HelpFormatter,
    )
    parser.add_argument("checkpoint", type=Path, help="a checkpoint written by smso-train")
    parser.add_argument(
        "-o", "--output", type=Path, help="ONNX file (default: CHECKPOINT's folder / model.onnx)"
    )
    parser.add_argument(
        "--form",
        choices=get_args(FormChoice),
        default="conv",
        help="how the SMSO head is computed in the graph: 'conv', a 1x1 conv + l2 pool (about "
        "p*c*n multiply-adds per image, with n = h*w positions of the last feature map, c "
        "channels, p outputs); 'covariance', through the c x c covariance (about c*c*n + p*c*c); "
        "'auto', the one with fewer modelled multiply-adds at the trained input size (covariance "
        "where p*(n - c) >= n*c), recorded with both costs in the model card; other heads have "
        "one form and ignore it",
    )
    parser.add_argument(
        "--opset",
        type=int,
        default=DEFAULT_OPSET,
        help=f"ONNX opset version, {DEFAULT_OPSET} to {newest_opset()} (what onnxruntime loads)",
    )
    parser.add_argument(
        "--fp16",
        action="store_true",
        help="backbone in float16 (weights and compute; BatchNorm folded into the convolutions), "
        "head and classifier in float32 (its sums of squares can overflow float16), float32 "
        "input and outputs; for GPUs: on a CPU the float32 file is faster",
    )
    parser.add_argument(
        "--optimize",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="simplify the graph with onnxruntime's offline optimisation (float32 "
        "only: with --fp16 it would make the convolutions compute in "
        "float32)",
    )
    parser.add_argument(
        "--static-size",
        action="store_true",
        help="fix the input's height and width at the trained size (the batch stays dynamic): "
        "no shape arithmetic is left in the graph, so every node runs on CUDA (the server's "
        "CUDA graphs do not need it: its per-batch-size sessions fix every dimension); by "
        "default any size is accepted",
    )
    parser.add_argument(
        "--typicality",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fit the typicality reference (each served image's score and p-value; drift) on "
        "the checkpoint's validation split, when it is at hand, into the model card",
    )
    parser.add_argument(
        "--data-root",
        help="dataset folder for the parity check on real images "
        "(default: the one the checkpoint was trained on)",
    )
    parser.add_argument(
        "--name",
        help="the name the model is served under (smso-serve's "
        "/v2/models/NAME; letters, digits, _ . -), written into the model card "
        "(default: DATASET-BACKBONE-HEAD, e.g. image_folder-small_cnn-smso)",
    )
    parser.add_argument(
        "--version",
        help="the version it is served under (same characters; "
        "default: the first 12 hex digits of the checkpoint's sha256)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``smso-export``."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("export").setLevel(logging.INFO)
    args = build_parser().parse_args(argv)
    # CHECKPOINT's folder / model.onnx; for a CHECKPOINT that is a folder (even "." or "/", which
    # have no name to replace), the export says that it is not a checkpoint file
    output = args.output or args.checkpoint.parent / "model.onnx"

    def body() -> int:
        newest = newest_opset()
        if not DEFAULT_OPSET <= args.opset <= newest:
            raise ValueError(
                f"--opset must be from {DEFAULT_OPSET} (the exporter's minimum) to {newest} (the "
                f"newest that onnx {onnx.__version__} and onnxruntime {ort.__version__} both "
                f"load), got {args.opset}"
            )
        try:
            result = export_checkpoint(
                args.checkpoint,
                output,
                args.form,
                args.opset,
                args.fp16,
                args.optimize,
                args.data_root,
                name=args.name,
                version=args.version,
                dynamic_size=not args.static_size,
                typicality=args.typicality,
            )
        except (ParityError, ExportError) as error:
            print(f"smso-export: {error}; nothing was written", file=sys.stderr)
            return 1
        parity = result.parity
        diffs = ", ".join(f"{k} {v:.2g}" for k, v in parity.max_relative_difference.items())
        card = result.card
        print(
            f"wrote {result.path} ({result.size_bytes / 2**20:.2f} MiB), served as "
            f"{card.served.name!r} version {card.served.version!r}"
        )
        print(
            f"parity ({parity.precision}, batch sizes {parity.batch_sizes}, inputs "
            f"{'+'.join(parity.inputs)}): max relative difference {diffs}; top-1 agreement "
            f"{parity.top1_agreement:.0%}"
        )
        if card.metrics is not None and card.metrics.test_accuracy is not None:
            print(f"test accuracy in the card: {card.metrics.test_accuracy:.4f}")
        print(
            f"typicality: reference from {card.typicality.images} validation images"
            if card.typicality is not None
            else "typicality: none (see the warning above)"
        )
        return 0

    return run_cli("smso-export", body)  # UnsupportedHeadError is a ValueError: exit 2


if __name__ == "__main__":
    raise SystemExit(main())
