"""docs/model-repository.md runs as printed: its commands, between the ``repository`` markers,
build a repository of three copies of the shipped model, serve it, ask a named model and the
default one, list the index and stop the server.

They run as one bash script in a temporary folder where ``models`` and ``examples`` link to the
repository's, with the test's environment's commands first on the PATH (what ``source
.venv-serve/bin/activate`` does for the page's reader; ``smso-serve`` and ``curl`` are all the
script runs). Only the port changes: a free one instead of 8002.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.service.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "model-repository.md"
SECTION = re.compile(r"<!-- repository:start -->\n```bash\n(.*?)```\n<!-- repository:end -->", re.S)
OFFLINE = {"http_proxy": "http://127.0.0.1:9", "no_proxy": "127.0.0.1,localhost"}


def documents(text: str) -> list[Any]:
    """The JSON documents curl printed one after another."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := _skip_space(text, at)) < len(text):
        value, at = decoder.raw_decode(text, at)
        found.append(value)
    return found


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


@pytest.mark.slow
def test_the_model_repository_page_runs_as_printed(tmp_path):
    match = SECTION.search(PAGE.read_text())
    assert match is not None, f"{PAGE} has no bash block between the repository markers"
    script = match.group(1).replace("8002", str(free_port()))
    for name in ("models", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = os.environ | OFFLINE | {"SMSO_LOG_LEVEL": "warning"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ready, named, default, index = documents(done.stdout)
    assert ready == {"status": "ready"}
    assert named["model"] == {"name": "boots", "version": "1"}
    assert default["model"] == {"name": "shirts", "version": "2"}
    assert named["results"][0]["predictions"][0]["label"] == "Shirt"
    assert {(e["name"], e["version"], e["state"]) for e in index} == {
        ("boots", "1", "READY"),
        ("shirts", "2", "READY"),
    }
    assert "Traceback" not in done.stderr
