"""A user's mistakes against smso-train, smso-eval, smso-recalibrate, smso-experiment and
smso-figure: one error line naming what is wrong and what is accepted, exit status 2, no
traceback, and no file of the user's overwritten."""

from __future__ import annotations

import dataclasses
import errno
import json
import subprocess
import sys
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import torch

from tests.training.conftest import write_idx, write_image_folder
from tests.training.test_train import tiny_config
from training.backbones import PretrainedWeightsError, create_backbone, pretrained_state
from training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from training.config import ConfigError, parse_train_config
from training.datasets import DatasetLayoutError, load_splits
from training.datasets.base import read_lines
from training.datasets.fashion_mnist import read_idx
from training.evaluate import main as eval_main
from training.experiments import main as experiment_main
from training.experiments import report
from training.figures import main as figure_main
from training.heads import HEADS, HeadOptionError, create_head
from training.json_lines import read_json_lines
from training.model import ModelConfig, build_model
from training.outputs import OutputError, write_atomically
from training.recalibrate import main as recalibrate_main
from training.train import fit
from training.train import main as train_main


def one_error_line(capsys: pytest.CaptureFixture[str], prog: str) -> str:
    """The captured stderr, checked to be one ``prog: error:`` line."""
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{prog}: error:"), err
    assert "\n" not in err, err
    assert "Traceback" not in err, err
    return err


# --- smso-train: settings -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("lr = inf\n", "lr must be a finite number > 0"),
        ("lr = nan\n", "lr must be a finite number > 0"),
        ("momentum = -1.0\n", r"momentum must be in \[0, 1\)"),
        ("weight_decay = -0.1\n", "weight_decay must be a finite number >= 0"),
        ("new_layer_lr_mult = -1.0\n", "new_layer_lr_mult must be a finite number > 0"),
        ("plateau_factor = 2.0\n", r"plateau_factor must be in \(0, 1\)"),
        ("plateau_patience = -1\n", "plateau_patience must be >= 0"),
        ("seed = -1\n", "seed must be >= 0"),
        ('data_root = ""\n', "data_root is empty: give the dataset's folder"),
        ('out = ""\n', r"out is empty: give the run's folder, such as runs/NAME"),
        ('out = "  "\n', r"out is empty: give the run's folder"),
        ('pretrained = ""\n', "pretrained is empty: give 'imagenet' or a weights file, or"),
        ('init_from = ""\n', "init_from is empty: give a checkpoint written by smso-train"),
    ],
)
def test_out_of_range_settings_are_named_with_their_range(tmp_path, content: str, message: str):
    path = tmp_path / "run.toml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        parse_train_config(["--config", str(path)])


def test_a_config_file_that_is_binary_or_a_folder_is_named(tmp_path):
    binary = tmp_path / "run.toml"
    binary.write_bytes(b"\x8e\xff\x00 random bytes")
    with pytest.raises(ConfigError, match=r"run.toml: it is not text \(UTF-8\); give a TOML"):
        parse_train_config(["--config", str(binary)])
    folder = tmp_path / "configs.toml"
    folder.mkdir()
    with pytest.raises(ConfigError, match="is a folder: give a TOML or JSON file"):
        parse_train_config(["--config", str(folder)])


def test_a_head_too_large_for_memory_is_named_and_leaves_no_run_folder(
    tiny_fashion_mnist, tmp_path, capsys
):
    out = tmp_path / "run"
    args = ["--dataset", "fashion_mnist", "--data-root", str(tiny_fashion_mnist)]
    # a projection of 10^13 x 64 floats: no machine has the 2.3 PiB it asks for
    args += ["--head", "smso", "--head-options", '{"dim": 10000000000000}', "--out", str(out)]
    assert train_main([*args, "--val-size", "40", "--epochs", "1", "--workers", "0"]) == 2
    err = one_error_line(capsys, "smso-train")
    assert "out of CPU memory (one allocation of" in err
    assert "a smaller head (head_options dim, reduce_dim), batch_size or image_size" in err
    assert "more than is free on this machine (other processes' use counts too)" in err
    assert not out.exists()


