"""docs/training.md's "Train on your own images" runs as printed: its commands, between the
``own-images`` markers, write a folder ``my-images`` of Fashion-MNIST's ten classes
(``python -m training.datasets.image_tree``), then train, evaluate, export and serve a model on
it, and the server names the class of one of its test images.

The commands run in a temporary folder where ``configs`` links to the repository's, with
``.venv/bin`` first on the PATH (what ``source .venv/bin/activate`` does). Only the port
changes: ``smso-serve`` runs in the background on a free port instead of 8003 and the ``curl``
goes there. The whole path is timed and printed (a test does not assert wall-clock time).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.service.conftest import free_port, wait_http_ready
from training.datasets.fashion_mnist import DEFAULT_ROOT
from training.datasets.image_tree import FOLDERS

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "training.md"
SECTION = re.compile(r"<!-- own-images:start -->\n```bash\n(.*?)```\n<!-- own-images:end -->", re.S)
PRINTED_PORT = "8003"
OFFLINE = {
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "no_proxy": "127.0.0.1,localhost",
}


def section_commands() -> list[str]:
    """The section's commands, one per line (a trailing backslash continues a line)."""
    match = SECTION.search(PAGE.read_text())
    if match is None:
        pytest.fail(f"{PAGE} has no ```bash block between <!-- own-images:start/end --> markers")
    return match.group(1).replace("\\\n", " ").strip().splitlines()


def test_the_section_has_the_six_commands_of_the_path():
    programs = [shlex.split(command, comments=True)[0] for command in section_commands()]
    assert programs == ["python", "smso-train", "smso-eval", "smso-export", "smso-serve", "curl"]
    assert section_commands()[0].startswith(
        "python -m training.datasets.image_tree --out my-images"
    )


@pytest.mark.slow  # writes 1,200 images, trains for 10 epochs and exports
@pytest.mark.skipif(
    not (DEFAULT_ROOT / "t10k-labels-idx1-ubyte.gz").is_file(),
    reason="the section's images are Fashion-MNIST's: Debian's dataset-fashion-mnist (make data)",
)
def test_the_own_images_section_runs_as_printed(tmp_path):
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    bin_dir = str(Path(sys.executable).parent)
    env = os.environ | OFFLINE | {"PATH": bin_dir + os.pathsep + os.environ["PATH"]}
    port = str(free_port())
    timings: list[tuple[str, float]] = []
    server = None
    start = time.monotonic()
    try:
        for command in section_commands():
            began = time.monotonic()
            program = shlex.split(command, comments=True)[0]
            if program == "smso-serve":
                assert f"--port {PRINTED_PORT}" in command
                server = subprocess.Popen(
                    command.replace(f"--port {PRINTED_PORT}", f"--port {port}"),
                    shell=True,
                    executable="bash",
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )

                def exited(process: subprocess.Popen[str] = server) -> str | None:
                    """The server's output once it has exited; None while it runs."""
                    if process.poll() is None:
                        return None
                    assert process.stdout is not None  # stdout=PIPE
                    return process.stdout.read()

                wait_http_ready(f"http://127.0.0.1:{port}", exited)
                timings.append((program, time.monotonic() - began))
                continue
            if program == "curl":
                assert f"127.0.0.1:{PRINTED_PORT}" in command
                command = command.replace(f"127.0.0.1:{PRINTED_PORT}", f"127.0.0.1:{port}")
            done = subprocess.run(
                command,
                shell=True,
                executable="bash",
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            timings.append((program, time.monotonic() - began))
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        total = time.monotonic() - start
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)  # its own session: smso-serve (and a shell)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        if server is not None and server.stdout is not None:
            server.stdout.close()
    print(
        f"docs/training.md's own-images path as printed: {total:.1f} s ("
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timings)
        + ")"
    )

    upload = re.search(r"file=@(\S+)", section_commands()[-1])
    assert upload is not None, "the section's last command posts no file"
    posted = Path(upload.group(1))
    assert (tmp_path / posted).is_file(), f"the section posts {posted}, which the folder lacks"
    body = json.loads(done.stdout)
    assert body["model"] == {"name": "my-images", "version": "1"}
    (result,) = body["results"]
    assert result["filename"] == posted.name
    assert result["predictions"][0]["label"] == posted.parent.name  # the class folder: trouser
    assert (tmp_path / "runs" / "my-images" / "model.onnx").is_file()
    classes = json.loads((tmp_path / "runs" / "my-images" / "splits.json").read_text())["classes"]
    assert classes == sorted(FOLDERS)  # label 0 is the first folder name in sorted order
