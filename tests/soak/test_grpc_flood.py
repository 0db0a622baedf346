"""gRPC floods at full size (:mod:`tests.soak.grpc_flood`), in ``make soak``: 24 concurrent
60 MiB ``ModelInfer`` calls without the key and over the size limit, and 20 rounds of an HTTP/2
rapid reset of 20,000 streams. The server refuses each flood before it holds the messages, and
other clients' calls are never cancelled. ``tests/service/grpc`` asserts smaller floods on every
run."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.limits.test_memory_bounds import linux_only
from tests.soak.grpc_flood import KEY, case, flood_table, reset_case, reset_table

CALLS, MIB = 24, 60
#: what a flood may raise the server's peak by: a few messages' worth (24 held would be 1.4 GiB)
FLOOD_PEAK_MIB = 128
#: what 20 rounds of reset streams may leave behind, 3 s after the last
RESET_LEFT_MIB = 64


@linux_only
@pytest.mark.soak  # two fresh servers and 2 x 24 x 60 MiB sent: about a minute on 2 cores
def test_floods_without_the_key_or_over_the_limit_are_refused_before_they_are_held(
    publish: Any,
) -> None:
    size = MIB * 2**20
    results = [
        case("no key", CALLS, MIB, None, size + 2**20),
        case("over the size limit", CALLS, MIB, KEY, max(2**20, size // 4)),
    ]
    publish("grpc_flood", flood_table(results), {"cases": results})
    no_key, too_big = results
    assert no_key["codes"] == {"UNAUTHENTICATED": CALLS}, no_key
    assert too_big["codes"] == {"RESOURCE_EXHAUSTED": CALLS}, too_big
    for result in results:
        assert result["rss_peak_mib"] - result["rss_before_mib"] < FLOOD_PEAK_MIB, result


@linux_only
@pytest.mark.soak  # 400,000 reset streams: about 30 s on 2 cores
def test_twenty_rounds_of_rapid_reset_cancel_no_other_call(publish: Any) -> None:
    result = reset_case(rounds=20, streams=20_000)
    publish("grpc_flood_rapid_reset", reset_table(result), {"cases": [result]})
    assert set(result["valid_calls"]) == {"OK"}, result["valid_calls"]
    assert result["rss_after_mib"] - result["rss_before_mib"] < RESET_LEFT_MIB, result
