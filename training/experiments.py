"""The paper's experiments as named rows: one command per table row, with the paper's number.

``smso-experiment list`` prints every row; ``smso-experiment run TABLE ROW --dataset D
--data-root PATH`` trains and tests one row with the paper's recipe and appends its result to
``<out>/results.jsonl``; ``smso-experiment report TABLE --out DIR`` renders the measured
accuracies beside the paper's as a markdown table. Figures live in ``training.figures``.

Tables (top-1 %, datasets DTD / MIT-Indoor / MINC-2500 / CUB-200-2011):
    table1  VGG-D backbone: first-order, BP, MPN, DeepO2P, CBP-TS, CBP-RM, LRBP, SMSO p=64, 2048
            (LRBP starts from the BP row's best.pt, as the paper's did: run BP first)
    table2  ResNet-50 backbone: first-order, BP (c = 256, upper triangle: 32,896-d, the paper's
            dimension), MPN, CBP-TS, CBP-RM, SMSO p=64, 2048
    table3  MINC-2500, VGG-D: the covariance flattened (Wishart), then SMSO's transform and
            normalisation ablation
    fig4    SMSO p = 2^4 .. 2^13 (VGG-D)
    fmnist  Fashion-MNIST, small CNN from scratch, one fixed budget: the reproduction run here
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.cli import run_cli
from training.config import ConfigError, TrainConfig

__all__ = ["DATASET_ORDER", "TABLES", "Row", "main", "row_config"]

DATASET_ORDER = ("dtd", "mit_indoor", "minc2500", "cub200")


@dataclass(frozen=True)
class Row:
    """One row of a table: the model it trains and the accuracy the paper reports."""

    name: str  # the command-line name
    label: str  # as the paper labels it
    settings: dict[str, Any]  # TrainConfig fields this row sets
    paper: dict[str, float | None] = field(default_factory=dict)  # dataset -> paper top-1 %
    warm_start: str | None = None  # row of the same table whose best.pt starts the backbone


def _paper(*values: float | None) -> dict[str, float | None]:
    return dict(zip(DATASET_ORDER, values, strict=True))


def _smso(p: int, **options: Any) -> dict[str, Any]:
    return {"head": "smso", "head_options": {"dim": p, **options}}


_VGG = {"backbone": "vgg16", "pretrained": "imagenet"}
_RESNET = {"backbone": "resnet50", "pretrained": "imagenet"}
_FIRST_ORDER = {"head": "gap", "reduce_dim": None}

TABLES: dict[str, list[Row]] = {
    "table1": [
        Row("first-order", "VGG-D", {**_VGG, "head": "vgg_fc", "reduce_dim": None},
            _paper(60.11, 64.51, 73.01, 66.12)),
        Row("bp", "BP", {**_VGG, "head": "bp"}, _paper(67.50, 77.55, 74.50, 81.02)),
        Row("mpn", "MPN", {**_VGG, "head": "mpn"}, _paper(68.01, 76.49, 76.24, 84.10)),
        Row("deepo2p", "DeepO2P", {**_VGG, "head": "deepo2p"}, _paper(66.07, 72.35, 69.29, None)),
        Row("cbp-ts", "CBP-TS", {**_VGG, "head": "cbp_ts"}, _paper(67.71, 76.83, 73.28, 84.00)),
        Row("cbp-rm", "CBP-RM", {**_VGG, "head": "cbp_rm"}, _paper(63.24, 73.89, 73.54, 83.86)),
        # Kong & Fowlkes: P on conv5_3 itself, after a scaled square root; from BP's weights
        Row("lrbp", "LRBP", {**_VGG, "head": "lrbp", "reduce_dim": None,
                             "head_options": {"sqrt_scale": 2e5}},
            _paper(65.80, 73.59, 69.10, 84.21), warm_start="bp"),
        Row("smso-64", "SMSO p=64", {**_VGG, **_smso(64)}, _paper(68.18, 75.37, 74.18, 82.66)),
        Row("smso-2048", "SMSO p=2,048", {**_VGG, **_smso(2048)}, _paper(69.26, 79.45, 78.00, 85.01)),
    ],
    "table2": [
        Row("first-order", "ResNet-50", {**_RESNET, **_FIRST_ORDER}, _paper(71.45, 76.45, 79.12, 74.51)),
        Row("bp", "BP", {**_RESNET, "head": "bp", "reduce_dim": 256,
                         "head_options": {"vectorize": "triu"}}, _paper(69.37, 68.35, 79.05, 82.70)),
        Row("mpn", "MPN", {**_RESNET, "head": "mpn"}, _paper(71.10, 72.12, 79.83, 85.43)),
        Row("cbp-ts", "CBP-TS", {**_RESNET, "head": "cbp_ts"}, _paper(65.30, 72.60, 75.91, 77.35)),
        Row("cbp-rm", "CBP-RM", {**_RESNET, "head": "cbp_rm"}, _paper(62.35, 67.81, 74.15, None)),
        Row("smso-64", "SMSO p=64", {**_RESNET, **_smso(64)}, _paper(71.03, 76.31, 79.17, 81.98)),
        Row("smso-2048", "SMSO p=2,048", {**_RESNET, **_smso(2048)}, _paper(72.51, 79.68, 81.33, 85.77)),
    ],
    "table3": [
        Row("flatten", "Flatten (Wishart), no transform, no normalisation",
            {**_VGG, "head": "flatten"}, {"minc2500": 75.97}),
    ] + [
        Row(f"{t}-{a}", f"PV, {t} transform, affine {a}", {**_VGG, **_smso(2048, transform=t, affine=a)},
            {"minc2500": acc})
        for t, a, acc in [
            ("none", "none", 75.32), ("sqrt", "none", 76.32), ("sqrt", "beta", 77.12),
            ("sqrt", "gamma", 76.47), ("none", "both", 76.14), ("sqrt", "both", 78.00),
            ("log", "both", 77.86), ("cuberoot", "both", 77.17),
        ]
    ],
    "fig4": [Row(f"p-{2**k}", f"SMSO p={2**k}", {**_VGG, **_smso(2**k)}) for k in range(4, 14)],
    "fmnist": [
        Row(name, label, {"backbone": "small_cnn", **settings})
        for name, label, settings in [
            ("first-order", "first-order (GAP)", _FIRST_ORDER),
            ("bp", "BP", {"head": "bp", "reduce_dim": 64}),
            ("mpn", "MPN", {"head": "mpn", "reduce_dim": 64}),
            # d = 2,048: at 8,192 the sketches' FFTs alone cost ~7 min per epoch on 2 cores
            ("cbp-ts", "CBP-TS d=2,048", {"head": "cbp_ts", "head_options": {"dim": 2048},
                                         "reduce_dim": 64}),
            ("smso-64", "SMSO p=64", {**_smso(64), "reduce_dim": 64}),
            ("smso-512", "SMSO p=512", {**_smso(512), "reduce_dim": 64}),
        ]
    ],
}  # fmt: skip

#: The fixed recipe of the Fashion-MNIST table: every row trains with exactly this.
FMNIST_RECIPE = {
    "dataset": "fashion_mnist", "epochs": 3, "batch_size": 128, "lr": 0.02,
    "schedule": "cosine", "workers": 0,
}  # fmt: skip


def find_row(table: str, name: str) -> Row:
    """The row ``name`` of ``table``; ``ConfigError`` lists the valid ones."""
    if table not in TABLES:
        raise ConfigError(f"unknown table {table!r}; valid tables: {', '.join(TABLES)}")
    for row in TABLES[table]:
        if row.name == name:
            return row
    valid = ", ".join(r.name for r in TABLES[table])
    raise ConfigError(f"unknown row {name!r} of {table}; valid rows: {valid}")


def row_config(
    table: str, row: Row, dataset: str | None, out: Path, scratch: bool = False, **overrides: Any
) -> TrainConfig:
    """The training config of one row: the recipe, the row's model, then ``overrides``.

    ``scratch=True`` drops the rows' ImageNet weights (random init); ``None`` overrides are ignored.
    """
    base: dict[str, Any] = dict(FMNIST_RECIPE) if table == "fmnist" else {}
    if table != "fmnist":
        if dataset is None:
            raise ConfigError(f"{table} needs --dataset, one of {', '.join(DATASET_ORDER)}")
        base["dataset"] = dataset
    settings = {**base, **row.settings, "out": str(out / f"{base['dataset']}-{row.name}")}
    if row.warm_start is not None:
        settings["init_from"] = str(out / f"{base['dataset']}-{row.warm_start}" / "best.pt")
    settings.update({k: v for k, v in overrides.items() if v is not None})
    if scratch:
        settings["pretrained"] = None
    return TrainConfig.from_dict(settings)


def _result_line(table: str, row: Row, cfg: TrainConfig, result: Any) -> dict[str, Any]:
    model = result.model
    head_params = sum(
        p.numel() for n, p in model.named_parameters() if not n.startswith("backbone.")
    )
    metrics = [json.loads(line) for line in (result.out / "metrics.jsonl").read_text().splitlines()]
    return {
        "table": table, "row": row.name, "label": row.label, "dataset": cfg.dataset,
        "run": str(result.out), "test_accuracy": None if result.test is None else result.test.accuracy,
        "best_val_accuracy": result.best_val_accuracy, "feature_dim": model.embedding_dim,
        "head_parameters": head_params, "train_seconds": sum(m["seconds"] for m in metrics),
        "epochs": cfg.epochs, "paper": row.paper.get(cfg.dataset),
    }  # fmt: skip


def run_row(
    table: str, name: str, dataset: str | None, out: Path, scratch: bool = False, **overrides: Any
) -> dict[str, Any]:
    """Train and test one row; append its result to ``out/results.jsonl`` and return it."""
    from training.train import fit

    row = find_row(table, name)
    cfg = row_config(table, row, dataset, out, scratch, **overrides)
    if cfg.init_from is not None and not Path(cfg.init_from).is_file():
        raise ConfigError(
            f"row {name} of {table} starts from row {row.warm_start}'s weights, and "
            f"{cfg.init_from} does not exist: run `smso-experiment run {table} {row.warm_start}` "
            "with the same --out first"
        )
    result = fit(cfg)
    line = _result_line(table, row, cfg, result)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "results.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")
    return line


def report(table: str, out: Path) -> str:
    """A markdown table of the results in ``out/results.jsonl`` beside the paper's numbers."""
    path = out / "results.jsonl"
    if not path.is_file():
        raise ConfigError(f"no results at {path}; run rows with `smso-experiment run` first")
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["table"] == table:
            latest[(record["row"], record["dataset"])] = record  # the last run of a row wins
    header = "| model | dataset | feature dim | head params | test top-1 % | paper % | train s |"
    rows = [header, "|---|---|--:|--:|--:|--:|--:|"]
    order = {r.name: i for i, r in enumerate(TABLES[table])}
    for (_, dataset), r in sorted(latest.items(), key=lambda kv: (kv[0][1], order[kv[0][0]])):
        acc = "-" if r["test_accuracy"] is None else f"{100 * r['test_accuracy']:.2f}"
        paper = "-" if r["paper"] is None else f"{r['paper']:.2f}"
        rows.append(
            f"| {r['label']} | {dataset} | {r['feature_dim']:,} | {r['head_parameters']:,} | "
            f"{acc} | {paper} | {r['train_seconds']:.0f} |"
        )
    return "\n".join(rows)


