"""The two engines are two ways of running the same job: the same INPUT gives the same OUT (part
for part, row for row) on the embedded engine and on Ray's (the session's Ray); a job started on
one is resumed on the other with every image once; and the embedded engine runs where Ray cannot
even be imported, which then only ``--engine ray`` (or a Ray address) misses, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from batch.outputs import EMBEDDINGS, ERRORS, MANIFEST
from bench.embed import exactly_once
from tests.batch.conftest import (
    MODEL,
    ROOT,
    embed,
    part_names,
    read,
    write_pngs,
)

ENGINES = {"local": [], "ray": ["--engine", "ray"]}

#: smso-embed in a process where ``import ray`` fails (as where Ray is not installed); it also
#: fails if the job imported Ray's engine all the same
WITHOUT_RAY = """
import sys
sys.modules["ray"] = None  # import ray: ImportError
from batch.cli import main
status = main(sys.argv[1:])
assert "batch.ray_engine" not in sys.modules, "the Ray engine was imported"
sys.exit(status)
"""


def images_and_faults(folder: Path, count: int) -> list[Path]:
    """``count`` PNGs and three files the service refuses, among them."""
    files = write_pngs(folder, count)
    (folder / "00003-text.png").write_text("not an image")
    (folder / "00017-empty.png").write_bytes(b"")
    (folder / "00010-cut.png").write_bytes(files[5].read_bytes()[:50])
    return sorted(folder.iterdir())


@pytest.mark.usefixtures("ray_cluster")
def test_both_engines_write_the_same_out(tmp_path, capsys):
    folder = tmp_path / "in"
    files = images_and_faults(folder, 40)
    outs = {}
    for engine, flags in ENGINES.items():
        out = outs[engine] = tmp_path / engine
        args = (MODEL, str(folder), "-o", str(out), "--rows-per-file", "16", *flags)
        status, summary, err = embed(*args, "--top-k", "3", capsys=capsys)
        assert status == 0, err
        assert (summary["engine"], summary["embedded"], summary["refused"]) == (
            engine,
            40,
            {"invalid_image": 3},
        )
        assert exactly_once(out, files)["exactly_once"]
    local, ray = outs["local"], outs["ray"]
    for table in (EMBEDDINGS, ERRORS):
        assert part_names(local, table) == part_names(ray, table)
    assert len(part_names(local)) == 3  # 43 files in chunks of 16
    assert len(part_names(local, ERRORS)) == 2  # the refused ones: two in chunk 0, one in 1
    assert read(local, ERRORS) == read(ray, ERRORS)
    by_local, by_ray = read(local), read(ray)
    assert [r["path"] for r in by_local] == [r["path"] for r in by_ray]
    for mine, theirs in zip(by_local, by_ray, strict=True):
        np.testing.assert_allclose(mine["embedding"], theirs["embedding"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(mine["top_k_scores"], theirs["top_k_scores"], atol=1e-6)
        assert mine["top_k_labels"] == theirs["top_k_labels"]
        assert mine["typicality_score"] == pytest.approx(theirs["typicality_score"], abs=1e-4)
        same = ("model_name", "model_version", "card_sha256", "file_size", "file_mtime_ns")
        assert {k: mine[k] for k in same} == {k: theirs[k] for k in same}
    assert (local / MANIFEST).read_text() == (ray / MANIFEST).read_text()


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize(("first", "then"), [("local", "ray"), ("ray", "local")])
def test_a_job_started_on_one_engine_is_resumed_on_the_other(tmp_path, capsys, first, then):
    folder = tmp_path / "in"
    files = write_pngs(folder, 40)
    out = tmp_path / "out"
    listing = tmp_path / "first.csv"  # the first run stopped after 20 of the 40
    listing.write_text("path\n" + "".join(f"in/{i:05d}.png\n" for i in range(20)))
    flags = ["--rows-per-file", "8"]
    status, summary, err = embed(
        MODEL, str(listing), "-o", str(out), *flags, *ENGINES[first], capsys=capsys
    )
    assert (status, summary["engine"]) == (0, first), err
    written = {name: (out / EMBEDDINGS / name).stat().st_mtime_ns for name in part_names(out)}
    status, summary, err = embed(
        MODEL, str(folder), "-o", str(out), "--resume", *flags, *ENGINES[then], capsys=capsys
    )
    assert status == 0, err
    assert summary["engine"] == then
    assert (summary["skipped"], summary["todo"], summary["new"]) == (20, 20, 20)
    assert (summary["missing"], summary["duplicates"], summary["out_embedded"]) == (0, 0, 40)
    assert exactly_once(out, files)["exactly_once"]
    for name, mtime in written.items():  # the first engine's parts: kept as they were
        assert (out / EMBEDDINGS / name).stat().st_mtime_ns == mtime
    assert len(part_names(out)) == 6


def without_ray(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """:data:`WITHOUT_RAY` with ``args`` (and ``env`` added to this environment, RAY_ADDRESS
    left out unless given), to its end."""
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | env
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY, *args, "--json", "--no-progress"],
        cwd=ROOT,
        env=environment | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_without_ray_the_embedded_engine_runs_and_only_ray_s_is_refused(tmp_path):
    images = str(tmp_path / "in")
    write_pngs(tmp_path / "in", 5)
    done = without_ray(MODEL, images, "-o", str(tmp_path / "a"))
    assert done.returncode == 0, done.stderr
    assert '"engine": "local"' in done.stdout
    assert len(read(tmp_path / "a")) == 5
    # RAY_ADDRESS asks for Ray unless --engine local says otherwise
    done = without_ray(
        MODEL, images, "-o", str(tmp_path / "b"), "--engine", "local", RAY_ADDRESS="auto"
    )
    assert done.returncode == 0, done.stderr
    for flags, env in ((["--engine", "ray"], {}), ([], {"RAY_ADDRESS": "auto"})):
        done = without_ray(MODEL, images, "-o", str(tmp_path / "c"), *flags, **env)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("smso-embed: the Ray engine needs Ray (")
        assert "pip install 'smso[batch]'" in done.stderr
        assert done.stderr.count("\n") == 1
        assert not (tmp_path / "c").exists()
