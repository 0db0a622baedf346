"""The paper's figures as PNG files (matplotlib), from runs and checkpoints.

``smso-figure fig3 RUN [RUN ...]``  training (dashed) and validation (solid) loss per epoch, from
                                    each run's ``metrics.jsonl`` (paper Fig. 3);
``smso-figure fig4 RESULTS``        test accuracy against p (log scale) from the ``fig4`` rows in a
                                    ``results.jsonl`` of ``smso-experiment`` (paper Fig. 4);
``smso-figure fig2 CHECKPOINT``     histograms of (a) the head's input features along their first
                                    two principal components, (b) z after PV, (c) the final
                                    representation z'', and a Shapiro-Wilk test of z'' (Fig. 2,
                                    Sec. 3.4), with the per-dimension mean and standard deviation
                                    of z' (before gamma and beta); the numbers go to a JSON file
                                    beside the PNG.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from scipy import stats
from torch.utils.data import DataLoader

from training.cli import positive_int, run_cli
from training.evaluate import load_with_splits
from training.heads.smso import SMSOPooling
from training.json_lines import holds_record, read_json_lines
from training.model import SecondOrderNet
from training.outputs import Replaceable, check_output_file

__all__ = ["fig2", "fig3", "fig4", "main"]


def _read_metrics(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl" if run.is_dir() else run
    if not path.is_file():
        raise FileNotFoundError(f"expected a metrics.jsonl at {path}")
    metrics = read_json_lines(path, required=("epoch", "train_loss", "val_loss"))
    if not metrics:
        raise ValueError(f"{path} holds no epochs yet")
    return metrics


def fig3(runs: Sequence[Path], out: Path, labels: Sequence[str] | None = None) -> Path:
    """Training (dashed) and validation (solid) loss against the epoch, one colour per run."""
    if labels and len(labels) != len(runs):
        raise ValueError(f"--labels gives {len(labels)} labels for {len(runs)} runs: one per run")
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, run in enumerate(runs):
        metrics = _read_metrics(run)
        epochs = [m["epoch"] for m in metrics]
        label = labels[i] if labels else run.name
        (line,) = ax.plot(epochs, [m["val_loss"] for m in metrics], label=f"{label} (val)")
        ax.plot(
            epochs,
            [m["train_loss"] for m in metrics],
            "--",
            color=line.get_color(),
            label=f"{label} (train)",
        )
    ax.set(xlabel="epoch", ylabel="loss", title="Training and validation loss")
    ax.legend(fontsize="small")
    return _save(fig, out)


def fig4(results: Path, out: Path) -> Path:
    """Test accuracy against p (log2 axis), one curve per dataset, from ``fig4`` result lines."""
    if not results.is_file():
        raise FileNotFoundError(f"expected smso-experiment's results.jsonl at {results}")
    points: dict[str, dict[int, float]] = {}
    for r in read_json_lines(results, required=("table",)):
        if r["table"] != "fig4":
            continue
        missing = [key for key in ("dataset", "feature_dim", "test_accuracy") if key not in r]
        if missing:
            raise ValueError(f"{results}: a fig4 result has no {', '.join(missing)}")
        if r["test_accuracy"] is not None:
            points.setdefault(r["dataset"], {})[r["feature_dim"]] = 100 * r["test_accuracy"]
    if not points:
        raise ValueError(f"{results} holds no fig4 results; run `smso-experiment run fig4` first")
    fig, ax = plt.subplots(figsize=(6, 4))
    for dataset, acc in sorted(points.items()):
        ps = sorted(acc)
        ax.plot(ps, [acc[p] for p in ps], "o-", label=dataset)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="p (PV dimension)", ylabel="top-1 accuracy (%)", title="Influence of p")
    ax.legend()
    return _save(fig, out)


@torch.no_grad()
def collect_stages(model: SecondOrderNet, loader: DataLoader, limit: int) -> dict[str, np.ndarray]:
    """Per-position head inputs ``(N n, c)``, PV outputs ``z`` ``(N, p)``, the standardised
    ``z'`` before gamma and beta ``(N, p)`` and the final ``z''`` ``(N, p)``."""
    head = model.head
    if not isinstance(head, SMSOPooling):
        raise ValueError("fig2 needs a checkpoint with the SMSO head")
    feats, zs, standardized, finals, seen = [], [], [], [], 0
    for images, _ in loader:
        x = model.forward_features(images)  # (B, c, h, w)
        feats.append(x.flatten(2).transpose(1, 2).reshape(-1, x.shape[1]))
        z = head.vectorize(x)  # (B, p)
        zs.append(z)
        standardized.append(head.standardize(z, x.shape[-2] * x.shape[-1]))
        finals.append(head(x))
        seen += images.shape[0]
        if seen >= limit:
            break
    return {
        "features": torch.cat(feats).numpy(),
        "z": torch.cat(zs)[:limit].numpy(),
        "z_prime": torch.cat(standardized)[:limit].numpy(),
        "final": torch.cat(finals)[:limit].numpy(),
    }