def _list() -> str:
    lines = []
    for table, rows in TABLES.items():
        lines.append(f"{table}:")
        for row in rows:
            paper = ", ".join(f"{d} {v}" for d, v in row.paper.items() if v is not None)
            lines.append(f"  {row.name:<16} {row.label:<32} {paper}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``smso-experiment``."""
    parser = argparse.ArgumentParser(prog="smso-experiment", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every table row with the paper's numbers")
    run = sub.add_parser("run", help="train and test rows of a table")
    run.add_argument("table", choices=list(TABLES))
    run.add_argument("rows", nargs="*", help="row names (default: every row of the table)")
    run.add_argument("--dataset", choices=DATASET_ORDER)
    run.add_argument("--data-root")
    run.add_argument("--out", type=Path, default=Path("runs/experiments"))
    run.add_argument("--epochs", type=int)
    run.add_argument("--batch-size", type=int)
    run.add_argument("--image-size", type=int)
    run.add_argument("--device")
    run.add_argument("--workers", type=int)
    run.add_argument("--pretrained", help="a local weights file instead of torchvision's")
    run.add_argument("--scratch", action="store_true", help="random init instead of ImageNet")
    rep = sub.add_parser("report", help="measured results beside the paper's, as markdown")
    rep.add_argument("table", choices=list(TABLES))
    rep.add_argument("--out", type=Path, default=Path("runs/experiments"))
    args = parser.parse_args(argv)

    def body() -> int:
        if args.command == "list":
            print(_list())
        elif args.command == "report":
            print(report(args.table, args.out))
        else:
            overrides = {
                "data_root": args.data_root, "epochs": args.epochs, "batch_size": args.batch_size,
                "image_size": args.image_size, "device": args.device, "workers": args.workers,
                "pretrained": args.pretrained,
            }  # fmt: skip
            for name in args.rows or [r.name for r in TABLES[args.table]]:
                line = run_row(args.table, name, args.dataset, args.out, args.scratch, **overrides)
                print(json.dumps(line))
            print(report(args.table, args.out))
        return 0

    return run_cli("smso-experiment", body)


if __name__ == "__main__":
    sys.exit(main())
