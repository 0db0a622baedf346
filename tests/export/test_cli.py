"""``smso-export --help`` and ``--name``/``--version``: described flags, checked names."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest

from export.card import check_served_name
from export.cli import build_parser
from export.cli import main as export_main
from export.onnx_export import newest_opset
from tests.training.conftest import write_image_folder
from tests.training.test_cli_help import check_help
from training.checkpoint import save_checkpoint
from training.model import ModelConfig, build_model


def test_every_smso_export_flag_has_help_and_shows_its_choices():
    helps = check_help(build_parser())
    assert {"--name", "--version", "--form", "--output", "--data-root"} <= set(helps)
    assert "{conv,covariance,auto}" in build_parser().format_help()
    assert "(default: 18)" in helps["--opset"]
    assert f"18 to {newest_opset()} (what onnxruntime loads)" in helps["--opset"]


@pytest.mark.parametrize("name", ["leaves", "my-model.v2", "A_1"])
def test_a_url_segment_is_a_valid_served_name(name):
    assert check_served_name(name, "the served name") == name


@pytest.mark.parametrize("name", ["", "a/b", "..", "café", "a b", "x" * 129, "a?b"])
def test_other_names_are_refused_with_what_is_allowed(name):
    with pytest.raises(ValueError, match=r"letters, digits, '_', '\.' or '-'"):
        check_served_name(name, "the served name")


def test_a_bad_name_is_one_error_line_before_any_work(tmp_path, capsys):
    assert export_main([str(tmp_path / "missing.pt"), "--name", "my model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("smso-export: error: the served name 'my model' must be")
    assert "\n" not in err


@pytest.mark.parametrize("checkpoint", [".", "/"])
def test_a_folder_without_a_name_as_checkpoint_is_one_error_line(
    tmp_path, monkeypatch, capsys, checkpoint: str
):
    monkeypatch.chdir(tmp_path)
    assert export_main([checkpoint]) == 2  # not a traceback from Path.with_name
    err = capsys.readouterr().err.strip()
    assert err == (
        f"smso-export: error: checkpoint {checkpoint} is a folder, not a checkpoint file (.pt)"
    )
    assert list(tmp_path.iterdir()) == []


def test_an_output_under_a_file_is_refused_before_any_work(tmp_path, capsys):
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    assert export_main([str(tmp_path / "missing.pt"), "-o", str(file / "model.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"smso-export: error: the output {file / 'model.onnx'} cannot be written: {file} is a "
        "file, not a folder"
    )
    assert file.read_text() == "mine"


@pytest.mark.parametrize(
    ("report", "message"), [("[1]\n", "not a JSON object"), ('{"epoch": 1,', "not JSON")]
)
def test_a_broken_test_report_beside_the_checkpoint_is_named(
    trained_run, tmp_path, capsys, report: str, message: str
):
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.pt").write_bytes((trained_run / "best.pt").read_bytes())
    (run / "test.json").write_text(report)
    assert export_main([str(run / "best.pt"), "--no-typicality"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("smso-export: error: the test report beside the checkpoint")
    assert f"{run / 'test.json'}: {message}" in err
    assert not (run / "model.onnx").exists()


@pytest.mark.parametrize("opset", [17, 99])
def test_an_opset_outside_what_the_exporter_and_onnx_know_is_refused(tmp_path, capsys, opset):
    output = tmp_path / "m.onnx"
    args = [str(tmp_path / "missing.pt"), "-o", str(output), "--opset", str(opset)]
    assert export_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"smso-export: error: --opset must be from 18 (the exporter's minimum) to "
        f"{newest_opset()} (the newest that onnx {onnx.__version__} and onnxruntime "
        f"{ort.__version__} both load), got {opset}"
    )
    assert not output.exists()


@pytest.mark.parametrize(
    ("name", "content"), [("test.json", b'{"test_accuracy": 0.9}\n'), ("last.pt", b"PK\x03\x04")]
)
def test_an_output_that_is_not_an_onnx_model_is_never_replaced(
    trained_run, tmp_path, capsys, name: str, content: bytes
):
    other = tmp_path / name
    other.write_bytes(content)
    assert export_main([str(trained_run / "best.pt"), "-o", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"smso-export: error: the output {other} exists and is not an ONNX model, which writing "
        "it would replace: give another file name such as model.onnx (or remove the file)"
    )
    assert other.read_bytes() == content


def test_an_output_in_a_read_only_folder_is_refused_before_any_work(tmp_path, capsys, read_only):
    folder = read_only(tmp_path / "models")
    output = folder / "sub" / "model.onnx"
    # the checkpoint does not exist: the output is checked before it is read
    assert export_main([str(tmp_path / "missing.pt"), "-o", str(output)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"smso-export: error: the output {output} cannot be written: this user cannot create "
        f"files in the folder {folder} ("
    )
    assert err.endswith("); give a place you can write to")
    assert "\n" not in err
    assert ".tmp" not in err  # never the hidden name the file is staged under


@pytest.mark.parametrize("root", ["missing", "other dataset"])
def test_a_data_root_without_the_checkpoints_dataset_is_an_error(
    trained_run, tmp_path, capsys, root: str
):
    data = tmp_path / "data"
    if root == "other dataset":
        write_image_folder(data, 1, 1)
    output = tmp_path / "model.onnx"
    args = [str(trained_run / "best.pt"), "-o", str(output), "--data-root", str(data)]
    assert export_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(
        f"smso-export: error: --data-root {data} does not hold the dataset the checkpoint was "
        "trained on (fashion_mnist): expected Fashion-MNIST file train-images-idx3-ubyte"
    )
    assert err.endswith(
        "give that dataset's folder, or leave --data-root out to export without it (no parity "
        "check on real images, no typicality reference)"
    )
    assert not output.exists()


def test_a_checkpoint_that_names_fewer_classes_than_outputs_is_refused(tmp_path, capsys):
    config = ModelConfig(10, backbone="small_cnn", head="smso", head_options={"dim": 4})
    names = ["shirt", "shoe", "bag"]
    path = save_checkpoint(tmp_path / "m.pt", build_model(config), classes=names)
    assert export_main([str(path), "-o", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"smso-export: error: {path} names 3 classes for the 10 outputs of its model: a "
        "checkpoint names every output, in order (smso-train writes it so); this one was "
        "changed or not written by smso-train"
    )
    assert not (tmp_path / "m.onnx").exists()


def test_a_data_root_for_a_checkpoint_without_a_dataset_is_an_error(tmp_path, capsys):
    config = ModelConfig(10, backbone="small_cnn", head="smso", head_options={"dim": 4})
    path = save_checkpoint(tmp_path / "m.pt", build_model(config))  # no training config
    args = [str(path), "-o", str(tmp_path / "m.onnx"), "--data-root", str(tmp_path)]
    assert export_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(
        f"smso-export: error: --data-root {tmp_path} cannot be used: {path} has no training "
        "config (it was not written by smso-train), so no dataset to read; leave --data-root out"
    )
    assert not (tmp_path / "m.onnx").exists()
