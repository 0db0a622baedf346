"""Reading the repository folder never fails on what one entry holds, says once what it passed
over (and the index says why), and a steady scan reads only what changed, off the event loop."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

import pytest

from service.models import scan as scan_module
from service.models.scan import Scanner, Skipped, scan
from tests.service.models.conftest import put
from tests.service.models.test_model_repository import image, index, until


def versions(skipped: list[Skipped]) -> dict[tuple[str, str], str]:
    return {(s.name, s.version): s.reason for s in skipped}


@pytest.mark.parametrize("bad", ["²", "٣", "007", "0", "-1", "1e3", " 2", "latest"])
def test_a_version_folder_that_is_not_a_plain_positive_integer_is_skipped_not_fatal(
    tmp_path, shipped_model, bad
):
    """``²`` and ``٣`` pass str.isdigit() but not int(); ``007`` would name version 7 twice."""
    put(tmp_path, "a", 1, shipped_model)
    folder = tmp_path / "b" / bad
    folder.mkdir(parents=True)
    shutil.copyfile(shipped_model, folder / "model.onnx")
    found, skipped = Scanner(tmp_path)()
    assert list(found) == ["a"]
    assert "positive integer" in versions(skipped)[("b", bad)]


def test_each_entry_passed_over_is_warned_about_once_while_it_is_there(
    tmp_path, shipped_model, caplog
):
    put(tmp_path, "a", 1, shipped_model)
    (tmp_path / "bad name").mkdir()
    (tmp_path / "a" / "007").mkdir()
    scanner = Scanner(tmp_path)
    with caplog.at_level(logging.WARNING, logger="service"):
        for _ in range(5):
            scanner()
    warnings = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert any("'bad name'" in w and "not a model name" in w for w in warnings)
    assert any("'a' version '007'" in w for w in warnings)
    caplog.clear()
    (tmp_path / "bad name").rmdir()
    with caplog.at_level(logging.WARNING, logger="service"):
        scanner()
        (tmp_path / "bad name").mkdir()  # back again: said again
        scanner()
    assert sum("'bad name'" in r.getMessage() for r in caplog.records) == 1


def test_a_steady_scan_lists_no_folder_and_still_sees_a_new_version_and_a_changed_file(
    tmp_path, shipped_model, monkeypatch
):
    put(tmp_path, "a", 1, shipped_model)
    for number in range(2, 2002):
        (tmp_path / "a" / str(number)).mkdir()  # 2,000 versions without a model file yet
    scanner = Scanner(tmp_path, refresh=1000)
    assert scanner()[0]["a"].number == 1
    listed: list[str] = []
    real = os.scandir

    def counting(path):
        listed.append(str(path))
        return real(path)

    monkeypatch.setattr(scan_module.os, "scandir", counting)
    assert scanner()[0]["a"].number == 1
    assert listed == []  # nothing changed: no folder listed again
    shutil.copyfile(shipped_model, tmp_path / "a" / "1500" / "model.onnx")
    assert scanner()[0]["a"].number == 1500  # the highest candidates are looked at each scan
    before = scanner()[0]["a"].stamp
    with open(tmp_path / "a" / "1500" / "model.onnx", "ab") as file:
        file.write(b"\0")  # a changed file is a new model
    assert scanner()[0]["a"].stamp != before
    put(tmp_path, "a", 3000, shipped_model)
    assert scanner()[0]["a"].number == 3000
    assert listed == [str(tmp_path / "a")]


def test_a_model_folder_with_too_many_entries_is_read_up_to_the_bound(
    tmp_path, shipped_model, monkeypatch
):
    monkeypatch.setattr(scan_module, "MAX_ENTRIES", 5)
    for number in range(1, 9):
        put(tmp_path, "a", number, shipped_model)
    found, skipped = Scanner(tmp_path)()
    assert "a" in found
    assert "more than 5 entries" in versions(skipped)[("a", "")]


def test_an_unreadable_model_folder_is_passed_over_and_the_others_found(
    tmp_path, shipped_model, monkeypatch
):
    put(tmp_path, "a", 1, shipped_model)
    put(tmp_path, "b", 1, shipped_model)
    real = scan_module._read_folder

    def failing(path: Path, name: str):
        if name == "b":
            raise PermissionError(13, "Permission denied")
        return real(path, name)

    monkeypatch.setattr(scan_module, "_read_folder", failing)
    found, skipped = Scanner(tmp_path)()
    assert list(found) == ["a"]
    assert versions(skipped)[("b", "")] == "cannot be read: Permission denied"
    assert scan(tmp_path).keys() == {"a"}


def test_the_server_starts_serves_and_keeps_following_the_folder_past_a_bad_entry(
    serve, tmp_path, shipped_model
):
    """The audit's case: ``R/b/²`` beside ``R/a/1``; then one added while it runs, removed, and
    a new model after it: the poll loop never stops, and the index says what was skipped."""
    root = tmp_path / "R"
    put(root, "a", 1, shipped_model)
    (root / "b" / "²").mkdir(parents=True)
    shutil.copyfile(shipped_model, root / "b" / "²" / "model.onnx")
    client = serve(root, default_model="a")
    assert client.get("/readyz").status_code == 200
    assert client.post("/classify", files=image()).status_code == 200
    entries = client.post("/v2/repository/index").json()
    (skipped,) = [e for e in entries if e["name"] == "b"]
    assert skipped["version"] == "²"
    assert skipped["state"] == "UNAVAILABLE"
    assert skipped["reason"].startswith("skipped: ")
    (root / "a" / "٣").mkdir()
    shutil.rmtree(root / "b")
    put(root, "c", 1, shipped_model)
    until(lambda: index(client).get("c") == ("1", "READY"))
    assert client.post("/models/c/classify", files=image()).status_code == 200


def test_the_folder_is_scanned_off_the_event_loop(serve, repository, monkeypatch):
    threads: set[str] = set()
    real = Scanner.__call__

    def recording(self):
        threads.add(threading.current_thread().name)
        return real(self)

    monkeypatch.setattr(Scanner, "__call__", recording)
    serve(repository)
    assert threads
    assert threading.main_thread().name not in threads


def test_an_entry_name_that_is_not_utf8_is_shown_escaped_and_the_index_still_answers(
    serve, tmp_path, shipped_model
):
    root = tmp_path / "R"
    put(root, "a", 1, shipped_model)
    os.mkdir(os.fsdecode(bytes(root) + b"/\xff"))
    _, skipped = Scanner(root)()
    assert [s.name for s in skipped] == ["\\xff"]
    client = serve(root, default_model="a")
    names = {e["name"] for e in client.post("/v2/repository/index").json()}
    assert names == {"a", "\\xff"}


def test_a_model_folder_unreadable_for_a_while_goes_on_serving_its_version(
    tmp_path, shipped_model, monkeypatch
):
    """Too many open files, say, at the refresh that lists every folder again: the model is
    not dropped (and unloaded, and loaded again a scan later)."""
    put(tmp_path, "a", 1, shipped_model)
    scanner = Scanner(tmp_path, refresh=2)
    first, _ = scanner()

    def exhausted(path: Path, name: str):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(scan_module, "_read_folder", exhausted)
    found, skipped = scanner()  # the refresh: every folder listed again
    assert found == first
    assert versions(skipped)[("a", "")] == "cannot be read: Too many open files"


def test_a_file_replaced_with_its_old_time_and_size_is_a_new_version(tmp_path, shipped_model):
    """cp -p, rsync -a and reproducible builds keep a file's modification time."""
    folder = put(tmp_path, "a", 1, shipped_model)
    scanner = Scanner(tmp_path)
    before = scanner()[0]["a"].stamp
    file = folder / "model.onnx"
    times = (file.stat().st_atime_ns, file.stat().st_mtime_ns)
    data = bytearray(file.read_bytes())
    data[-1] ^= 1  # other weights, the same size
    (folder / "new.onnx").write_bytes(bytes(data))
    os.utime(folder / "new.onnx", ns=times)
    (folder / "new.onnx").rename(file)
    assert scanner()[0]["a"].stamp != before


def test_links_to_outside_the_repository_are_passed_over_and_links_inside_are_served(
    tmp_path, shipped_model
):
    outside = tmp_path / "elsewhere"
    put(outside, "x", 1, shipped_model)
    root = tmp_path / "models"
    put(root, "a", 1, shipped_model)
    (root / "a" / "2").symlink_to(outside / "x" / "1")  # a version folder leading out
    (root / "b" / "1").mkdir(parents=True)
    (root / "b" / "1" / "model.onnx").symlink_to(outside / "x" / "1" / "model.onnx")
    (root / "c").symlink_to(outside / "x")  # a model folder leading out
    (root / "d" / "1").mkdir(parents=True)
    (root / "d" / "1" / "model.onnx").symlink_to(root / "a" / "1" / "model.onnx")  # inside
    found, skipped = Scanner(root)()
    assert {name: v.number for name, v in found.items()} == {"a": 1, "d": 1}
    why = "a link to outside the repository"
    assert {(s.name, s.version) for s in skipped if s.reason == why} == {
        ("a", "2"),
        ("b", "1"),
        ("c", "1"),
    }