def test_an_image_size_the_model_cannot_run_on_is_named_before_the_run_folder(
    tiny_fashion_mnist, tmp_path, capsys
):
    out = tmp_path / "run"
    args = ["--dataset", "fashion_mnist", "--data-root", str(tiny_fashion_mnist)]
    args += ["--val-size", "40", "--image-size", "4", "--out", str(out), "--workers", "0"]
    assert train_main(args) == 2
    err = one_error_line(capsys, "smso-train")
    assert "image_size 4: the model cannot run on 4 x 4 crops (SMSOPooling needs at least 2" in err
    assert err.endswith("give a larger image_size")
    assert not out.exists()


def test_a_forward_error_that_is_not_about_the_size_is_not_blamed_on_image_size():
    from training.datasets import PRESETS
    from training.model import SecondOrderNet
    from training.runtime import setup_runtime
    from training.train import _check_input_size

    class Broken(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("CUDA error: no kernel image is available for execution")

    broken = cast(SecondOrderNet, Broken())  # a stand-in: only its forward is called
    with pytest.raises(RuntimeError, match="no kernel image"):
        _check_input_size(broken, PRESETS["fashion_mnist"], setup_runtime("cpu", "off"))


def test_eval_json_to_a_pipe_is_written_not_read_first(tmp_path):
    """``--json /dev/stdout | jq``: the check of what the file holds must not read a pipe."""
    import os
    import threading

    from training.evaluate import EARLIER_REPORT
    from training.outputs import check_output_file

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    args = (fifo, "--json", (), EARLIER_REPORT)
    checked = threading.Thread(target=check_output_file, args=args, daemon=True)
    checked.start()
    checked.join(5)
    if checked.is_alive():  # blocked opening the pipe: let it go
        with fifo.open("wb"):
            pass
        pytest.fail("the check opened the pipe to read it")


def test_out_of_memory_is_told_from_other_runtime_errors():
    from training.cli import _out_of_memory_message, out_of_memory, run_cli

    cuda = RuntimeError(
        "CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.11 GiB total capacity)"
    )
    assert out_of_memory(cuda)
    assert _out_of_memory_message(cuda).startswith("out of GPU memory (one allocation of 20 GiB)")
    assert not out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))

    def bug() -> int:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):  # a bug still shows its traceback
        run_cli("smso-train", bug)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ('{"dim": 1.5}', "head 'smso': option dim must be a whole number, got 1.5"),
        ('{"dim": "64"}', "head 'smso': option dim must be a whole number, got '64'"),
        ('{"dim": true}', "head 'smso': option dim must be a whole number, got True"),
        ('{"form": "fast"}', "head 'smso': option form must be one of 'conv', 'covariance', got"),
        ('{"momentum": "x"}', "head 'smso': option momentum must be a number or null, got 'x'"),
    ],
)
def test_a_head_option_of_the_wrong_type_is_named_with_the_type_it_takes(
    tiny_fashion_mnist, tmp_path, capsys, options: str, message: str
):
    out = tmp_path / "run"
    args = ["--data-root", str(tiny_fashion_mnist), "--val-size", "40", "--workers", "0"]
    assert train_main([*args, "--head-options", options, "--out", str(out)]) == 2
    assert one_error_line(capsys, "smso-train").startswith(f"smso-train: error: {message}")
    assert not out.exists()


@pytest.mark.parametrize("head", sorted(HEADS))
def test_every_head_names_an_option_of_the_wrong_type(head: str):
    """A list fits no option's type: each annotated option of every registered head is
    refused with its name and the type it takes, not with an error from inside torch."""
    import inspect

    factory = HEADS[head].factory
    options = list(inspect.signature(factory, eval_str=True).parameters.values())[1:]
    checked = [p.name for p in options if p.annotation is not p.empty and p.name != "num_classes"]
    for option in checked:
        with pytest.raises(HeadOptionError, match=rf"^head '{head}': option {option} must be "):
            create_head(head, 8, **{option: [1]})


# --- smso-train: --pretrained -----------------------------------------------------------------


