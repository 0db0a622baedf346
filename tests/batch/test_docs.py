"""The README's smso-embed command (between its ``embed`` markers) runs as printed from the
repository root (its output folder moved to a temporary one), twice: the second run, with
--resume, does nothing; and docs/batch.md's guide runs as printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as pads
import pytest

ROOT = Path(__file__).resolve().parents[2]
PRINTED_OUT = "/tmp/smso-embed-examples"
SECTION = re.compile(r"<!-- embed:start -->\n```bash\n(.*?)```\n<!-- embed:end -->", re.DOTALL)


def readme_commands() -> list[str]:
    """The commands of the README's block between ``<!-- embed:start/end -->``."""
    match = SECTION.search((ROOT / "README.md").read_text())
    assert match is not None, "README.md has no bash block between the embed markers"
    return [line for line in match.group(1).splitlines() if line.strip()]


def test_the_readme_section_has_one_command_on_the_examples():
    (command,) = readme_commands()
    assert command.startswith("smso-embed models/fashion-mnist-smso/model.onnx examples/ -o ")
    assert PRINTED_OUT in command


def run_as_printed(line: str) -> subprocess.CompletedProcess[str]:
    """A README command run by bash from the repository root, with this install's commands on
    the PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["bash", "-c", line],
        cwd=ROOT,
        env=os.environ | {"PATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_the_readme_command_runs_as_printed(tmp_path):
    (command,) = readme_commands()
    out = tmp_path / "examples"
    for run in range(2):
        done = run_as_printed(command.replace(PRINTED_OUT, str(out)))
        assert done.returncode == 0, done.stderr
        assert "every image of INPUT once" in done.stdout
        assert f"{3 - 3 * run} to do" in done.stdout.splitlines()[0]
    rows = pads.dataset(out / "embeddings", format="parquet").to_table().to_pylist()
    labels = {Path(row["path"]).name: row["top_k_labels"][0] for row in rows}
    assert labels == {"boot.png": "Ankle boot", "shirt.jpg": "Shirt", "bag.webp": "Bag"}


SEARCH = re.compile(r"<!-- search:start -->\n```bash\n(.*?)```\n<!-- search:end -->", re.DOTALL)
PRINTED_GALLERY = "/tmp/smso-gallery"


@pytest.mark.slow
def test_the_readme_search_command_runs_as_printed_after_the_embed_command(tmp_path):
    match = SEARCH.search((ROOT / "README.md").read_text())
    assert match is not None, "README.md has no bash block between the search markers"
    (command,) = [line for line in match.group(1).splitlines() if line.strip()]
    assert command.startswith(f"smso-index {PRINTED_OUT} -o {PRINTED_GALLERY}")
    out, gallery = tmp_path / "examples", tmp_path / "gallery"
    for line in [*readme_commands(), command]:
        done = run_as_printed(
            line.replace(PRINTED_OUT, str(out)).replace(PRINTED_GALLERY, str(gallery))
        )
        assert done.returncode == 0, done.stderr
    assert "3 images of fashion_mnist-small_cnn-smso" in done.stdout
    from gallery.search import load

    assert load(gallery).size == 3


def guide_blocks() -> list[tuple[str, str]]:
    """docs/batch.md's runnable blocks, in order: ("python" or "bash", code); the cluster's
    commands (they need a cluster) and the install line left out."""
    text = (ROOT / "docs" / "batch.md").read_text()
    blocks = re.findall(r"```(python|bash)\n(.*?)```", text, re.DOTALL)
    return [(kind, code) for kind, code in blocks if "ray start" not in code and "pip " not in code]


@pytest.mark.slow
def test_the_guide_runs_as_printed_on_200_images(tmp_path):
    """docs/batch.md from the first job to the nearest neighbours, on 200 of the 1,000 images
    and in a temporary folder; the DuckDB and FAISS examples where those are installed."""
    pytest.importorskip("duckdb")
    pytest.importorskip("faiss")
    if not Path("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip("the guide's images are Fashion-MNIST's (make data)")
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    outputs = []
    for kind, code in guide_blocks():
        code = code.replace("/tmp/fmnist-", f"{tmp_path}/fmnist-").replace("[:1000]", "[:200]")
        command = [sys.executable, "-c", code] if kind == "python" else ["bash", "-c", code]
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{code}\n{done.stderr}"
        outputs.append(done.stdout)
    assert "200 fixed_size_list<element: float>[64]" in outputs[2]
    nearest = next(out for out in outputs if out.startswith("1.000")).splitlines()
    assert nearest[0].endswith("00000.png  Ankle boot")
    assert len(nearest) == 6
    resumed = outputs[-1].splitlines()  # two images deleted, one rewritten, then --resume
    assert "1 to do (1 changed); 2 gone from INPUT, taken out of OUT" in resumed[0]
    assert "198 embeddings, 0 errors: every image of INPUT once" in outputs[-1]
