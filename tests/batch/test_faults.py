"""Jobs killed mid-run lose no image and write none twice: the driver (``python -m batch.cli``)
killed with SIGKILL at a random moment once a part is written, resumed and killed again three
times, then resumed to its end, on the embedded engine and on Ray's (a driver joining the
session's Ray, as on a cluster); and a Ray worker killed mid-run, whose actor Ray restarts and
whose batches run again. (bench/embed.py's faults do the same on larger collections.)"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from batch.cli import main
from bench.embed import descendants, exactly_once
from tests.batch.conftest import (
    MODEL,
    ROOT,
    command,
    part_names,
    write_pngs,
)


def wait_for_a_part(
    out: Path, before: int, process: subprocess.Popen[str], timeout_s: float
) -> bool:
    """Whether a part more than ``before`` was written while ``process`` runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if (out / "embeddings").is_dir() and len(part_names(out)) > before:
            return True
        time.sleep(0.01)
    return False


def killed_and_resumed(
    files: list[Path], out: Path, flags: list[str], kills: int, latest_s: float, timeout_s: float
) -> dict[str, int]:
    """The same command (with --resume) started ``kills`` times, each killed with SIGKILL at a
    random moment up to ``latest_s`` after its first part, then run to its end; how many runs
    the kills stopped, and the final run's summary figures."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    args = command(MODEL, str(files[0].parent), "-o", str(out), "--resume", *flags)
    args += ["--rows-per-file", "16"]
    stopped = 0
    for kill in range(kills):
        before = len(part_names(out)) if (out / "embeddings").is_dir() else 0
        process = subprocess.Popen(
            args,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own group: whatever it started is ended with it
        )
        try:
            wait_for_a_part(out, before, process, timeout_s)
            time.sleep(rng.uniform(0, latest_s))
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            _, err = process.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if process.returncode == -signal.SIGKILL:
            stopped += 1
        else:
            assert process.returncode == 0, err
        found = exactly_once(out, files)
        assert found["repeated"] == 0, f"kill {kill} (seed {seed}): {found}"
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert exactly_once(out, files)["exactly_once"], f"seed {seed}"
    assert not list((out / "embeddings").glob(".*")), "a half-written part was left"
    return {"stopped": stopped, **{k: summary[k] for k in ("missing", "duplicates", "todo")}}


@pytest.mark.slow
def test_the_embedded_engine_killed_three_times_loses_no_image(tmp_path):
    files = write_pngs(tmp_path / "in", 4000)  # a run takes about 2 s here
    result = killed_and_resumed(files, tmp_path / "out", [], kills=3, latest_s=0.3, timeout_s=120)
    assert result["stopped"] >= 2, result  # the kills did stop runs, with images left to do
    assert (result["missing"], result["duplicates"]) == (0, 0)
    assert result["todo"] > 0


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_ray_driver_killed_three_times_loses_no_image(tmp_path):
    """Drivers joining the session's Ray (``--address``): each killed driver's actors are
    ended by Ray, the next driver's run on the same cluster."""
    import ray

    address = ray.get_runtime_context().gcs_address
    files = write_pngs(tmp_path / "in", 1500)
    flags = ["--address", address, "--decode-batch", "64", "--batch-size", "64"]
    result = killed_and_resumed(
        files, tmp_path / "out", flags, kills=3, latest_s=0.5, timeout_s=180
    )
    assert result["stopped"] >= 2, result
    assert (result["missing"], result["duplicates"]) == (0, 0)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_killed_inference_actor_loses_no_image(tmp_path):
    files = write_pngs(tmp_path / "in", 600)
    out = tmp_path / "out"
    args = [MODEL, str(tmp_path / "in"), "-o", str(out), "--no-progress", "--json"]
    args += ["--engine", "ray", "--rows-per-file", "60", "--decode-batch", "30"]
    args += ["--batch-size", "16"]
    status: list[int] = []
    job = threading.Thread(target=lambda: status.append(main(args)))
    job.start()
    killed = None
    deadline = time.monotonic() + 60
    while killed is None and job.is_alive() and time.monotonic() < deadline:
        if list((out / "embeddings").glob("part-*.parquet")):
            actors = [pid for pid, cmd in descendants(os.getpid()) if "MapWorker" in cmd]
            if actors:
                os.kill(actors[0], signal.SIGKILL)
                killed = actors[0]
        time.sleep(0.05)
    job.join(timeout=120)
    assert status == [0]
    if killed is None:
        pytest.skip("the job finished before an actor could be killed")
    assert exactly_once(out, files)["exactly_once"]