def _tiny_checkpoint(path: Path) -> Path:
    config = ModelConfig(10, backbone="small_cnn", head="smso", head_options={"dim": 4})
    return save_checkpoint(path, build_model(config))


def _write(kind: str, path: Path) -> Path:
    """A file (or folder) at ``path`` that is not a weights file, of the kind named."""
    if kind == "folder":
        path.mkdir()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "random":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 3000, np.uint8).tobytes())
    elif kind == "truncated":
        whole = _tiny_checkpoint(path.with_name("whole.pt")).read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    elif kind == "pickled module":
        torch.save(torch.nn.Linear(2, 2), path)
    elif kind == "checkpoint":
        _tiny_checkpoint(path)
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("folder", r"^pretrained weights file .*w\.pt is a folder: give 'imagenet' or a \.pt/"),
        ("empty", r"^pretrained weights file .*w\.pt is not a PyTorch file: it is empty; give"),
        ("random", r"^pretrained weights file .*w\.pt is not a PyTorch file: it starts with b'"),
        ("truncated", r"^cannot read pretrained weights from .*w\.pt \(corrupt or truncated"),
        ("pickled module", r"do not unpickle as data \(Unsupported global: .*Linear was not"),
        (
            "checkpoint",
            r"a checkpoint written by smso-train, .* pass it as init_from \(--init-from\)",
        ),
    ],
)
def test_pretrained_weights_that_are_not_a_state_dict_are_named_in_one_line(
    tmp_path, kind: str, message: str
):
    path = _write(kind, tmp_path / "w.pt")
    with pytest.raises(PretrainedWeightsError, match=message) as error:
        pretrained_state("small_cnn", path)
    text = str(error.value)
    assert "\n" not in text
    assert "weights_only" not in text  # torch's advice to load untrusted files with code
    assert "or the backbone's state dict" in text or "--init-from" in text


def test_an_smso_checkpoint_as_pretrained_points_to_init_from(tiny_fashion_mnist, tmp_path, capsys):
    checkpoint = _tiny_checkpoint(tmp_path / "best.pt")
    args = ["--data-root", str(tiny_fashion_mnist), "--val-size", "40", "--workers", "0"]
    assert train_main([*args, "--pretrained", str(checkpoint), "--out", str(tmp_path / "r")]) == 2
    err = one_error_line(capsys, "smso-train")
    assert f"{checkpoint} is a checkpoint written by smso-train, not a state dict" in err
    assert "pass it as init_from (--init-from) instead of pretrained" in err


