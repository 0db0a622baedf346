"""``python -m bench.serve_gpu``: every stage tiny on the CPU (``--smoke``), its refusals of bad
runs, and the CUDA MPS variant's daemon."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.lib import gpu
from tests.bench import cells, run_script


@pytest.mark.slow
def test_gpu_serve_benchmark_runs_every_stage_on_the_cpu(tmp_path: Path) -> None:
    """--smoke: the one-go GPU measurement, tiny, with the shipped model."""
    servers = ["cuda", "workers-graphs", "workers-shared-graphs"]
    proc = run_script("bench.serve_gpu", "--smoke", "--out", str(tmp_path), "--servers", *servers)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "serve_gpu.json").read_text())
    assert report["skipped"] == []
    assert {"fp32-conv/plain", "fp32-conv/io-binding", "fp32-conv/cuda-graphs"} <= set(
        report["raw"]
    )
    assert all("by_batch" in run for run in report["raw"].values())
    assert all(
        "run" in row["stages_ms_p50"]
        for run in report["raw"].values()
        for row in run["by_batch"].values()
    )
    assert report["ort_profile"]["ms_per_run_by_op"]
    assert set(report["server"]) == set(servers)
    for variant in report["server"]:
        loads = report["server"][variant]["loads"]
        assert len(loads) == 4  # two routes at concurrency 1 and 4
        assert "error" not in report["server"][variant], report["server"][variant]["error"]
        assert all(load["failures"] == 0 and load["requests"] > 0 for load in loads)
        assert all(
            set(load["split"]) >= {"decode_ms", "queue_ms", "inference_ms", "round_trip_ms"}
            for load in loads
        )
        assert all({"stack", "run"} <= set(load["split"]["stage_ms"]) for load in loads)
        # the cores each load kept busy: the server's processes served it, on this machine
        assert all(0 < load["cpu"]["server_cores"] <= load["cpu"]["cores"] for load in loads)
    assert {row["kind"] for row in report["decoding"]["rows"]} == {"threads", "processes"}
    table = (tmp_path / "serve_gpu.md").read_text()
    headers = [cells(line) for line in table.splitlines() if line.startswith("| route ")]
    assert ["route", "clients", "req/s"] in [header[:3] for header in headers]
    stages = ["route", "clients", "mean batch", "stack", "handoff", "share", "upload", "run"]
    assert stages in [header[:8] for header in headers]
    # the shared session's batches went through the host: its share of each batch is timed
    shared = report["server"]["workers-shared-graphs"]["loads"]
    assert all({"handoff", "share", "run"} <= set(load["split"]["stage_ms"]) for load in shared)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--raw", "fp32-conv"], "--raw fp32-conv: expected EXPORT/MODE"),
        (["--raw", "fp32-conv/turbo"], "MODE one of plain, io-binding, cuda-graphs"),
        (["--exports", "fp64-conv"], "invalid choice: 'fp64-conv'"),
        (["--servers", "tensorrt"], "invalid choice: 'tensorrt'"),
        (["--exports", "fp32-conv"], "leaves out fp16-conv, which --raw or --servers use"),
        (
            ["--exports", "fp16-conv", "--servers", "cuda", "--raw", "fp32-conv-448/plain"],
            "leaves out fp32-conv-448",
        ),
    ],
)
def test_gpu_serve_benchmark_refuses_bad_runs_before_it_starts(
    flags: list[str], message: str, tmp_path: Path
) -> None:
    """A typo would otherwise abort a GPU run part-way (or measure the wrong thing): it is
    refused at once, with what is accepted."""
    proc = run_script("bench.serve_gpu", "--out", str(tmp_path), *flags)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not (tmp_path / "serve_gpu.json").exists()


def test_the_mps_variant_starts_and_quits_a_daemon_or_says_why_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.serve_gpu's MPS variant: the control daemon is started with its pipe folder,
    the server gets that folder, and the daemon is told to quit afterwards; without the
    binary, a clear error (recorded as the variant's error)."""
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(RuntimeError, match="not on PATH"), gpu.mps(tmp_path / "m"):
        pass
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir()
    # shell builtins only: PATH holds this folder alone
    script = f'read -r line\necho "$* pipe=$CUDA_MPS_PIPE_DIRECTORY stdin=$line" >> {calls}\n'
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    with gpu.mps(tmp_path / "m") as env:
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "m" / "pipe")
        assert Path(env["CUDA_MPS_PIPE_DIRECTORY"]).is_dir()
    started, quit_ = calls.read_text().splitlines()
    assert started.startswith(f"-d pipe={tmp_path / 'm' / 'pipe'}")
    assert quit_ == f" pipe={tmp_path / 'm' / 'pipe'} stdin=quit"
