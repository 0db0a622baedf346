"""``python -m bench.gpu``, every GPU measurement in one command: what it would run, that each
command names a module that exists, and how it reports a step's output and failure."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from bench import gpu


def test_the_default_steps_run_modules_that_exist(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu.main(["--dry-run", "--out", "/tmp/out"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "train-step",
        "train-step",
        "cuda-tests",
        "decode",
        "serve",
        "embed",
        "embed",
    ]
    args = gpu.parse_args(["fmnist-table", *gpu.DEFAULT])
    for step in gpu.steps(args).values():
        for command in step.commands:
            assert command[:2] == [sys.executable, "-m"]
            assert importlib.util.find_spec(command[2]) is not None, command


def test_the_table_step_is_resumable_and_runs_on_the_gpu_in_float32() -> None:
    args = gpu.parse_args(["fmnist-table", "--jobs", "14", "--runs", "/tmp/r"])
    run, report = gpu.steps(args)["fmnist-table"].commands
    assert run[3:5] == ["run", "fmnist"]
    flags = " ".join(run[5:])
    for expected in ("--resume", "--device cuda", "--amp off", "--jobs 14", "--out /tmp/r"):
        assert expected in flags
    assert report[3:] == ["report", "fmnist", "--out", "/tmp/r"]


def test_an_unknown_step_is_refused_with_the_steps(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        gpu.main(["turbo"])
    assert stopped.value.code == 2
    assert "no step turbo; the steps: train-step, cuda-tests" in capsys.readouterr().err


def test_without_a_driver_nothing_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu.main(["--out", str(tmp_path / "out")]) == 2
    assert "needs a CUDA machine" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_step_logs_its_output_and_stops_at_its_first_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def say(text: str, code: int = 0) -> list[str]:
        return [sys.executable, "-c", f"print({text!r}); raise SystemExit({code})"]

    step = gpu.Step("demo", [say("one"), say("two", 3), say("three")])
    assert gpu.run_step(step, tmp_path) == 3
    assert (tmp_path / "demo.log").read_text() == "one\ntwo\n"
    assert "three" not in capsys.readouterr().out