def fig2(stages: dict[str, np.ndarray], out: Path, dims: int = 4, seed: int = 0) -> dict[str, Any]:
    """Draw the three histograms; return the Shapiro-Wilk results of the final representation."""
    rng = np.random.default_rng(seed)
    feats = stages["features"] - stages["features"].mean(0)
    _, _, vt = np.linalg.svd(feats[: min(len(feats), 20000)], full_matrices=False)
    pcs = feats @ vt[:2].T  # (N n, 2)
    picked = np.sort(
        rng.choice(stages["z"].shape[1], size=min(dims, stages["z"].shape[1]), replace=False)
    )
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].hist2d(pcs[:, 0], pcs[:, 1], bins=60, cmap="viridis")
    axes[0].set(title="(a) features, first two PCs", xlabel="PC 1", ylabel="PC 2")
    for ax, key, title in ((axes[1], "z", "(b) z after PV"), (axes[2], "final", "(c) final z''")):
        ax.hist(
            [stages[key][:, j] for j in picked],
            bins=40,
            stacked=True,
            label=[f"dim {j}" for j in picked],
        )
        ax.set(title=title)
        ax.legend(fontsize="x-small")
    _save(fig, out)
    final = stages["final"][:5000]
    varying = _varying(final)  # Shapiro-Wilk and skewness are undefined on a constant
    pvalues = np.array([stats.shapiro(final[:, j]).pvalue for j in varying])
    one = int(rng.choice(varying)) if len(varying) else None
    return {
        "images": int(final.shape[0]),
        "dims_plotted": picked.tolist(),
        "constant_dims": int(final.shape[1] - len(varying)),
        "shapiro_wilk_p_one_dim": {
            "dim": one,
            "p": None if one is None else float(pvalues[varying.tolist().index(one)]),
        },
        "shapiro_wilk_p_median": float(np.median(pvalues)) if len(varying) else None,
        "fraction_not_rejected_at_0.05": float((pvalues > 0.05).mean()) if len(varying) else None,
        "skewness_z_median": _median_skew(stages["z"]),
        "skewness_final_median": _median_skew(stages["final"]),
        # what Sigma sets: z' is N(0, 1) per dimension when the features are i.i.d. Gaussian
        "z_prime_mean": _spread(stages["z_prime"].mean(axis=0)),
        "z_prime_std": _spread(stages["z_prime"].std(axis=0)),
    }


def _varying(x: np.ndarray) -> np.ndarray:
    """Indices of the columns of ``x`` that are not (numerically) constant."""
    return np.flatnonzero(x.std(axis=0) > 1e-6 * (np.abs(x.mean(axis=0)) + 1.0))


def _spread(values: np.ndarray) -> dict[str, float]:
    """Median, smallest and largest of per-dimension values."""
    return {
        "median": float(np.median(values)),
        "min": float(values.min()),
        "max": float(values.max()),
    }


def _median_skew(x: np.ndarray) -> float | None:
    cols = _varying(x)
    return float(np.median(stats.skew(x[:, cols], axis=0))) if len(cols) else None


def _save(fig: plt.Figure, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def fig2_from_checkpoint(
    checkpoint: Path,
    out: Path,
    split: str = "test",
    data_root: str | None = None,
    limit: int = 2000,
) -> dict[str, Any]:
    """Fig. 2 for a checkpoint written by smso-train; writes ``out`` and ``out.json``."""
    model, _, splits = load_with_splits(checkpoint, data_root)
    loader = DataLoader(getattr(splits, split), batch_size=250, shuffle=False)
    summary = fig2(collect_stages(model, loader, limit), out)
    summary["checkpoint"], summary["split"] = str(checkpoint), split
    out.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _check_out(out: Path, inputs: Sequence[Path], numbers: bool) -> None:
    """Raise ``ValueError`` before any work when ``--out`` is not an image file this can write:
    a folder, no known image ending, one of the ``inputs``, or (``numbers``: fig2) a ``.json``
    beside it that holds something else than an earlier fig2's numbers."""
    check_output_file(out, "--out", keep=tuple(inputs))
    formats = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    if out.suffix.lower().lstrip(".") not in formats:
        raise ValueError(
            f"--out {out}: give an image file name ending in one of "
            f"{', '.join('.' + f for f in sorted(formats))} (.png is usual)"
        )
    if numbers:
        earlier = Replaceable(
            lambda path: holds_record(path, ("images", "checkpoint", "split")),
            "an earlier fig2's numbers",
            "give another --out",
        )
        beside = out.with_suffix(".json")
        check_output_file(beside, "the numbers' file (beside --out)", tuple(inputs), earlier)


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``smso-figure``."""
    parser = argparse.ArgumentParser(prog="smso-figure", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="figure", required=True)
    p3 = sub.add_parser("fig3", help="loss curves from runs' metrics.jsonl")
    p3.add_argument("runs", nargs="+", type=Path)
    p3.add_argument("--labels", nargs="*")
    p4 = sub.add_parser("fig4", help="accuracy against p from smso-experiment's results.jsonl")
    p4.add_argument("results", type=Path)
    p2 = sub.add_parser("fig2", help="histograms and Shapiro-Wilk test of an SMSO checkpoint")
    p2.add_argument("checkpoint", type=Path)
    p2.add_argument("--split", default="test", choices=("train", "val", "test"))
    p2.add_argument("--data-root")
    p2.add_argument("--images", type=positive_int, default=2000, help="images of the split to use")
    for p in (p3, p4):
        p.add_argument("--out", type=Path, required=True, help="PNG file to write")
    p2.add_argument(
        "--out", type=Path, required=True, help="PNG file to write; its numbers go beside it, .json"
    )
    args = parser.parse_args(argv)

    def body() -> int:
        if args.figure == "fig3":
            inputs = [r / "metrics.jsonl" if r.is_dir() else r for r in args.runs]
        else:
            inputs = [args.results if args.figure == "fig4" else args.checkpoint]
        _check_out(args.out, inputs, numbers=args.figure == "fig2")
        if args.figure == "fig3":
            fig3(args.runs, args.out, args.labels)
        elif args.figure == "fig4":
            fig4(args.results, args.out)
        else:
            summary = fig2_from_checkpoint(
                args.checkpoint, args.out, args.split, args.data_root, args.images
            )
            print(json.dumps(summary, indent=2))
        print(f"wrote {args.out}")
        return 0

    return run_cli("smso-figure", body)


if __name__ == "__main__":
    sys.exit(main())