def test_pretrained_weights_that_do_not_fit_say_how(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({"0.weight": torch.zeros(3)}, path)
    with pytest.raises(PretrainedWeightsError) as error:
        create_backbone("small_cnn", path)
    assert str(error.value) == (
        f"weights from {path} do not fit backbone 'small_cnn' (as the backbone: 29 of its 30 "
        "entries missing (first '1.weight'), 1 of another shape (first: 0.weight is (3,), not "
        "(32, 1, 3, 3)))"
    )


# --- smso-train: the run folder ---------------------------------------------------------------


def test_a_folder_of_results_without_last_pt_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "model"  # e.g. what `python -m training.ship` wrote: no last.pt
    out.mkdir()
    files = {"config.json": '{"epochs": 45}\n', "metrics.jsonl": '{"epoch": 1}\n'}
    files["test.json"] = '{"test_accuracy": 0.93}\n'
    for name, text in files.items():
        (out / name).write_text(text)
    args = ["--data-root", str(tmp_path / "no-data"), "--out", str(out)]
    assert train_main(args) == 2
    err = one_error_line(capsys, "smso-train")
    assert "already holds a run; pass --resume or choose another --out" in err
    assert "test.json" in err
    assert {name: (out / name).read_text() for name in files} == files


@pytest.mark.parametrize("metrics", ["", '{"epoch": 1}\n'])
def test_a_folder_of_a_run_stopped_before_its_first_last_pt_can_be_reused(tmp_path, metrics):
    from training.train import _check_run_folder

    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text("{}\n")
    # diverged or stopped in epoch 1, or stopped between epoch 1's line and its last.pt
    (out / "metrics.jsonl").write_text(metrics)
    _check_run_folder(tiny_config(tmp_path, out))  # no error: nothing there to resume


@pytest.mark.parametrize("under_a_file", [False, True])
def test_an_out_that_is_or_is_under_a_file_is_refused_before_any_work(
    tmp_path, capsys, under_a_file: bool
):
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    out = file / "run" if under_a_file else file
    # no dataset at --data-root: the error comes before any data is read
    assert train_main(["--data-root", str(tmp_path / "none"), "--out", str(out)]) == 2
    err = one_error_line(capsys, "smso-train")
    expected = f"{file} is a file, not a folder" if under_a_file else "is a file: give a folder"
    assert expected in err
    assert file.read_text() == "mine"


@pytest.fixture
def stopped_run(tiny_fashion_mnist: Path, tmp_path: Path):
    """A run of 2 epochs stopped after the first, and its config to resume it."""
    cfg = tiny_config(tiny_fashion_mnist, tmp_path / "run", epochs=2, stop_after=1)
    fit(cfg)
    return dataclasses.replace(cfg, stop_after=None, resume=True)


def test_resume_drops_a_metrics_line_cut_short_and_names_any_other_bad_line(stopped_run):
    metrics = Path(stopped_run.out) / "metrics.jsonl"
    good = metrics.read_text()
    metrics.write_text(good + '{"epoch": 1, "comment"}\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl:2: not JSON .*remove that line"):
        fit(stopped_run)
    metrics.write_text(good + '{"loss": 1.0}\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl:2: not an epoch's record"):
        fit(stopped_run)
    metrics.write_text(good + '{"epoch": 2, "train_lo')  # interrupted while writing epoch 2
    assert fit(stopped_run).epochs_run == 1
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [line["epoch"] for line in lines] == [1, 2]


# --- datasets -------------------------------------------------------------------------------


def test_an_idx_file_that_ends_inside_its_header_is_named(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(b"\x00\x00\x08\x03\x00\x00")
    with pytest.raises(DatasetLayoutError, match="is truncated: its header names 3 dimensions"):
        read_idx(path)


def test_a_split_list_that_is_not_text_is_named(tmp_path):
    path = tmp_path / "train1.txt"
    path.write_bytes(b"\x80\x81\xff\n")
    with pytest.raises(DatasetLayoutError, match=r"train1.txt to be a text file \(UTF-8\)"):
        read_lines(path, "DTD's split list")


def test_a_broken_test_image_is_named_before_training_not_after(tmp_path, capsys):
    root = write_image_folder(tmp_path / "images", 3, 1)
    broken = next((root / "test").rglob("*.png"))
    broken.write_bytes(b"")
    out = tmp_path / "r"
    args = ["--dataset", "image_folder", "--data-root", str(root), "--out", str(out)]
    assert train_main(args) == 2
    err = one_error_line(capsys, "smso-train")
    assert f"1 image file(s) cannot be read: test: {broken} (cannot identify image file" in err
    assert not out.exists()  # no epoch was trained


def test_an_image_folder_whose_test_folders_hold_no_images_is_a_layout_error(tmp_path, capsys):
    root = write_image_folder(tmp_path / "images", 3, 1)
    for image in (root / "test").rglob("*.png"):
        image.unlink()
    with pytest.raises(DatasetLayoutError, match="expected images in the class folders of"):
        load_splits("image_folder", root)
    args = ["--dataset", "image_folder", "--data-root", str(root), "--out", str(tmp_path / "r")]
    assert train_main(args) == 2  # not exit 0 with "test accuracy: 0.0000 on 0 images"
    assert "found none (images end in .bmp" in one_error_line(capsys, "smso-train")


def test_a_dataset_with_an_empty_split_is_a_layout_error(tiny_fashion_mnist, tmp_path):
    root = tmp_path / "fmnist"
    root.mkdir()
    for path in tiny_fashion_mnist.iterdir():
        (root / path.name).write_bytes(path.read_bytes())
    write_idx(root / "t10k-images-idx3-ubyte.gz", np.zeros((0, 28, 28), np.uint8))
    write_idx(root / "t10k-labels-idx1-ubyte.gz", np.zeros((0,), np.uint8))
    with pytest.raises(DatasetLayoutError, match=r"the test split of fashion_mnist in .* has no"):
        load_splits("fashion_mnist", root, val_size=40)


# --- checkpoints ------------------------------------------------------------------------------


def test_an_onnx_file_given_as_a_checkpoint_is_named_as_one(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x0a\x12\x0bsmso-export")  # ir_version 10, producer_name
    with pytest.raises(CheckpointError, match=r"like an ONNX model .*give the \.pt checkpoint"):
        load_checkpoint(path)


# --- smso-eval and smso-recalibrate: outputs --------------------------------------------------


def test_eval_json_is_checked_before_the_evaluation_and_never_replaces_the_checkpoint(
    tmp_path, capsys
):
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"PK\x03\x04 stands in for a checkpoint")
    assert eval_main([str(checkpoint), "--json", str(checkpoint)]) == 2
    assert "is the input file" in one_error_line(capsys, "smso-eval")
    assert checkpoint.read_bytes() == b"PK\x03\x04 stands in for a checkpoint"
    assert eval_main([str(checkpoint), "--json", str(tmp_path)]) == 2
    assert f"--json {tmp_path} is a folder" in one_error_line(capsys, "smso-eval")
    assert eval_main([str(checkpoint), "--json", str(checkpoint / "x.json")]) == 2
    assert f"{checkpoint} is a file, not a folder" in one_error_line(capsys, "smso-eval")


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("last.pt", b"PK\x03\x04 stands in for a checkpoint"),
        ("config.json", b'{"epochs": 45}\n'),
        ("notes.txt", b"mine"),
    ],
)
def test_eval_json_never_replaces_a_file_that_is_not_an_earlier_report(
    tmp_path, capsys, name: str, content: bytes
):
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"PK\x03\x04 stands in for a checkpoint")
    other = tmp_path / name
    other.write_bytes(content)
    assert eval_main([str(checkpoint), "--json", str(other)]) == 2
    err = one_error_line(capsys, "smso-eval")
    assert f"--json {other} exists and is not an earlier smso-eval report" in err
    assert other.read_bytes() == content


def test_eval_json_replaces_an_earlier_report(tiny_fashion_mnist, tmp_path):
    fit(tiny_config(tiny_fashion_mnist, tmp_path / "run", epochs=1))
    report = tmp_path / "eval.json"
    args = [str(tmp_path / "run" / "best.pt"), "--split", "val", "--workers", "0"]
    args += ["--json", str(report)]
    assert eval_main(args) == 0
    first = json.loads(report.read_text())
    assert eval_main(args) == 0  # over its own earlier report
    assert json.loads(report.read_text()) == first


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--batch-size", "0", "argument --batch-size: must be 1 or more, got 0"),
        ("--batch-size", "many", "argument --batch-size: not a whole number: 'many'"),
        ("--workers", "-1", "argument --workers: must be 0 or more, got -1"),
    ],
)
@pytest.mark.parametrize("command", ["smso-eval", "smso-recalibrate"])
def test_eval_and_recalibrate_name_a_batch_size_or_worker_count_out_of_range(
    tmp_path, capsys, command: str, flag: str, value: str, message: str
):
    main = eval_main if command == "smso-eval" else recalibrate_main
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "best.pt"), flag, value])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_recalibrate_out_is_checked_before_the_work(tmp_path, capsys):
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"PK\x03\x04")
    assert recalibrate_main([str(checkpoint), "-o", str(tmp_path)]) == 2
    assert f"the output {tmp_path} is a folder" in one_error_line(capsys, "smso-recalibrate")
    assert recalibrate_main([str(checkpoint), "-o", str(checkpoint / "x.pt")]) == 2
    assert "is a file, not a folder" in one_error_line(capsys, "smso-recalibrate")


