"""One job at a time on an output folder: a second job is refused in one line (exit status 2)
before it reads or writes anything, and a job killed with SIGKILL leaves no lock behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from batch.cli import main
from batch.inputs import locate
from batch.lock import OutputInUseError, hold
from batch.outputs import LOCK, MANIFEST, JobManifest, prepare
from tests.batch.conftest import MODEL, write_pngs

HOLDER = """
import sys, time
from batch.inputs import locate
from batch.lock import hold
with hold(locate(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process holding OUT's lock (as a running job does), and OUT's path."""
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "held\n"
    yield process, out
    if process.poll() is None:
        process.kill()
    process.wait()
    process.stdout.close()


def test_a_second_job_on_an_out_in_use_is_refused_in_one_line(holder, tmp_path, capsys):
    process, out = holder
    write_pngs(tmp_path / "in", 2)
    for flags in ([], ["--resume", "--rows-per-file", "7"]):
        capsys.readouterr()
        assert main([MODEL, str(tmp_path / "in"), "-o", str(out), *flags, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"smso-embed: {out} is in use by another smso-embed job (process {process.pid}): "
            "wait for it to end (or stop it), then run again with --resume; or give another "
            "folder\n"
        )
    assert sorted(p.name for p in out.iterdir()) == [LOCK]  # nothing read or written


def test_a_killed_job_leaves_no_lock(holder):
    process, out = holder
    with pytest.raises(OutputInUseError), hold(locate(str(out))):
        pass
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    started = time.perf_counter()
    with hold(locate(str(out))):  # at once: the kernel let go of the dead process's lock
        assert (out / LOCK).read_text() == f"{os.getpid()}\n"
    assert time.perf_counter() - started < 1


def test_the_lock_is_given_back_at_the_end_and_is_not_output(tmp_path):
    """The lock is given back when the ``with`` ends; its file stays (it is where the lock is
    taken) and is not output: an OUT holding only that file is an empty OUT."""
    out = tmp_path / "out"
    with (
        hold(locate(str(out))),
        pytest.raises(OutputInUseError, match="in use by another smso-embed job"),
        hold(locate(str(out))),
    ):
        pass
    with hold(locate(str(out))):  # given back
        pass
    assert [p.name for p in out.iterdir()] == [LOCK]
    prepare(locate(str(out)), JobManifest("m", "1", "c" * 64, 4, 2, False), resume=False)
    assert (out / MANIFEST).is_file()
