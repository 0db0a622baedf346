"""The cores the service counts for workers=auto and its decode threads: the affinity, at most
the cgroup's CPU quota (rounded up)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.core.cpus import usable_cores
from service.core.settings import Settings

AFFINITY = len(os.sched_getaffinity(0))


def files(
    tmp_path: Path, v2: str | None = None, v1: tuple[str, str] | None = None
) -> tuple[Path, tuple[Path, Path]]:
    """Fake cgroup v2 and v1 files (missing where not given), as usable_cores takes them."""
    v2_path, v1_paths = tmp_path / "cpu.max", (tmp_path / "quota", tmp_path / "period")
    if v2 is not None:
        v2_path.write_text(v2 + "\n")
    if v1 is not None:
        for path, text in zip(v1_paths, v1, strict=True):
            path.write_text(text + "\n")
    return v2_path, v1_paths


@pytest.mark.parametrize(
    ("v2", "v1", "expected"),
    [
        (None, None, AFFINITY),  # no cgroup files: the affinity
        ("max 100000", None, AFFINITY),  # v2 without a quota
        ("100000 100000", None, 1),  # --cpus 1
        ("50000 100000", None, 1),  # half a core: still one
        ("150000 100000", None, min(2, AFFINITY)),  # 1.5 cores, rounded up
        (None, ("-1", "100000"), AFFINITY),  # v1 without a quota
        (None, ("100000", "100000"), 1),  # v1 with one core
        ("garbage", ("100000", "100000"), 1),  # an unreadable v2 file: v1's
    ],
)
def test_the_quota_caps_the_affinity(
    tmp_path: Path, v2: str | None, v1: tuple[str, str] | None, expected: int
) -> None:
    assert usable_cores(*files(tmp_path, v2, v1)) == expected


def test_a_large_quota_does_not_add_cores(tmp_path: Path) -> None:
    assert usable_cores(*files(tmp_path, f"{(AFFINITY + 8) * 100000} 100000")) == AFFINITY


def test_auto_is_one_worker_per_core_at_most_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    import service.core.settings as settings

    monkeypatch.setattr(settings, "usable_cores", lambda: 16)
    assert Settings().worker_processes(gpu=False) == 8  # max_auto_workers' default
    assert Settings(max_auto_workers=4).worker_processes(gpu=False) == 4
    assert Settings(max_auto_workers=32).worker_processes(gpu=False) == 16
    assert Settings(workers=3).worker_processes(gpu=False) == 3  # a number is taken as given
    monkeypatch.setattr(settings, "usable_cores", lambda: 2)
    assert Settings().worker_processes(gpu=False) == 2
    assert Settings(workers=2).decode_workers == 1  # half the cores over two workers, at least 1
    assert Settings().decode_workers == 1  # auto not resolved yet: this one process


def test_auto_is_one_process_owning_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import service.core.settings as settings

    monkeypatch.setattr(settings, "usable_cores", lambda: 16)
    assert Settings().worker_processes(gpu=True) == 1
    assert Settings(workers=8).worker_processes(gpu=True) == 8


@pytest.mark.parametrize(
    ("given", "expected"),
    [("auto", "auto"), ("AUTO", "auto"), (" auto ", "auto"), ("1", 1), ("64", 64), (7, 7)],
)
def test_workers_accepts_a_count_or_auto(given: object, expected: object) -> None:
    assert Settings(workers=given).workers == expected


@pytest.mark.parametrize("given", ["0", "65", "2.5", "many", "", True])
def test_workers_refuses_anything_else_in_one_message(given: object) -> None:
    with pytest.raises(ValueError, match="whole number of processes from 1 to 64, or auto"):
        Settings(workers=given)


def test_each_workers_session_gets_its_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """workers x onnxruntime threads never exceeds the usable cores unless asked for."""
    import service.core.settings as settings

    monkeypatch.setattr(settings, "usable_cores", lambda: 8)
    assert Settings(workers=2).session_threads == 4
    assert Settings(workers=3).session_threads == 2  # rounded down
    assert Settings(workers=16).session_threads == 1  # at least one
    assert Settings(workers=1).session_threads == 0  # one session: onnxruntime's default
    assert Settings().session_threads == 0  # auto not resolved yet: this one process
    assert Settings(workers=2, intra_op_threads=3).session_threads == 3  # as given
    # one process runs every worker's batches: its one session has every core
    assert Settings(workers=2, shared_session=True).session_threads == 0
