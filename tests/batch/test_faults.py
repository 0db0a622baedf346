"""A Ray worker killed mid-run: Ray restarts the actor, its batches run again, and every image
is in OUT exactly once. (bench/embed.py's faults do the same, and a stop with Ctrl-C followed by
--resume, on a Ray of the command's own.)"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from batch.cli import main
from bench.embed import descendants, exactly_once
from tests.batch.conftest import MODEL, write_pngs

pytestmark = [pytest.mark.usefixtures("ray_cluster"), pytest.mark.slow]


def test_a_killed_inference_actor_loses_no_image(tmp_path):
    files = write_pngs(tmp_path / "in", 600)
    out = tmp_path / "out"
    args = [MODEL, str(tmp_path / "in"), "-o", str(out), "--no-progress", "--json"]
    args += ["--rows-per-file", "60", "--decode-batch", "30", "--batch-size", "16"]
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