# --- every output: a place this user cannot write to --------------------------------------------


@pytest.mark.parametrize("command", ["smso-train", "smso-eval", "smso-recalibrate", "smso-figure"])
def test_an_output_in_a_read_only_folder_is_refused_before_any_work(
    tmp_path, capsys, read_only, command: str
):
    folder = read_only(tmp_path / "shared")
    missing = str(tmp_path / "missing.pt")  # nothing to read: the output is checked first
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"epoch": 1, "train_loss": 1.0, "val_loss": 1.0}\n')
    main, args = {
        "smso-train": (train_main, ["--data-root", str(tmp_path), "--out", str(folder / "r")]),
        "smso-eval": (eval_main, [missing, "--json", str(folder / "sub" / "eval.json")]),
        "smso-recalibrate": (recalibrate_main, [missing, "-o", str(folder / "recalibrated.pt")]),
        "smso-figure": (figure_main, ["fig3", str(metrics), "--out", str(folder / "loss.png")]),
    }[command]
    assert main(args) == 2
    err = one_error_line(capsys, command)
    assert f"cannot be written: this user cannot create files in the folder {folder} (" in err
    assert err.endswith("); give a place you can write to")
    assert list(folder.iterdir()) == []


def test_a_failed_write_names_the_output_and_leaves_the_old_file(tmp_path):
    path = tmp_path / "best.pt"
    path.write_bytes(b"the earlier checkpoint")

    def disk_full(file):
        file.write(b"half of it")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OutputError) as error:
        write_atomically(path, disk_full)
    assert str(error.value) == (
        f"cannot write {path}: No space left on device (in {tmp_path}); the file there is unchanged"
    )
    assert path.read_bytes() == b"the earlier checkpoint"
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"]  # no hidden half-written file


