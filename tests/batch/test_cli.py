"""The command's mistakes: each a clear line on stderr and exit status 2, no traceback, no Ray
started, nothing written; flags of one engine given to the other among them."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from batch.cli import main
from tests.batch.conftest import MODEL, write_pngs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def images(tmp_path):
    write_pngs(tmp_path / "in", 2)
    return str(tmp_path / "in")


def fails(capsys, *args: str) -> str:
    """smso-embed's one line on stderr; its status is 2."""
    capsys.readouterr()
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert err.startswith("smso-embed: ")
    assert err.count("\n") == 1
    assert "Traceback" not in err
    return err


def test_a_missing_model(capsys, images, tmp_path):
    assert "no such model file" in fails(capsys, "nope.onnx", images, "-o", str(tmp_path / "o"))


def test_a_file_that_is_not_onnx(capsys, images, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert "not a loadable ONNX model" in fails(capsys, str(bad), images, "-o", str(tmp_path / "o"))


def test_an_onnx_file_without_a_card(capsys, images, tmp_path):
    onnx = pytest.importorskip("onnx")
    model = onnx.load(MODEL)
    del model.metadata_props[:]
    bare = tmp_path / "bare.onnx"
    onnx.save(model, bare)
    assert "no model card" in fails(capsys, str(bare), images, "-o", str(tmp_path / "o"))


def test_an_empty_input_folder(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    err = fails(capsys, MODEL, str(tmp_path / "empty"), "-o", str(tmp_path / "o"))
    assert "holds no image files" in err


def test_an_output_folder_that_exists_without_resume(capsys, images, tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "x").write_text("")
    assert "pass --resume" in fails(capsys, MODEL, images, "-o", str(tmp_path / "o"))


def test_resume_into_a_folder_that_is_not_a_job(capsys, images, tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "x").write_text("")
    err = fails(capsys, MODEL, images, "-o", str(tmp_path / "o"), "--resume")
    assert "holds no smso-embed job" in err


def test_resume_with_other_flags_is_refused(capsys, images, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "_smso_embed.json").write_text(
        '{"model_name": "m", "model_version": "1", "card_sha256": "0", "embedding_dim": 64,'
        ' "top_k": 5, "normalize": true, "format": "smso-embed/1"}'
    )
    err = fails(capsys, MODEL, images, "-o", str(out), "--resume")
    assert "another job's output" in err
    assert "normalize True" in err


def test_the_console_script_and_the_extras():
    """smso-embed is installed, Ray comes with the `batch` extra (and `dev`, so `make test`
    has it), and the serving installs do not pull it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["smso-embed"] == "batch.cli:command"
    extras = project["optional-dependencies"]
    assert any(line.startswith("ray[data]==") for line in extras["batch"])
    assert "batch" in extras["dev"][0]
    for serving in ("serving", "serving-cpu", "serving-common"):
        assert not any("ray" in line or "batch" in line for line in extras[serving]), serving


def test_help_runs_without_ray_starting():
    done = subprocess.run(
        [sys.executable, "-m", "batch.cli", "--help"], capture_output=True, text=True, check=True
    )
    assert "--resume" in done.stdout
    assert "--address" in done.stdout


def test_an_output_folder_whose_name_is_not_utf8(capsys, images, tmp_path):
    out = os.fsdecode(os.fsencode(tmp_path) + b"/out\xff")
    assert "this name is not valid UTF-8" in fails(capsys, MODEL, images, "-o", out)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--actors", "2"], "--actors tune the Ray engine: add --engine ray"),
        (
            ["--engine", "local", "--decode-in-actors", "--cpus", "2"],
            "--decode-in-actors, --cpus tune the Ray engine",
        ),
        (["--actor-cpus", "0.5", "--gpus-per-actor", "1"], "--actor-cpus, --gpus-per-actor tune"),
        (["--decode-cpus", "0.5"], "--decode-cpus tune the Ray engine"),
        (["--engine", "ray", "--sessions", "2"], "--sessions tune the embedded engine, not Ray's"),
        (["--engine", "ray", "--decoders", "0"], "--decoders tune the embedded engine"),
        (["--address", "auto", "--sessions", "1"], "--sessions tune the embedded engine"),
        (
            ["--engine", "local", "--address", "auto"],
            "--address joins a Ray cluster, which --engine local does not use",
        ),
        (["--retry-errors"], "--retry-errors retries a job's errors: give it with --resume"),
    ],
)
def test_flags_that_do_not_go_together(capsys, images, tmp_path, flags, said):
    out = tmp_path / "o"
    err = fails(capsys, MODEL, images, "-o", str(out), *flags)
    assert said in err
    assert not out.exists()  # refused before OUT is touched


def test_a_negative_count_of_decoders_is_the_command_s_mistake(capsys, images, tmp_path):
    with pytest.raises(SystemExit) as raised:
        main([MODEL, images, "-o", str(tmp_path / "o"), "--decoders", "-1"])
    assert raised.value.code == 2
    assert "--decoders: -1: give 0 or a positive whole number" in capsys.readouterr().err
