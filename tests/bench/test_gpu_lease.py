"""bench/gpu_lease.sh, the lent GPU machine's four calls: what it checks before it spends them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench import ROOT


def run_lease(step: str, repo: Path, lease: Path) -> subprocess.CompletedProcess[str]:
    """``bash bench/gpu_lease.sh STEP`` in ``repo`` with what the calls leave in ``lease``; this
    interpreter first on ``PATH``, as if step 1 had installed the wheels (fastapi, uvicorn...)."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_lease.sh"), step],
        cwd=repo,
        env=os.environ | {"LEASE_TMP": str(lease), "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("step", "stage", "message"),
    [
        ("4", {"part4": ["ort.part.03"]}, "missing ort.part.00 ort.part.01 ort.part.02"),
        ("5", {}, "STEP must be 1, 2, 3 or 4"),
    ],
)
def test_the_gpu_lease_says_what_did_not_arrive(
    step: str, stage: dict[str, list[str]], message: str, tmp_path: Path
) -> None:
    """Step 4 of bench/gpu_lease.sh checks what the earlier calls left before it spends the
    lease: a machine given back in between loses them."""
    repo = tmp_path / "repo"
    for part, files in stage.items():
        (repo / ".gpu-stage" / part).mkdir(parents=True)
        for name in files:
            (repo / ".gpu-stage" / part / name).write_bytes(b"zstd")
    repo.mkdir(exist_ok=True)
    proc = run_lease(step, repo, tmp_path / "lease")
    assert proc.returncode == 1
    assert message in proc.stderr


def test_the_gpu_lease_stops_when_step_1s_exports_failed(tmp_path: Path) -> None:
    """Step 4 does not spend the lease on exports that already failed once."""
    repo, lease = tmp_path / "repo", tmp_path / "lease"
    (repo / ".gpu-stage" / "part4").mkdir(parents=True)
    (lease / "ort-parts").mkdir(parents=True)
    for i in range(4):
        (lease / "ort-parts" / f"ort.part.0{i}").write_bytes(b"zstd")
    (lease / "serve-gpu-models").mkdir()
    (lease / "serve-gpu-models" / "status").write_text("1\n")
    (lease / "export.log").write_text("Traceback ...\nRuntimeError: out of memory\n")
    proc = run_lease("4", repo, lease)
    assert proc.returncode == 1, proc.stderr
    assert "the exports failed (status 1)" in proc.stderr
    assert "out of memory" in proc.stdout  # the log's end, shown
    assert (lease / "gpu-out" / "export.log").is_file()  # and kept with the results
