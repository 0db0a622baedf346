"""Run records that are damaged or foreign: an error naming the file and line, never a KeyError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training import figures
from training.cli import run_cli
from training.config import ConfigError
from training.experiments import RESULT_FIELDS, append_result, main, report
from training.json_lines import read_json_lines

RESULT = {field: 0 for field in RESULT_FIELDS} | {
    "table": "fmnist",
    "row": "smso-64",
    "label": "SMSO p=64",
    "dataset": "fashion_mnist",
    "test_accuracy": 0.9,
    "best_val_accuracy": 0.91,
    "paper": None,
}


def test_blank_lines_are_skipped_and_objects_kept(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert read_json_lines(path, ["a"]) == [{"a": 1}, {"a": 2}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": 1}\n{"a": \n', r"m.jsonl:2: not JSON \(Expecting value\)"),
        ('{"a": 1}\n[1, 2]\n', "m.jsonl:2: not a JSON object"),
        ('{"a": 1}\n{"b": 1}\n', "m.jsonl:2: the record has no a"),
    ],
)
def test_a_bad_line_is_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_json_lines(path, ["a"])


def test_fig3_names_a_metrics_line_without_its_losses(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1, "train_loss": 1.0}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:1: the record has no val_loss"):
        figures.fig3([tmp_path], tmp_path / "f.png")


def test_fig3_refuses_an_empty_run_and_a_label_count_that_does_not_match(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="holds no epochs yet"):
        figures.fig3([tmp_path], tmp_path / "f.png")
    with pytest.raises(ValueError, match="--labels gives 2 labels for 1 runs"):
        figures.fig3([tmp_path], tmp_path / "f.png", ["a", "b"])


def test_fig4_names_a_result_line_without_a_table(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text('{"row": "p-16"}\n')
    with pytest.raises(ValueError, match=r"results\.jsonl:1: the record has no table"):
        figures.fig4(path, tmp_path / "f.png")


def test_smso_figure_refuses_fewer_than_one_image(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        figures.main(["fig2", "x.pt", "--images", "0", "--out", "f.png"])
    assert "--images: must be 1 or more, got 0" in capsys.readouterr().err


def test_report_names_damaged_and_foreign_results(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(RESULT) + "\n" + '{"table": "fmnist"}\n')
    with pytest.raises(ValueError, match=r"results\.jsonl:2: the record has no row"):
        report("fmnist", tmp_path)
    path.write_text(json.dumps(RESULT) + "\n")
    with pytest.raises(ConfigError, match=r"no results of table1 under .* results of fmnist"):
        report("table1", tmp_path)
    path.write_text(json.dumps(RESULT | {"row": "smso-65"}) + "\n")
    with pytest.raises(ConfigError, match=r"rows fmnist does not have: \['smso-65'\]"):
        report("fmnist", tmp_path)
    path.write_text(json.dumps(RESULT) + "\n")
    assert "| SMSO p=64 | fashion_mnist | 1 |" in report("fmnist", tmp_path)


def test_report_cli_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "results.jsonl").write_text("{torn\n")
    assert main(["report", "fmnist", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"smso-experiment: error: {tmp_path / 'results.jsonl'}:1: not JSON " + (
        "(Expecting property name enclosed in double quotes); if a write was interrupted there, "
        "remove that line: the run's own result.json, which the report also reads, keeps its result"
    )


@pytest.mark.parametrize("text", ["null", "[1]", '{"table": "fmnist"}'])
def test_report_names_a_run_folders_result_that_is_not_one(tmp_path: Path, text: str) -> None:
    run = tmp_path / "fashion_mnist-smso-64" / "seed0"
    run.mkdir(parents=True)
    (run / "result.json").write_text(text)
    with pytest.raises(ValueError, match=r"result\.json: not a JSON object|result\.json: the rec"):
        report("fmnist", tmp_path)


def test_a_result_after_a_torn_write_gets_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "results.jsonl"
    path.parent.mkdir()
    path.touch()  # empty: no line to end
    append_result(path, {"a": 1})
    with path.open("a") as f:
        f.write('{"a": 2, "b"')  # interrupted
    append_result(path, {"a": 3})
    assert path.read_text().splitlines() == ['{"a": 1}', '{"a": 2, "b"', '{"a": 3}']


def test_an_error_from_a_data_loader_worker_is_its_own_message(capsys) -> None:
    """The data loader re-raises a worker's error with the worker's traceback in its text."""
    text = (
        "Caught DatasetLayoutError in DataLoader worker process 0.\nOriginal Traceback (most "
        'recent call last):\n  File "x.py", line 1, in f\ntraining.datasets.base.'
        "DatasetLayoutError: cannot read image a.png (broken): replace or remove it\n"
    )

    def body() -> int:
        raise ValueError(text)

    assert run_cli("smso-train", body) == 2
    assert capsys.readouterr().err == (
        "smso-train: error: cannot read image a.png (broken): replace or remove it\n"
    )


def test_an_unreadable_image_in_a_data_loader_worker_is_one_error_line(tmp_path, capsys) -> None:
    """The real path: a worker process fails on the image and the loader re-raises it."""
    from torch.utils.data import DataLoader

    from training.datasets.base import ImageList

    bad = tmp_path / "bad.png"
    bad.write_text("not a png")
    loader = DataLoader(ImageList([(bad, 0)], ["a"]), batch_size=1, num_workers=1)
    assert run_cli("smso-train", lambda: next(iter(loader))) == 2
    assert capsys.readouterr().err == (
        f"smso-train: error: cannot read image {bad} (cannot identify image file {str(bad)!r}): "
        "replace or remove it\n"
    )


def test_report_lists_the_runs_that_have_not_finished(tmp_path: Path) -> None:
    (tmp_path / "results.jsonl").write_text(json.dumps(RESULT) + "\n")
    run = tmp_path / "fashion_mnist-mpn" / "seed1"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"epochs": 45}))
    (run / "metrics.jsonl").write_text('{"epoch": 1}\n{"epoch": 2}\n{"epo')  # mid-write
    other = tmp_path / "dtd-mpn" / "seed0"  # another table's run
    other.mkdir(parents=True)
    (other / "config.json").write_text(json.dumps({"epochs": 3}))
    text = report("fmnist", tmp_path)
    assert text.endswith(
        "Not finished yet (not in the table): MPN (iSQRT-COV) fashion_mnist seed 1 (epoch 2 of 45)."
    )