def test_a_write_error_no_check_foresaw_is_one_line(tmp_path, capsys):
    from training.cli import run_cli

    def read_only_file_system() -> int:
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "test.json"))

    assert run_cli("smso-train", read_only_file_system) == 2
    err = one_error_line(capsys, "smso-train")
    assert err == f"smso-train: error: cannot write {tmp_path / 'test.json'}: Read-only file system"


def test_a_reader_that_stops_reading_is_not_a_traceback():
    """``smso-experiment report | head -1``: the reader closes the pipe while the script still
    writes; the script stops quietly (status 1, as Python's docs advise), with no traceback
    from the write or from the interpreter's flush at exit."""
    script = (
        "import sys\n"
        "from training.cli import run_cli\n"
        "def body():\n"
        "    for i in range(200_000):\n"
        "        print('row', i)\n"
        "    return 0\n"
        "sys.exit(run_cli('smso-eval', body))\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.stdout is not None
    assert child.stdout.readline() == b"row 0\n"
    child.stdout.close()  # what head does after its first line
    _, err = child.communicate(timeout=60)
    assert (child.returncode, err.decode()) == (1, "")


def test_a_broken_pipe_that_is_not_standard_output_is_not_hidden(capsys):
    from training.cli import run_cli

    def worker_pipe_broke() -> int:  # a data loader's pipe, a socket: a bug to show
        print("half a report")
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        run_cli("smso-train", worker_pipe_broke)
    assert capsys.readouterr().out == "half a report\n"


# --- smso-experiment ----------------------------------------------------------------------------

RESULT = {
    "table": "fmnist",
    "row": "first-order",
    "label": "first-order (GAP)",
    "dataset": "fashion_mnist",
    "seed": 0,
    "test_accuracy": 0.1,
    "best_val_accuracy": 0.12,
    "feature_dim": 128,
    "head_parameters": 1290,
    "train_seconds": 2.0,
    "median_epoch_seconds": 2.0,
    "images_per_second": 65.0,
    "device": "cpu",
    "epochs": 1,
    "paper": None,
}


@pytest.mark.parametrize("text", ["[]\n", '{"epochs": 4', "\x80"])
def test_resume_names_a_run_folder_file_that_is_not_a_json_object(tmp_path, capsys, text: str):
    run = tmp_path / "fashion_mnist-first-order" / "seed0"
    run.mkdir(parents=True)
    (run / "config.json").write_bytes(text.encode("latin-1"))
    argv = ["run", "fmnist", "first-order", "--out", str(tmp_path), "--resume"]
    assert experiment_main(argv) == 2
    assert f"{run / 'config.json'}: not " in one_error_line(capsys, "smso-experiment")


def test_resume_names_a_result_json_that_is_not_a_result(tmp_path, capsys):
    from training.experiments import find_row, row_config

    cfg = row_config("fmnist", find_row("fmnist", "first-order"), None, tmp_path)
    run = Path(cfg.out)
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(cfg.resolve().to_dict()))
    (run / "result.json").write_text("[1]\n")
    argv = ["run", "fmnist", "first-order", "--out", str(tmp_path), "--resume"]
    assert experiment_main(argv) == 2
    assert "result.json: not a JSON object" in one_error_line(capsys, "smso-experiment")


