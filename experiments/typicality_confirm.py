"""The typicality score, confirmed on sets it was not designed on.

The protocol, fixed before any run: ``docs/results/typicality-confirmation.md``.

Each model is a folder with ``model.onnx`` (from ``smso-export``) and the ``config.json`` of
its training run. Its file is served by ``smso-serve`` (a subprocess, as ``experiments.typicality``
does), and every image goes through the server as binary ``FP32`` infer requests asking for
``logits``, ``embedding``, ``typicality`` and ``typicality_p_value``: the score as served. The
backbone's averaged features, which the server does not answer, come from the same file run by
onnxruntime in this process (its logits checked against the served ones).

In-distribution: the test images of the classes the model was trained on. The sets:

* ``held_out_classes`` (near-OOD): the test images of the classes its training left out
  (``classes`` in its config; a model trained on all ten has none);
* ``glyphs`` (far-OOD): typeset letters (:func:`experiments.confirm_sets.glyphs`);
* covariate shift, reported apart: the in-distribution test images under each corruption and
  severity of :func:`experiments.confirm_sets.shift_sets`. Whether a score should flag these is
  not settled, so their comparisons say which score flags them more, not which wins.

Beside them, ``held_out_classes: NAME`` (kind ``by_class``) gives the near-OOD set one held-out
class at a time. It was added after the pre-registered run, as an exploratory reading of it:
it is not counted in the wins and losses.

Scores (higher = less typical), for each set against the in-distribution images::

    typicality            the served score (modelcard.typicality, 4 terms)
    msp                   -max_k softmax(l)_k
    energy                -log sum_k exp(l_k)
    mahalanobis           (z - mu)^T S^+ (z - mu)         mu, S of the validation embeddings
    mahalanobis_features  min_c (f - nu_c)^T Q_w (f - nu_c)
                          Lee et al. (2018) on the backbone's averaged features: the served
                          score's own fourth term alone (the card's nu_c and Q_w)

Per set and score: AUROC and FPR at 95 % TPR (OOD = positive), and for the served score against
each baseline the AUROC difference with DeLong's 95 % interval: ``win`` (above 0), ``loss``
(below) or ``tie``.

    make typicality-confirm                               # trains, exports, then runs this
    python -m experiments.typicality_confirm --held-out runs/typicality-heldout
    python -m experiments.typicality_confirm --held-out RUN --quick   # seconds: small sets
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib import RESULTS, ROOT, SHIPPED, report
from experiments.auroc import compare, delong
from experiments.confirm_sets import glyphs, shift_sets
from experiments.typicality import ALPHA, Card, Client, baselines, separation, server
from modelcard.typicality import Typicality

METHODS = ("typicality", "msp", "energy", "mahalanobis", "mahalanobis_features")
BASELINES = METHODS[1:]
OOD = ("held_out_classes", "glyphs")
#: The entries the pre-registration names as the confirmation's primary results: (model, set).
PRIMARY = (("held_out", "held_out_classes"), ("shipped", "glyphs"))


# --- the models and their images ----------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    """A model folder: its file, its training config, the classes it was trained on."""

    role: str  # "held_out" (trained on some classes) or "shipped"
    path: Path  # model.onnx
    config: dict[str, Any]

    @classmethod
    def read(cls, role: str, folder: Path) -> Model:
        path, config = folder / "model.onnx", folder / "config.json"
        for needed in (path, config):
            if not needed.is_file():
                raise SystemExit(
                    f"{needed} does not exist: a model folder holds model.onnx (smso-export "
                    "RUN/best.pt -o RUN/model.onnx) and its run's config.json"
                )
        return cls(role, path, json.loads(config.read_text()))

    @property
    def classes(self) -> list[int]:
        """The Fashion-MNIST labels the model was trained on (sorted)."""
        return sorted(self.config.get("classes") or range(10))

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def validation_images(model: Model, root: Path | None) -> np.ndarray:
    """The model's validation images, uint8 ``(n, 28, 28)``: the split its export fitted the
    typicality reference on (``training.datasets.fashion_mnist`` with the run's settings)."""
    from training.datasets.fashion_mnist import TensorImages, fashion_mnist

    config = model.config
    val = fashion_mnist(
        root, None, None, config["val_size"], config["seed"], classes=config.get("classes")
    ).val
    assert isinstance(val, TensorImages)  # Fashion-MNIST's splits are held in memory
    return val.images.numpy()


def labelled_test_images(root: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST's 10,000 test images (uint8) and labels (0-9)."""
    from training.datasets.fashion_mnist import DEFAULT_ROOT, load_arrays

    return load_arrays(root or DEFAULT_ROOT, "test")


def image_sets(
    model: Model, test: np.ndarray, labels: np.ndarray, args: argparse.Namespace
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``({"test": ...}, OOD sets, shift sets)`` of uint8 images, and in the first the
    in-distribution labels as the model numbers them (``test_labels``) and the Fashion-MNIST
    labels of the ``held_out_classes`` images (``held_out_labels``)."""
    kept = np.isin(labels, model.classes)
    test_id = test[kept]
    ids = {"test": test_id, "test_labels": np.searchsorted(model.classes, labels[kept])}
    ood = {"glyphs": glyphs(args.glyphs_per_letter, seed=0)}
    if not kept.all():
        ood = {"held_out_classes": test[~kept]} | ood
        ids["held_out_labels"] = labels[~kept]
    if args.quick:  # a few hundred of each, drawn at random
        rng = np.random.default_rng(0)
        pick = np.sort(rng.permutation(len(test_id))[: args.set_size])
        ids |= {"test": test_id[pick], "test_labels": ids["test_labels"][pick]}
        for name, images in ood.items():
            pick = np.sort(rng.permutation(len(images))[: args.set_size])
            ood[name] = images[pick]
            if name == "held_out_classes":
                ids["held_out_labels"] = ids["held_out_labels"][pick]
    shift = shift_sets(ids["test"], seed=0)
    return ids, ood, shift


# --- scoring ------------------------------------------------------------------------------------


class Scorer:
    """One model's served outputs, with its features from the same file in this process."""

    def __init__(self, client: Client, model: Model, batch: int) -> None:
        import onnxruntime

        if client.source != "served":
            raise SystemExit(
                f"{model.path} does not compute the typicality score in its graph: export it "
                "again with smso-export (without --no-typicality)"
            )
        self.client, self.batch = client, batch
        self.session = onnxruntime.InferenceSession(
            str(model.path), providers=["CPUExecutionProvider"]
        )
        self.typicality = Typicality.from_card(client.card.raw["typicality"])
        if not self.typicality.uses_features:
            raise SystemExit(f"{model.path}'s typicality reference has no features term")
        self.logit_gap = 0.0  # the largest |served - in-process| logit seen

    def outputs(self, images: np.ndarray) -> dict[str, np.ndarray]:
        """``logits``, ``embedding``, ``typicality``, ``typicality_p_value`` (served) and
        ``features`` (in process) of uint8 ``images`` ``(N, 28, 28)``."""
        out = self.client.infer(images, self.batch)
        tensor = self.client.card.preprocess(images)
        parts = [
            self.session.run(["logits", "features"], {"image": tensor[i : i + self.batch]})
            for i in range(0, len(tensor), self.batch)
        ]
        local_logits = np.concatenate([p[0] for p in parts]).astype(np.float64)
        self.logit_gap = max(self.logit_gap, float(np.abs(local_logits - out["logits"]).max()))
        out["features"] = np.concatenate([p[1] for p in parts]).astype(np.float64)
        return out

    def scores(self, out: dict[str, np.ndarray], maha: tuple[np.ndarray, np.ndarray]) -> Any:
        """Every method's score of one set's outputs: ``{method: (N,)}``."""
        scores = baselines(out, maha)
        terms = self.typicality.terms(out["logits"], out["embedding"], out["features"])
        scores["mahalanobis_features"] = terms[:, 3]  # log m_feat: the same order as m_feat
        return scores


def set_result(id_scores: dict[str, np.ndarray], scores: dict[str, np.ndarray]) -> dict[str, Any]:
    """AUROC and FPR at 95 % TPR of each method on one set, and the served score against each
    baseline (DeLong)."""
    methods = {m: separation(id_scores[m], scores[m]) for m in METHODS}
    aurocs, covariance = delong(
        np.stack([scores[m] for m in METHODS]), np.stack([id_scores[m] for m in METHODS])
    )
    versus = {b: compare(aurocs, covariance, 0, METHODS.index(b)).to_dict() for b in BASELINES}
    return {"methods": methods, "versus": versus}


def by_class(
    id_scores: dict[str, np.ndarray],
    scores: dict[str, np.ndarray],
    out: dict[str, np.ndarray],
    labels: np.ndarray,
    names: list[str],
) -> dict[str, dict[str, Any]]:
    """The near-OOD set one held-out class at a time (kind ``by_class``, exploratory: added
    after the pre-registered run): ``{"held_out_classes: NAME": result}``."""
    parts = {}
    for label in np.unique(labels):
        mask = labels == label
        parts[f"held_out_classes: {names[label]}"] = {
            "kind": "by_class",
            "images": int(mask.sum()),
            "share_p_below_0.01": float((out["typicality_p_value"][mask] < ALPHA).mean()),
        } | set_result(id_scores, {m: s[mask] for m, s in scores.items()})
    return parts


def evaluate(model: Model, args: argparse.Namespace) -> dict[str, Any]:
    """Every set's result for one model (see the module docstring)."""
    test, labels = labelled_test_images(args.data_root)
    ids, ood, shift = image_sets(model, test, labels, args)
    val = validation_images(model, args.data_root)
    card = Card.read(model.path)
    every = Card.read(SHIPPED).raw["classes"]  # Fashion-MNIST's ten names (no torch here)
    names = [every[c] for c in model.classes]
    if card.raw.get("classes") != names:
        raise SystemExit(
            f"{model.path} names classes {card.raw.get('classes')}, its config.json trains "
            f"{names}: give the folder that holds both of one run"
        )
    with (
        server(model=model.path) as base,
        contextlib.closing(Client(base, card)) as client,
    ):
        scorer = Scorer(client, model, args.batch)
        val_embedding = scorer.outputs(val)["embedding"]
        maha = (val_embedding.mean(axis=0), np.linalg.pinv(np.cov(val_embedding, rowvar=False)))
        reference = scorer.outputs(ids["test"])
        id_scores = scorer.scores(reference, maha)
        numpy_gap = float(
            np.abs(
                scorer.typicality.score(
                    reference["logits"], reference["embedding"], reference["features"]
                )
                - reference["typicality"]
            ).max()
        )
        sets: dict[str, dict[str, Any]] = {}
        for kind, group in (("ood", ood), ("shift", shift)):
            for name, images in group.items():
                out = scorer.outputs(images)
                scores = scorer.scores(out, maha)
                sets[name] = {
                    "kind": kind,
                    "images": len(images),
                    "share_p_below_0.01": float((out["typicality_p_value"] < ALPHA).mean()),
                } | set_result(id_scores, scores)
                if kind == "shift":  # the same images, corrupted: their labels still hold
                    correct = out["logits"].argmax(1) == ids["test_labels"]
                    sets[name]["accuracy"] = float(correct.mean())
                if name == "held_out_classes":
                    sets |= by_class(id_scores, scores, out, ids["held_out_labels"], every)
        logit_gap = scorer.logit_gap
    return {
        "model": str(model.path),
        "sha256": model.sha256(),
        "classes": model.classes,
        "class_names": names,
        "validation_images": len(val),
        "test_images": len(ids["test"]),
        "test_accuracy": float((reference["logits"].argmax(1) == ids["test_labels"]).mean()),
        "test_share_p_below_0.01": float((reference["typicality_p_value"] < ALPHA).mean()),
        "served_vs_in_process_logits_max_difference": logit_gap,
        "served_vs_numpy_score_max_difference": numpy_gap,
        "sets": sets,
    }


# --- the report ---------------------------------------------------------------------------------


def tally(result: dict[str, Any], kind: str = "ood") -> dict[str, dict[str, int]]:
    """Wins, losses and ties of the served score against each baseline over one model's sets of
    ``kind``."""
    counts = {b: {"win": 0, "loss": 0, "tie": 0} for b in BASELINES}
    for entry in result["sets"].values():
        if entry["kind"] == kind:
            for b in BASELINES:
                counts[b][entry["versus"][b]["verdict"]] += 1
    return counts


SHORT = {"win": "W", "loss": "L", "tie": "T"}
SUFFIX = {"shift": " (shift)", "by_class": " (exploratory)"}


def table(results: dict[str, Any]) -> str:
    """Markdown: per model, a row per set, each method's AUROC (FPR95), then the served score's
    verdict against each baseline (OOD and by class: W/L/T; shift: which flags more, +/-/=)."""
    lines = []
    for role, result in results["models"].items():
        lines.append(
            f"\n**{role}** ({Path(result['model']).name}, classes {result['classes']}): test "
            f"accuracy {result['test_accuracy']:.4f} on {result['test_images']:,} images, "
            f"p < 0.01 for {result['test_share_p_below_0.01']:.2%} of them\n"
        )
        header = ["set", "images", *(f"{m} AUROC (FPR95)" for m in METHODS)]
        header += [f"vs {b}" for b in BASELINES] + ["p < 0.01", "accuracy"]
        rows = []
        for name, entry in result["sets"].items():
            methods = entry["methods"]
            marks = SHORT if entry["kind"] != "shift" else {"win": "+", "loss": "-", "tie": "="}
            mark = "**" if (role, name) in PRIMARY else ""
            rows.append(
                [
                    f"{mark}{name}{mark}" + SUFFIX.get(entry["kind"], ""),
                    f"{entry['images']:,}",
                    *(
                        f"{methods[m]['auroc']:.3f} ({methods[m]['fpr_at_95_tpr']:.3f})"
                        for m in METHODS
                    ),
                    *(
                        f"{marks[entry['versus'][b]['verdict']]} "
                        f"{entry['versus'][b]['difference']:+.3f}"
                        for b in BASELINES
                    ),
                    f"{entry['share_p_below_0.01']:.1%}",
                    f"{entry['accuracy']:.4f}" if "accuracy" in entry else "-",
                ]
            )
        lines.append(report.markdown_table(header, rows))
        counts = tally(result)
        lines.append(
            "\nOOD sets, served score against each baseline (win/loss/tie, DeLong 95 %): "
            + "; ".join(f"{b} {c['win']}/{c['loss']}/{c['tie']}" for b, c in counts.items())
        )
    return "\n".join(lines)


def commit() -> str | None:
    """The checkout's commit (``-dirty`` when files differ from it), or None outside git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add(
        "--held-out",
        type=Path,
        help="the run folder of the model trained without some classes (model.onnx, "
        "config.json): the near-OOD set",
    )
    add(
        "--shipped",
        type=Path,
        default=SHIPPED.parent,
        help="the shipped model's folder (default: %(default)s)",
    )
    add("--no-shipped", action="store_true", help="evaluate the --held-out model only")
    add("--data-root", type=Path, help="Fashion-MNIST's folder (default: Debian's)")
    add("--glyphs-per-letter", type=int, default=6, help="draws of each letter in each face")
    add("--batch", type=int, default=64, help="images per infer request")
    add("--quick", action="store_true", help="a seconds-long run with small sets (tests)")
    add("--set-size", type=int, default=256, help="--quick: images per set")
    add(
        "--out",
        type=Path,
        default=RESULTS / "typicality-confirm.json",
        help="where to write the JSON (default: %(default)s)",
    )
    add("--markdown", type=Path, help="also write the printed tables to this file")
    args = parser.parse_args(argv)
    if args.held_out is None and args.no_shipped:
        parser.error("nothing to evaluate: give --held-out, or leave out --no-shipped")
    if args.quick:
        args.glyphs_per_letter = 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    models = []
    if args.held_out is not None:
        models.append(Model.read("held_out", args.held_out))
    if not args.no_shipped:
        models.append(Model.read("shipped", args.shipped))
    results: dict[str, Any] = {
        "machine": report.machine(),
        "commit": commit(),
        "quick": args.quick,
        "primary": [list(entry) for entry in PRIMARY],
        "models": {model.role: evaluate(model, args) for model in models},
    }
    results["wins_losses_ties"] = {role: tally(r) for role, r in results["models"].items()}
    results["seconds"] = time.perf_counter() - start
    text = table(results)
    print(text, end="\n\n")
    if args.markdown is not None:
        args.markdown.write_text(text.lstrip("\n") + "\n")
    report.save(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
