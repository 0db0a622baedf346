"""The card's ``exported_at`` follows SOURCE_DATE_EPOCH when set, so that exporting one
checkpoint twice writes the same bytes (``make onnx`` sets it: the tracked file changes only with
the model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from export.onnx_export import exported_at

ROOT = Path(__file__).resolve().parents[2]


def test_source_date_epoch_fixes_the_export_time(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1795745995")
    assert exported_at() == "2026-11-27T02:19:55+00:00"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", exported_at())


@pytest.mark.parametrize("value", ["yesterday", "1e9", "99999999999999999999"])
def test_a_source_date_epoch_that_is_no_time_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    with pytest.raises(ValueError, match=r"SOURCE_DATE_EPOCH=.* is not a time in seconds"):
        exported_at()


def test_make_onnx_exports_with_the_checkpoints_commit_time():
    """The commit time where the checkpoint is committed as it is; its mtime where ``make model``
    has just written it (not yet committed)."""
    recipe = (ROOT / "Makefile").read_text().split("\nonnx:", 1)[1].split("\n\n", 1)[0]
    assert "SOURCE_DATE_EPOCH=$$(" in recipe
    assert "git status --porcelain -- $(MODEL_DIR)/model.pt" in recipe
    assert "git log -1 --format=%ct -- $(MODEL_DIR)/model.pt" in recipe
    assert "stat -c %Y $(MODEL_DIR)/model.pt" in recipe