def test_report_names_an_unfinished_run_whose_config_is_not_a_json_object(tmp_path):
    done = tmp_path / "fashion_mnist-first-order" / "seed0"
    done.mkdir(parents=True)
    (done / "result.json").write_text(json.dumps(RESULT))
    assert "first-order (GAP)" in report("fmnist", tmp_path)
    unfinished = tmp_path / "fashion_mnist-bp" / "seed0"
    unfinished.mkdir(parents=True)
    (unfinished / "config.json").write_text("[1]\n")
    with pytest.raises(ValueError, match=r"bp/seed0/config\.json: not a JSON object"):
        report("fmnist", tmp_path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fmnist", "bp", "--seeds", "0", "1", "0"], "seed 0 given more than once"),
        (["fmnist", "bp", "mpn", "bp"], "row bp given more than once"),
        (
            ["table1", "bp", "--dataset", "dtd", "--scratch", "--pretrained", "w.pth"],
            "--scratch (random initialisation) and --pretrained (weights from a file) contradict",
        ),
        (["fmnist", "bp", "--dataset", "dtd"], "the fmnist table trains on fashion_mnist"),
    ],
)
def test_contradicting_run_arguments_are_refused_before_any_run(
    tmp_path, capsys, args: list[str], message: str
):
    assert experiment_main(["run", *args, "--out", str(tmp_path)]) == 2
    assert message in one_error_line(capsys, "smso-experiment")
    assert list(tmp_path.iterdir()) == []


def test_a_json_lines_file_that_is_not_text_is_named(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_bytes(b"\x80\x81\n")
    with pytest.raises(ValueError, match=r"results.jsonl: not a text file \(byte 0 is not UTF-8\)"):
        read_json_lines(path)


# --- smso-figure ----------------------------------------------------------------------------------


def test_figure_out_is_checked_before_the_work(tmp_path, capsys):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"epoch": 1, "train_loss": 1.0, "val_loss": 1.0}\n')
    assert figure_main(["fig3", str(metrics), "--out", str(tmp_path)]) == 2
    assert "is a folder: give a file name" in one_error_line(capsys, "smso-figure")
    assert not tmp_path.with_suffix(".png").exists()  # matplotlib's name for a suffix-less one
    assert figure_main(["fig3", str(metrics), "--out", str(tmp_path / "loss")]) == 2
    assert "give an image file name ending in one of" in one_error_line(capsys, "smso-figure")
    assert figure_main(["fig3", str(metrics), "--out", str(metrics)]) == 2
    assert "is the input file" in one_error_line(capsys, "smso-figure")
    assert metrics.read_text().startswith('{"epoch": 1')


def test_fig2_never_writes_its_numbers_over_another_json_file(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.pt").write_bytes(b"PK\x03\x04")
    (run / "config.json").write_text('{"epochs": 45}\n')
    argv = ["fig2", str(run / "best.pt"), "--out", str(run / "config.png")]
    assert figure_main(argv) == 2
    err = one_error_line(capsys, "smso-figure")
    assert f"the numbers' file (beside --out) {run / 'config.json'} exists and is not an " in err
    assert "earlier fig2's numbers, which writing it would replace: give another --out" in err
    assert (run / "config.json").read_text() == '{"epochs": 45}\n'
