"""The per-thread stage clock that runners record into and the batcher reads."""

from __future__ import annotations

import threading
import time

import pytest

from service.telemetry import stage_clock


def test_record_adds_up_per_stage_and_take_starts_afresh():
    stage_clock.take()
    start = time.perf_counter()
    time.sleep(0.01)
    middle = stage_clock.record("run", start)
    assert middle >= start + 0.01
    stage_clock.record("run", middle)  # a stage recorded twice adds up
    before = time.perf_counter()
    stage_clock.record("upload", before)
    after = time.perf_counter()
    times = stage_clock.take()
    assert set(times) == {"run", "upload"}
    assert times["run"] >= 0.01
    assert 0 <= times["upload"] <= after - before
    assert stage_clock.take() == {}


def test_each_thread_has_its_own_clock():
    stage_clock.take()
    stage_clock.record("stack", time.perf_counter())
    seen: list[dict[str, float]] = []

    def other() -> None:
        seen.append(stage_clock.take())  # nothing recorded in this thread
        stage_clock.record("upload", time.perf_counter())
        seen.append(stage_clock.take())

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen[0] == {}
    assert set(seen[1]) == {"upload"}
    assert set(stage_clock.take()) == {"stack"}


def test_a_stage_outside_the_list_is_refused():
    """The stage is a metric label: a typo must not open a new series."""
    stage_clock.take()
    with pytest.raises(ValueError, match="unknown stage 'runn'; the stages are stack, handoff"):
        stage_clock.record("runn", time.perf_counter())
    with pytest.raises(ValueError, match="unknown stage 'gather'"):
        stage_clock.add("gather", 0.001)
    assert stage_clock.take() == {}


def test_seconds_timed_elsewhere_are_added_to_the_stage():
    """A stage timed in another process (the session host's run) adds up like a recorded one."""
    stage_clock.take()
    stage_clock.add("run", 0.002)
    begin = time.perf_counter() - 0.001
    stage_clock.record("run", begin)
    end = time.perf_counter()
    stage_clock.add("share", 0.0005)
    seen = stage_clock.take()
    assert set(seen) == {"run", "share"}
    assert 0.003 <= seen["run"] <= 0.002 + (end - begin)
    assert seen["share"] == 0.0005
