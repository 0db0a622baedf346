"""The paper's experiments end to end on tiny trees in the real layouts (no GPU, no weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.test_datasets import make_dtd, make_minc
from training import figures
from training.config import ConfigError
from training.experiments import TABLES, main, report, row_config, run_row
from training.figures import fig2_from_checkpoint

SMOKE = {"epochs": 1, "batch_size": 4, "workers": 0, "device": "cpu"}


@pytest.fixture(scope="module")
def dtd_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dtd(tmp_path_factory.mktemp("dtd"))


@pytest.fixture(scope="module")
def table1(dtd_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every row of Table 1 (VGG-D) trained one epoch on a tiny DTD at 32 px, from scratch."""
    out = tmp_path_factory.mktemp("table1")
    for row in TABLES["table1"]:
        run_row("table1", row.name, "dtd", out, scratch=True, data_root=str(dtd_root),
                image_size=32, **SMOKE)  # fmt: skip
    return out


def test_every_table1_row_runs_and_is_reported(table1: Path) -> None:
    lines = [json.loads(line) for line in (table1 / "results.jsonl").read_text().splitlines()]
    assert [line["row"] for line in lines] == [row.name for row in TABLES["table1"]]
    dims = {line["row"]: line["feature_dim"] for line in lines}
    assert dims == {
        "first-order": 4096, "bp": 262_144, "mpn": 32_896, "deepo2p": 262_144, "cbp-ts": 8192,
        "cbp-rm": 8192, "lrbp": 3, "smso-64": 64, "smso-2048": 2048,
    }  # fmt: skip
    assert all(0 <= line["test_accuracy"] <= 1 for line in lines)
    table = report("table1", table1)
    assert "| SMSO p=2,048 | dtd | 2,048 |" in table
    assert "| 69.26 |" in table  # the paper's number beside the measured one


def test_lrbp_row_is_run_as_the_paper_ran_it(table1: Path) -> None:
    config = json.loads((table1 / "dtd-lrbp" / "config.json").read_text())
    assert config["loss"] == "hinge"
    assert config["init_from"] == str(table1 / "dtd-bp" / "best.pt")  # from BP's weights
    assert config["reduce_dim"] is None  # P projects conv5_3 itself
    assert config["head_options"] == {"sqrt_scale": 2e5}


def test_lrbp_row_without_its_bp_row_says_what_to_run(dtd_root: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="run `smso-experiment run table1 bp` with the same"):
        run_row("table1", "lrbp", "dtd", tmp_path, scratch=True, data_root=str(dtd_root), **SMOKE)


def test_fig3_draws_loss_curves(table1: Path, tmp_path: Path) -> None:
    runs = [table1 / "dtd-smso-2048", table1 / "dtd-bp", table1 / "dtd-mpn"]
    out = figures.fig3(runs, tmp_path / "fig3.png", ["SMSO", "BP", "MPN"])
    assert out.stat().st_size > 10_000


def test_fig2_histograms_and_shapiro_wilk(table1: Path, dtd_root: Path, tmp_path: Path) -> None:
    summary = fig2_from_checkpoint(
        table1 / "dtd-smso-64" / "best.pt", tmp_path / "fig2.png", "test", str(dtd_root)
    )
    assert (tmp_path / "fig2.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "fig2.json").read_text()) == summary
    assert summary["images"] == 3
    # The tiny tree's images are solid colours: every z is clamped, so z'' is constant per dim.
    assert summary["constant_dims"] + len(summary["dims_plotted"]) >= 4


def test_fig2_refuses_a_head_that_is_not_smso(table1: Path, dtd_root: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fig2 needs a checkpoint with the SMSO head"):
        fig2_from_checkpoint(
            table1 / "dtd-bp" / "best.pt", tmp_path / "f.png", "test", str(dtd_root)
        )


def test_table2_table3_and_fig4_run(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    minc = make_minc(tmp_path_factory.mktemp("minc"))
    out = tmp_path / "runs"
    common = {"scratch": True, "data_root": str(minc), **SMOKE}
    run_row("table2", "smso-64", "minc2500", out, image_size=64, **common)  # ResNet-50
    run_row("table2", "bp", "minc2500", out, image_size=64, **common)
    run_row("table3", "flatten", "minc2500", out, image_size=32, **common)
    run_row("table3", "log-both", "minc2500", out, image_size=32, **common)
    for name in ("p-16", "p-32"):
        run_row("fig4", name, "minc2500", out, image_size=32, **common)
    figures.fig4(out / "results.jsonl", tmp_path / "fig4.png")
    assert (tmp_path / "fig4.png").stat().st_size > 10_000
    assert "| PV, log transform, affine both | minc2500 | 2,048 |" in report("table3", out)
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    dims = {(line["table"], line["row"]): line["feature_dim"] for line in lines}
    assert dims[("table2", "bp")] == 32_896  # the paper's BP on ResNet-50: c = 256, triangle
    assert dims[("table3", "flatten")] == 65_536  # the covariance at c = 256, no PV
    assert "| Flatten (Wishart), no transform, no normalisation | minc2500 | 65,536 |" in report(
        "table3", out
    )
    cfg = json.loads((out / "minc2500-log-both" / "config.json").read_text())
    assert cfg["head_options"] == {"dim": 2048, "transform": "log", "affine": "both"}


def test_rows_use_the_paper_recipe(tmp_path: Path) -> None:
    vgg = row_config("table1", TABLES["table1"][7], "dtd", tmp_path)
    assert (vgg.backbone, vgg.pretrained, vgg.head_options) == ("vgg16", "imagenet", {"dim": 64})
    assert vgg.resolve().lr == 0.001
    resnet = row_config("table2", TABLES["table2"][0], "cub200", tmp_path)
    assert (resnet.head, resnet.reduce_dim, resnet.resolve().lr) == ("gap", None, 0.01)
    fmnist = row_config("fmnist", TABLES["fmnist"][4], None, tmp_path)
    assert (fmnist.dataset, fmnist.backbone, fmnist.epochs) == ("fashion_mnist", "small_cnn", 3)


def test_cli_lists_rows_and_names_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    assert "smso-2048" in capsys.readouterr().out
    assert main(["run", "table1", "smso-4096", "--dataset", "dtd"]) == 2
    assert "valid rows: first-order, bp, mpn" in capsys.readouterr().err
    assert main(["run", "table1", "bp"]) == 2
    assert "table1 needs --dataset" in capsys.readouterr().err
