"""The k-th nearest training image as an out-of-distribution score, on the confirmation's sets.

Deep nearest neighbours (Sun et al., ICML 2022): with a gallery of the model's training images,
an image whose k-th nearest neighbour is far is unlike anything the model was trained on. Here
the gallery is the one ``smso-index`` builds (:mod:`gallery`): the embeddings standardised per
dimension and compared by their cosine, so the score is

    knn(x) = -similarity(x, its k-th nearest training image)      higher = less typical

with ``k`` = :data:`K`, fixed before any run at Sun et al.'s choice for CIFAR-10 (50 of
50,000 training images; 43,000 and 55,000 here). Other ``k`` are reported as exploratory.

It is evaluated on docs/results/typicality-confirmation.md's out-of-distribution sets, with
that page's metric and verdict rule: the held-out model (Shirt and Sneaker never seen) on the
held-out classes (near-OOD, the primary case, where the served score loses to max-softmax) and
on the typeset letters; the shipped model on the letters. ``knn`` is compared with the served
``typicality`` score and with max-softmax (``msp``) by the AUROC difference and DeLong's 95 %
interval (win, tie, loss). The images go through the model file as the service runs it
(:mod:`bench.lib.model_outputs`: PNG, the service's decoder, its onnxruntime session).

    python -m experiments.knn_ood                    # both models, ~5 minutes on 2 cores
    python -m experiments.knn_ood --quick            # 2,000 training images, 500 of each set

Results: a table on stdout and ``bench/results/knn-ood.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib import report
from bench.lib.model_outputs import Outputs, outputs
from experiments.auroc import compare, delong
from experiments.confirm_sets import glyphs
from experiments.typicality import separation
from experiments.typicality_confirm import Model, labelled_test_images
from gallery.build import BuildOptions, Rows, build
from gallery.search import load
from gallery.stamp import Stamp

K = 50
EXPLORATORY_K = (1, 10, 200, 1000)
METHODS = ("knn", "typicality", "msp")
HELD_OUT = Path("docs/results/records/typicality-heldout")
SHIPPED = Path("models/fashion-mnist-smso")


def training_images(model: Model) -> np.ndarray:
    """The images the model was trained on (its run's split, validation held out): uint8."""
    from training.datasets.fashion_mnist import TensorImages, fashion_mnist

    config = model.config
    train = fashion_mnist(
        None, None, None, config["val_size"], config["seed"], classes=config.get("classes")
    ).train
    assert isinstance(train, TensorImages)  # Fashion-MNIST's splits are held in memory
    return train.images.numpy()


def _outputs(model: Model, name: str, images: np.ndarray, cache: Path | None) -> Outputs:
    return outputs(model.path, name, len(images), lambda s, n: images[s : s + n], cache)


def knn_scores(gallery_outputs: Outputs, sets: dict[str, Outputs], ks: Sequence[int]) -> Any:
    """``{set: {k: (N,) score}}``: minus the similarity of the k-th nearest gallery item."""
    size = len(gallery_outputs.embeddings)
    zeros = np.zeros(size, np.int64)
    rows = Rows(
        [f"{i}" for i in range(size)],
        gallery_outputs.embeddings,
        gallery_outputs.top1,
        zeros,
        zeros,
    )
    scores: dict[str, dict[int, np.ndarray]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "gallery"
        options = BuildOptions(exact_below=size + 1)  # exact: the score of every neighbour
        build(folder, rows, Stamp("knn", "0", "0" * 64), (), options)
        gallery = load(folder)
        for name, out in sets.items():
            found = gallery.nearest(out.embeddings, max(ks), exact=True, threads=0)
            scores[name] = {k: -found.similarities[:, k - 1] for k in ks}
    return scores


def evaluate(model: Model, quick: bool, cache: Path | None) -> dict[str, Any]:
    """The three scores on each OOD set of ``model``, against its in-distribution test images."""
    rng = np.random.default_rng(0)
    train = training_images(model)
    test, labels = labelled_test_images(None)
    kept = np.isin(labels, model.classes)
    sets = {"test": test[kept], "glyphs": glyphs(6, seed=0)}
    if not kept.all():
        sets["held_out_classes"] = test[~kept]
    if quick:
        train = train[np.sort(rng.permutation(len(train))[:2000])]
        sets = {n: x[np.sort(rng.permutation(len(x))[:500])] for n, x in sets.items()}
    tag = "quick-" if quick else ""
    outs = {
        name: _outputs(model, f"{tag}{model.role}-{name}", x, cache) for name, x in sets.items()
    }
    ks = sorted({K, *EXPLORATORY_K} & set(range(1, len(train) + 1)))
    knn = knn_scores(_outputs(model, f"{tag}{model.role}-train", train, cache), outs, ks)

    def method(name: str, out: Outputs, set_name: str, k: int = K) -> np.ndarray:
        if name == "knn":
            return knn[set_name][k]
        if name == "msp":
            return -out.max_softmax.astype(np.float64)
        return out.typicality

    result: dict[str, Any] = {
        "model": str(model.path),
        "sha256": model.sha256(),
        "gallery_items": len(train),
        "k": K,
        "sets": {},
    }
    for set_name in sets:
        if set_name == "test":
            continue
        inside, outside = outs["test"], outs[set_name]
        positives = np.stack([method(m, outside, set_name) for m in METHODS])
        negatives = np.stack([method(m, inside, "test") for m in METHODS])
        aurocs, covariance = delong(positives, negatives)
        entry: dict[str, Any] = {
            "images": len(outside.embeddings),
            "methods": {m: separation(negatives[i], positives[i]) for i, m in enumerate(METHODS)},
            "knn_vs": {
                m: compare(aurocs, covariance, 0, i).to_dict() for i, m in enumerate(METHODS) if i
            },
            "exploratory_k": {
                str(k): separation(knn["test"][k], knn[set_name][k])["auroc"] for k in ks
            },
        }
        result["sets"][set_name] = entry
    return result


def table(results: list[dict[str, Any]]) -> str:
    header = ["model, set", "images", *METHODS, "knn vs typicality", "knn vs msp"]
    rows = []
    for result in results:
        for set_name, entry in result["sets"].items():
            cells = [f"{Path(result['model']).parent.name}, {set_name}", f"{entry['images']:,}"]
            cells += [f"{entry['methods'][m]['auroc']:.3f}" for m in METHODS]
            for other in ("typicality", "msp"):
                c = entry["knn_vs"][other]
                cells.append(
                    f"{c['verdict']} {c['difference']:+.3f} [{c['ci95'][0]:+.3f}, "
                    f"{c['ci95'][1]:+.3f}]"
                )
            rows.append(cells)
    return report.markdown_table(header, rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m experiments.knn_ood", description=__doc__.split("\n")[0]
    )
    p.add_argument("--held-out", type=Path, default=HELD_OUT, help="the held-out model's folder")
    p.add_argument("--shipped", type=Path, default=SHIPPED, help="the shipped model's folder")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--cache", type=Path, default=Path("bench/results/search-cache"))
    p.add_argument("--out", type=Path, default=Path("bench/results/knn-ood.json"))
    args = p.parse_args(argv)
    models = [Model.read("held_out", args.held_out), Model.read("shipped", args.shipped)]
    results = [evaluate(model, args.quick, args.cache) for model in models]
    print(table(results))
    for result in results:
        for set_name, entry in result["sets"].items():
            print(
                f"{Path(result['model']).parent.name}, {set_name}: AUROC by k "
                + json.dumps({k: round(v, 3) for k, v in entry["exploratory_k"].items()})
            )
    report.save(args.out, {"machine": report.machine(), "models": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
