"""Progress off a terminal: plain log lines at an interval, never a carriage return."""

from __future__ import annotations

import logging

from training.progress import LineProgress, progress


def test_off_a_terminal_progress_is_periodic_plain_lines(caplog):
    caplog.set_level(logging.INFO, "training.progress")
    bar = LineProgress(range(3), "epoch 1", interval=0.0)
    seen = []
    for item in bar:
        bar.set_postfix(loss="0.500")
        seen.append(item)
    assert seen == [0, 1, 2]
    assert caplog.messages == [f"epoch 1: {k}/3 batches, loss 0.500" for k in (1, 2, 3)]


def test_progress_is_line_based_when_stderr_is_not_a_terminal(capsys, caplog, monkeypatch):
    # pytest captures stderr: not a terminal; a line after every batch here
    monkeypatch.setattr("training.progress.LINE_INTERVAL", 0.0)
    caplog.set_level(logging.INFO, "training.progress")
    bar = progress(range(2), "val")
    assert isinstance(bar, LineProgress)
    assert list(bar) == [0, 1]
    assert caplog.messages == ["val: 1/2 batches", "val: 2/2 batches"]
    caplog.clear()
    assert list(progress(range(2), "val", enabled=False)) == [0, 1]  # other ranks: silent
    assert caplog.messages == []
    assert "\r" not in capsys.readouterr().err
