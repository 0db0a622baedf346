"""The soak (:mod:`tests.soak.short_soak`): mixed, hostile, slow and abandoned requests against the
real server on the shipped model, SIGTERM midway; nothing accepted is lost and nothing is a 5xx.
Its quick version runs in every ``make test``, the full one in ``make soak``."""

from __future__ import annotations

import re
import signal
from dataclasses import replace
from typing import Any

import pytest

from tests.soak.short_soak import FULL, QUICK, Outcome, Report, classify, soak

#: what both runs of every soak report
FIELDS = {
    "requests",
    "accepted",
    "answered",
    "lost",
    "refused_by_design",
    "client_closed",
    "status_5xx",
    "valid_p99_ms",
    "peak_rss_mib",
    "by_kind",
    "server_tracebacks",
}


def assert_nothing_lost(result: Report) -> None:
    """The soak's targets: nothing accepted lost, no 5xx, no traceback, no upload cut off, and
    the signal came midway; the clean run answered every request 200."""
    soak_run, clean = result.soak, result.clean
    requests = result.settings.requests
    assert set(soak_run) >= FIELDS
    assert set(clean) >= FIELDS
    assert soak_run["requests"] == clean["requests"] == requests
    assert soak_run["lost"] == 0, soak_run["lost_requests"]
    assert soak_run["status_5xx"] == clean["status_5xx"] == 0
    assert soak_run["server_tracebacks"] == 0
    assert soak_run["unsent"] == 0  # no upload was cut off by the server
    # the signal came midway: some requests were answered, the later ones refused by design
    assert 0 < soak_run["answered"] <= soak_run["accepted"] < soak_run["requests"]
    assert soak_run["refused_by_design"] > 0
    assert clean["lost"] == clean["refused_by_design"] == 0
    assert clean["valid_answered_200"] == requests
    assert soak_run["valid_p99_ms"] > 0
    assert clean["valid_p99_ms"] > 0
    assert soak_run["peak_rss_mib"] > 0
    assert set(result.record()["mix"]) <= set(soak_run["by_kind"])  # every kind was sent
    assert re.search(r"^\| lost \(target 0\) +\| +0 \|", result.table(), re.MULTILINE)


@pytest.mark.slow  # two server start-ups and 400 + 400 requests: about 10 s on 2 cores
def test_quick_soak_loses_nothing_and_answers_no_5xx() -> None:
    assert_nothing_lost(soak(QUICK))


@pytest.mark.soak  # 10,000 + 10,000 requests from 32 clients: about a minute on 2 cores
def test_soak_of_10000_requests_loses_nothing_across_sigterm(publish: Any) -> None:
    result = soak(FULL)
    publish("soak", result.table(), result.record())
    assert_nothing_lost(result)


@pytest.mark.soak  # the quick soak's requests from the full soak's 32 clients, killed midway
def test_a_crash_instead_of_sigterm_is_counted_as_lost_requests(publish: Any) -> None:
    """SIGKILL in place of SIGTERM: the same run must report lost requests (those in flight),
    so that the count does see a crash."""
    result = soak(replace(QUICK, clients=FULL.clients, signum=signal.SIGKILL))
    publish("soak_kill", result.table(), result.record())
    assert result.soak["lost"] > 0


@pytest.mark.parametrize(
    ("outcome", "fate"),
    [
        (Outcome(0, "valid-classify", 1.0, True, True, 200, 0.1), "answered"),
        (Outcome(0, "valid-classify", 3.0, True, True, 200, 0.1), "answered"),
        (Outcome(0, "valid-classify", 1.0, True, True, None, None, "RemoteDisconnected"), "lost"),
        (Outcome(0, "slow", 1.0, True, True, None, None, "ConnectionResetError"), "lost"),
        (Outcome(0, "valid-v2-fp32", 1.0, False, error="ConnectionRefusedError"), "lost"),
        (Outcome(0, "png-strip", 1.0, True, False, error="BrokenPipeError"), "unsent"),
        (Outcome(0, "valid-classify", 3.0, False, error="ConnectionRefusedError"), "refused"),
        (Outcome(0, "valid-classify", 3.0, True, True, None, None, "TimeoutError"), "refused"),
        (Outcome(0, "abandoned", 1.0, True, True), "client-closed"),
        (Outcome(0, "oversized-close", 1.0, True, False), "client-closed"),
        (Outcome(0, "abandoned", 3.0, False, error="ConnectionRefusedError"), "refused"),
    ],
)
def test_a_request_is_lost_only_if_sent_before_the_signal_and_never_answered(
    outcome: Outcome, fate: str
) -> None:
    assert classify(outcome, signalled_at=2.0) == fate
