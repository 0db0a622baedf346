"""The paper's experiments end to end on tiny trees in the real layouts (no GPU, no weights)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tomllib
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from tests.training.test_datasets import make_dtd, make_minc
from training import figures
from training.config import ConfigError
from training.engine import make_criterion
from training.experiments import (
    FMNIST_RECIPE,
    TABLES,
    _result_line,
    _train_seconds,
    bases_first,
    find_row,
    main,
    report,
    row_config,
    run_row,
    run_rows,
    total_time,
)
from training.figures import fig2_from_checkpoint
from training.heads import HEADS
from training.model import build_model

ROOT = Path(__file__).resolve().parents[2]

SMOKE: dict[str, Any] = {"epochs": 1, "batch_size": 4, "workers": 0, "device": "cpu"}


@pytest.fixture(scope="module")
def dtd_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dtd(tmp_path_factory.mktemp("dtd"))


@pytest.fixture(scope="module")
def table1(dtd_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every row of Table 1 (VGG-D) trained one epoch on a tiny DTD at 32 px, from scratch."""
    out = tmp_path_factory.mktemp("table1")
    for row in TABLES["table1"]:
        run_row(
            "table1",
            row.name,
            "dtd",
            out,
            scratch=True,
            data_root=str(dtd_root),
            image_size=32,
            **SMOKE,
        )
    return out


def test_every_table1_row_runs_and_is_reported(table1: Path) -> None:
    lines = [json.loads(line) for line in (table1 / "results.jsonl").read_text().splitlines()]
    assert [line["row"] for line in lines] == [row.name for row in TABLES["table1"]]
    dims = {line["row"]: line["feature_dim"] for line in lines}
    assert dims == {
        "first-order": 4096,
        "bp": 262_144,
        "mpn": 32_896,
        "deepo2p": 262_144,
        "cbp-ts": 8192,
        "cbp-rm": 8192,
        "lrbp": 3,
        "smso-64": 64,
        "smso-2048": 2048,
    }
    assert all(0 <= line["test_accuracy"] <= 1 for line in lines)
    table = report("table1", table1)
    assert "| SMSO p=2,048 | dtd | 1 | 2,048 |" in table
    assert "| 69.26 |" in table  # the paper's number beside the measured one


def test_lrbp_row_is_run_as_the_paper_ran_it(table1: Path) -> None:
    config = json.loads((table1 / "dtd-lrbp" / "seed0" / "config.json").read_text())
    assert config["loss"] == "hinge"
    assert config["init_from"] == str(table1 / "dtd-bp" / "seed0" / "best.pt")  # BP's weights
    assert config["reduce_dim"] is None  # P projects conv5_3 itself
    assert config["head_options"] == {"sqrt_scale": 2e5}


def test_lrbp_row_without_its_bp_row_says_what_to_run(dtd_root: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="run `smso-experiment run table1 bp` with the same"):
        run_row("table1", "lrbp", "dtd", tmp_path, scratch=True, data_root=str(dtd_root), **SMOKE)


def test_fig3_draws_loss_curves(table1: Path, tmp_path: Path) -> None:
    runs = [table1 / f"dtd-{row}" / "seed0" for row in ("smso-2048", "bp", "mpn")]
    out = figures.fig3(runs, tmp_path / "fig3.png", ["SMSO", "BP", "MPN"])
    assert out.stat().st_size > 10_000


def test_fig2_histograms_and_shapiro_wilk(table1: Path, dtd_root: Path, tmp_path: Path) -> None:
    summary = fig2_from_checkpoint(
        table1 / "dtd-smso-64" / "seed0" / "best.pt", tmp_path / "fig2.png", "test", str(dtd_root)
    )
    assert (tmp_path / "fig2.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "fig2.json").read_text()) == summary
    assert summary["images"] == 3
    # The tiny tree's images are solid colours: every z is clamped, so z'' is constant per dim.
    assert summary["constant_dims"] + len(summary["dims_plotted"]) >= 4


def test_fig2_reports_shapiro_wilk_and_skewness_as_scipy_computes_them(tmp_path: Path) -> None:
    """The numbers of Fig. 2 (the checkpoint test above has only constant dimensions): per
    varying dimension of z'', Shapiro-Wilk and skewness as scipy gives them; a constant one is
    counted, never tested."""
    from scipy import stats

    rng = np.random.default_rng(0)
    n = 400
    final = np.stack(
        [
            rng.standard_normal(n),
            2 + 3 * rng.standard_normal(n),
            rng.exponential(size=n),  # right-skewed: Shapiro-Wilk rejects it
            np.full(n, 0.5),  # constant
        ],
        axis=1,
    )
    stages = {
        "features": rng.standard_normal((n * 4, 6)),
        "z": rng.exponential(size=(n, 4)),
        "z_prime": final,
        "final": final,
    }
    summary = figures.fig2(stages, tmp_path / "fig2.png")
    pvalues = [stats.shapiro(final[:, j]).pvalue for j in range(3)]
    assert pvalues[2] < 1e-6 < min(pvalues[:2])
    assert summary["images"] == n
    assert summary["constant_dims"] == 1
    assert summary["shapiro_wilk_p_median"] == pytest.approx(np.median(pvalues))
    assert summary["fraction_not_rejected_at_0.05"] == pytest.approx(
        np.mean([p > 0.05 for p in pvalues])
    )
    one = summary["shapiro_wilk_p_one_dim"]
    assert one["dim"] in (0, 1, 2)
    assert one["p"] == pytest.approx(pvalues[one["dim"]])
    assert summary["skewness_final_median"] == pytest.approx(
        np.median(stats.skew(final[:, :3], axis=0))
    )
    assert summary["skewness_z_median"] == pytest.approx(np.median(stats.skew(stages["z"], axis=0)))
    assert summary["z_prime_std"]["min"] == pytest.approx(0.0)  # the constant dimension
    assert (tmp_path / "fig2.png").stat().st_size > 10_000


def test_fig2_refuses_a_head_that_is_not_smso(table1: Path, dtd_root: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fig2 needs a checkpoint with the SMSO head"):
        fig2_from_checkpoint(
            table1 / "dtd-bp" / "seed0" / "best.pt", tmp_path / "f.png", "test", str(dtd_root)
        )


def test_table2_table3_and_fig4_run(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    minc = make_minc(tmp_path_factory.mktemp("minc"))
    out = tmp_path / "runs"
    common: dict[str, Any] = {"scratch": True, "data_root": str(minc), **SMOKE}
    run_row("table2", "smso-64", "minc2500", out, image_size=64, **common)  # ResNet-50
    run_row("table2", "bp", "minc2500", out, image_size=64, **common)
    run_row("table3", "flatten", "minc2500", out, image_size=32, **common)
    run_row("table3", "log-both", "minc2500", out, image_size=32, **common)
    for name in ("p-16", "p-32"):
        run_row("fig4", name, "minc2500", out, image_size=32, **common)
    figures.fig4(out / "results.jsonl", tmp_path / "fig4.png")
    assert (tmp_path / "fig4.png").stat().st_size > 10_000
    assert "| PV, log transform, affine both | minc2500 | 1 | 2,048 |" in report("table3", out)
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    dims = {(line["table"], line["row"]): line["feature_dim"] for line in lines}
    assert dims[("table2", "bp")] == 32_896  # the paper's BP on ResNet-50: c = 256, triangle
    assert dims[("table3", "flatten")] == 65_536  # the covariance at c = 256, no PV
    assert (
        "| Flatten (Wishart), no transform, no normalisation | minc2500 | 1 | 65,536 |"
        in report("table3", out)
    )
    cfg = json.loads((out / "minc2500-log-both" / "seed0" / "config.json").read_text())
    assert cfg["head_options"] == {"dim": 2048, "transform": "log", "affine": "both"}


def test_rows_use_the_paper_recipe(tmp_path: Path) -> None:
    vgg = row_config("table1", TABLES["table1"][7], "dtd", tmp_path)
    assert (vgg.backbone, vgg.pretrained, vgg.head_options) == ("vgg16", "imagenet", {"dim": 64})
    assert vgg.resolve().lr == 0.001
    resnet = row_config("table2", TABLES["table2"][0], "cub200", tmp_path)
    assert (resnet.head, resnet.reduce_dim, resnet.resolve().lr) == ("gap", None, 0.01)
    fmnist = row_config("fmnist", find_row("fmnist", "smso-64"), None, tmp_path, seed=2)
    assert (fmnist.dataset, fmnist.backbone, fmnist.epochs, fmnist.seed) == (
        "fashion_mnist",
        "small_cnn",
        45,
        2,
    )
    assert fmnist.random_erasing == 0.5
    assert fmnist.out == str(tmp_path / "fashion_mnist-smso-64" / "seed2")


def test_cli_lists_rows_and_names_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    assert "smso-2048" in capsys.readouterr().out
    assert main(["run", "table1", "smso-4096", "--dataset", "dtd"]) == 2
    assert "valid rows: first-order, bp, mpn" in capsys.readouterr().err
    assert main(["run", "table1", "bp"]) == 2
    assert "table1 needs --dataset" in capsys.readouterr().err


# The Fashion-MNIST head comparison: every head at the shipped model's recipe, several seeds.

FMNIST_DIMS = {
    "first-order": 128,
    "bp": 4096,
    "mpn": 2080,
    "cbp-ts": 2048,
    "cbp-rm": 2048,
    "lrbp": 10,
    "deepo2p": 4096,
    "smso-16": 16,
    "smso-64": 64,
    "smso-256": 256,
    "smso-1024": 1024,
}
#: The heads the table leaves out: VGG-D's own classifier needs VGG-D, the flattened covariance is
#: Table 3's ablation.
NOT_IN_FMNIST = {"vgg_fc", "flatten"}


def test_fmnist_rows_train_with_the_shipped_models_recipe(tmp_path: Path) -> None:
    shipped = tomllib.loads((ROOT / "configs" / "fashion-mnist-smso.toml").read_text())
    model_and_seed = {"head", "head_options", "reduce_dim", "seed"}
    assert {k: v for k, v in shipped.items() if k not in model_and_seed} == FMNIST_RECIPE, (
        "the fmnist table trains every head with the shipped recipe: update FMNIST_RECIPE "
        "in training/experiments.py and rerun `make fmnist-table`"
    )
    for row in TABLES["fmnist"]:
        cfg = row_config("fmnist", row, None, tmp_path)
        assert {k: getattr(cfg, k) for k in FMNIST_RECIPE} == FMNIST_RECIPE, row.name


def test_the_sweep_gives_every_compared_head_the_same_grid_and_no_test(tmp_path: Path) -> None:
    from training.experiments import SWEEP_HEADS, SWEEP_LRS, SWEEP_WEIGHT_DECAYS

    grids: dict[str, set[tuple[float | None, float]]] = {}
    for row in TABLES["fmnist-sweep"]:
        head = next(h for h in SWEEP_HEADS if row.name.startswith(f"{h}-lr"))
        cfg = row_config("fmnist-sweep", row, None, tmp_path)
        full = row_config("fmnist", find_row("fmnist", head), None, tmp_path)
        # the head's model exactly as in the comparison; only the recipe's three knobs move
        assert (cfg.head, cfg.head_options, cfg.reduce_dim) == (
            full.head,
            full.head_options,
            full.reduce_dim,
        ), row.name
        assert (cfg.epochs, cfg.eval_test, cfg.seed) == (18, False, 0), row.name
        same = {k: v for k, v in FMNIST_RECIPE.items() if k not in ("epochs", "lr", "weight_decay")}
        assert {k: getattr(cfg, k) for k in same} == same, row.name
        grids.setdefault(head, set()).add((cfg.lr, cfg.weight_decay))
    grid = {(lr, wd) for lr in SWEEP_LRS for wd in SWEEP_WEIGHT_DECAYS}
    assert grids == dict.fromkeys(SWEEP_HEADS, grid)
    assert len(grid) == 6


def test_a_fair_row_is_its_sweep_point_at_the_full_schedule_with_the_test(tmp_path: Path) -> None:
    """What `make fmnist-fair` trains once the sweep has chosen: the chosen point, 45 epochs,
    tested; nothing else moves."""
    assert [r.name for r in TABLES["fmnist-fair"]] == [r.name for r in TABLES["fmnist-sweep"]]
    for row in TABLES["fmnist-fair"]:
        fair = row_config("fmnist-fair", row, None, tmp_path)
        swept = row_config("fmnist-sweep", find_row("fmnist-sweep", row.name), None, tmp_path)
        assert (fair.epochs, fair.eval_test) == (FMNIST_RECIPE["epochs"], True), row.name
        assert replace(fair, epochs=18, eval_test=False) == swept, row.name


def test_a_chosen_point_trains_and_tests_through_the_cli(
    tiny_fashion_mnist: Path, tmp_path: Path
) -> None:
    """The row names `smso-experiment choose --to-run` prints (dots and all) run as given."""
    argv = ["run", "fmnist-fair", "first-order-lr0.02-wd0.0005", "--seeds", "0"]
    assert main([*argv, *tiny_fmnist_flags(tiny_fashion_mnist, tmp_path)]) == 0
    run = tmp_path / "fashion_mnist-first-order-lr0.02-wd0.0005" / "seed0"
    config = json.loads((run / "config.json").read_text())
    assert (config["lr"], config["weight_decay"], config["eval_test"]) == (0.02, 5e-4, True)
    assert json.loads((run / "result.json").read_text())["test_accuracy"] is not None


def test_every_head_has_a_fmnist_row() -> None:
    heads = {row.settings["head"] for row in TABLES["fmnist"]}
    assert heads == set(HEADS) - NOT_IN_FMNIST, "a new head needs a row in the fmnist table"
    assert set(FMNIST_DIMS) == {row.name for row in TABLES["fmnist"]}


@pytest.mark.parametrize("name", list(FMNIST_DIMS))
def test_every_fmnist_row_builds_and_trains_a_step_at_28_px(name: str, tmp_path: Path) -> None:
    cfg = row_config("fmnist", find_row("fmnist", name), None, tmp_path).resolve()
    torch.manual_seed(0)
    model = build_model(cfg.model_config(num_classes=10, in_channels=1))
    assert model.embedding_dim == FMNIST_DIMS[name]
    images, labels = torch.randn(4, 1, 28, 28), torch.arange(4)
    loss = make_criterion(cfg.loss)(model(images).logits, labels)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads), name


def tiny_fmnist_flags(root: Path, out: Path) -> list[str]:
    """One epoch on the tiny Fashion-MNIST (40 of its 200 training images held out)."""
    return [
        "--data-root",
        str(root),
        "--val-size",
        "40",
        "--epochs",
        "1",
        "--device",
        "cpu",
        "--out",
        str(out),
    ]


@pytest.fixture(scope="module")
def two_seeds(tiny_fashion_mnist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SMSO p = 16 with seeds 0 and 1, by the CLI."""
    out = tmp_path_factory.mktemp("fmnist-table")
    argv = ["run", "fmnist", "smso-16", "--seeds", "0", "1"]
    assert main([*argv, *tiny_fmnist_flags(tiny_fashion_mnist, out)]) == 0
    return out


def test_a_row_with_two_seeds_runs_each_in_its_folder(two_seeds: Path) -> None:
    lines = [json.loads(line) for line in (two_seeds / "results.jsonl").read_text().splitlines()]
    assert [(line["row"], line["seed"]) for line in lines] == [("smso-16", 0), ("smso-16", 1)]
    for line in lines:
        run = two_seeds / "fashion_mnist-smso-16" / f"seed{line['seed']}"
        assert line["run"] == str(run)
        assert json.loads((run / "config.json").read_text())["seed"] == line["seed"]
        assert json.loads((run / "result.json").read_text()) == line
        assert line["images_per_second"] > 0
        assert line["device"] == "cpu"


def test_a_result_reports_the_median_epochs_throughput_and_time(tmp_path: Path) -> None:
    """An epoch slowed by other work on the machine (or a paused run) does not move the row's
    images/s or its training time."""
    row = find_row("fmnist", "smso-16")
    cfg = row_config("fmnist", row, None, tmp_path)
    epochs = [(1000.0, 50.0), (200.0, 250.0), (1100.0, 45.0)]  # (images/s, seconds)
    lines = [json.dumps({"images_per_second": v, "seconds": t}) for v, t in epochs]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    model = build_model(cfg.model_config(10, 1))
    result = SimpleNamespace(model=model, out=tmp_path, test=None, best_val_accuracy=0.9)
    line = _result_line("fmnist", row, cfg, result)
    assert line["images_per_second"] == 1000.0
    assert line["train_seconds"] == 345.0
    assert line["median_epoch_seconds"] == 50.0
    assert _train_seconds(line | {"epochs": 3}) == 150.0
    assert _train_seconds(line | {"median_epoch_seconds": None}) == 345.0  # older results


def test_the_report_gives_mean_and_std_over_the_seeds(two_seeds: Path) -> None:
    lines = [json.loads(line) for line in (two_seeds / "results.jsonl").read_text().splitlines()]

    def mean_std(key: str) -> str:
        values = [100 * line[key] for line in lines]
        return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"

    table = report("fmnist", two_seeds)
    header, _, row = table.splitlines()[:3]
    assert header == (
        "| model | dataset | seeds | feature dim | head params | best val % | test % | images/s |"
        " train min |"
    )
    assert row.startswith(
        f"| SMSO p=16 | fashion_mnist | 2 | 16 | {lines[0]['head_parameters']:,} | "
        f"{mean_std('best_val_accuracy')} | {mean_std('test_accuracy')} | "
    )
    assert "nothing is chosen on the test split" in table
    assert "paper %" not in table  # the paper has no Fashion-MNIST numbers
    assert "Training time of these 2 runs, summed over the runs: " in table
    speeds = [line["images_per_second"] for line in lines]
    assert f"{statistics.median(speeds):,.0f} | " in row  # the median over the seeds
    assert f"a row's seeds differ by up to {max(speeds) / min(speeds):.2f}x here" in table


def test_the_total_training_time_sums_median_based_and_measured_times() -> None:
    records: list[dict[str, Any]] = [
        {"epochs": 45, "median_epoch_seconds": 40.0, "train_seconds": 2400.0},  # 30 min, 40 min
        {"epochs": 45, "median_epoch_seconds": 80.0, "train_seconds": 6600.0},  # 60 min, 110 min
        {"epochs": 10, "median_epoch_seconds": None, "train_seconds": 1800.0},  # older result
    ]
    assert total_time(records).startswith(
        "Training time of these 3 runs, summed over the runs: 2.0 h (each run's epochs x its "
        "median epoch); 3.0 h as their epochs measured"
    )


def test_jobs_run_in_parallel_processes_and_give_the_same_lines(
    tiny_fashion_mnist: Path, tmp_path: Path
) -> None:
    """--jobs 2: two runs at a time, each in a worker process of its own; the results come
    back in seed-then-row order, each run in its folder and in results.jsonl."""
    out = tmp_path / "table"
    argv = ["run", "fmnist", "first-order", "smso-16", "--seeds", "0", "1", "--jobs", "2"]
    assert main([*argv, *tiny_fmnist_flags(tiny_fashion_mnist, out)]) == 0
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((line["row"], line["seed"]) for line in lines) == [
        ("first-order", 0),
        ("first-order", 1),
        ("smso-16", 0),
        ("smso-16", 1),
    ]
    for line in lines:
        run = out / f"fashion_mnist-{line['row']}" / f"seed{line['seed']}"
        assert json.loads((run / "result.json").read_text()) == line
        assert line["test_accuracy"] is not None


def _timed_run(folder: Path, name: str, seed: int) -> dict[str, object]:
    """A stand-in run (in a worker process): BP takes half a second; start, end and the
    process noted."""
    import os
    import time

    start = time.time()
    time.sleep(0.5 if name == "bp" else 0.0)
    return {"row": name, "seed": seed, "start": start, "end": time.time(), "pid": os.getpid()}


@pytest.mark.parametrize("rows", [["bp", "lrbp"], ["lrbp", "bp"]])
@pytest.mark.parametrize("jobs", [1, 2])
def test_jobs_keep_the_order_and_wait_for_a_warm_start(
    jobs: int, rows: list[str], tmp_path: Path
) -> None:
    """Results in seed-then-row order; LRBP (which starts from BP's weights) begins only after
    BP's run with the same seed has ended, also when two run at a time and when LRBP is listed
    first."""
    import functools

    run = functools.partial(_timed_run, tmp_path)
    lines = list(run_rows("table1", rows, [0, 1], jobs, run))
    assert [(line["row"], line["seed"]) for line in lines] == [
        ("bp", 0),
        ("lrbp", 0),
        ("bp", 1),
        ("lrbp", 1),
    ]
    for seed in (0, 1):
        bp, lrbp = (line for line in lines if line["seed"] == seed)
        assert lrbp["start"] >= bp["end"]
    pids = {line["pid"] for line in lines}
    if jobs == 1:  # in this process
        assert pids == {os.getpid()}
    else:  # in worker processes (started as they are needed: here often one does it all)
        assert os.getpid() not in pids


def test_a_warm_start_row_listed_before_its_base_moves_just_after_it() -> None:
    """Only a row listed before its base moves; a base that is not listed moves nothing."""
    assert bases_first("table1", ["lrbp", "smso-64", "bp"]) == ["bp", "lrbp", "smso-64"]
    assert bases_first("table1", ["smso-64", "bp", "lrbp"]) == ["smso-64", "bp", "lrbp"]
    assert bases_first("table1", ["lrbp", "smso-64"]) == ["lrbp", "smso-64"]


def test_jobs_below_one_are_refused(
    tiny_fashion_mnist: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "fmnist", "smso-16", "--jobs", "0"]
    assert main([*argv, *tiny_fmnist_flags(tiny_fashion_mnist, tmp_path)]) == 2
    assert "--jobs must be at least 1, got 0" in capsys.readouterr().err


def test_resume_skips_finished_runs_and_refuses_other_settings(
    two_seeds: Path, tiny_fashion_mnist: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = tiny_fmnist_flags(tiny_fashion_mnist, two_seeds)
    results = (two_seeds / "results.jsonl").read_text()
    assert main(["run", "fmnist", "smso-16", "--seeds", "0", "1", "--resume", *flags]) == 0
    assert (two_seeds / "results.jsonl").read_text() == results  # nothing run again
    capsys.readouterr()
    assert main(["run", "fmnist", "smso-16", "--resume", *flags, "--epochs", "2"]) == 2
    assert "holds a run with other settings (epochs 1 there, 2 now)" in capsys.readouterr().err
    assert main(["run", "fmnist", "smso-16", *flags]) == 2  # without --resume: refused
    assert "pass --resume" in capsys.readouterr().err


def test_resume_finishes_a_stopped_run(tiny_fashion_mnist: Path, tmp_path: Path) -> None:
    common: dict[str, Any] = {
        "data_root": str(tiny_fashion_mnist),
        "val_size": 40,
        "epochs": 2,
        "device": "cpu",
    }
    stopped = run_row("fmnist", "first-order", None, tmp_path, seed=3, stop_after=1, **common)
    assert stopped["test_accuracy"] is None
    assert not (tmp_path / "results.jsonl").exists()
    line = run_row("fmnist", "first-order", None, tmp_path, seed=3, resume=True, **common)
    run = tmp_path / "fashion_mnist-first-order" / "seed3"
    epochs = [json.loads(m)["epoch"] for m in (run / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2]
    assert line["test_accuracy"] is not None
    assert (tmp_path / "results.jsonl").read_text() == json.dumps(line) + "\n"


def test_the_report_gathers_run_folders_from_several_machines(
    two_seeds: Path, tmp_path: Path
) -> None:
    for seed in (0, 1):  # each seed run elsewhere, its folder copied here: no results.jsonl
        run = two_seeds / "fashion_mnist-smso-16" / f"seed{seed}"
        shutil.copytree(run, tmp_path / "fashion_mnist-smso-16" / f"seed{seed}")
    assert report("fmnist", tmp_path) == report("fmnist", two_seeds)
