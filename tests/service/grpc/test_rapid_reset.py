"""HTTP/2 rapid reset on the gRPC port (CVE-2023-44487's pattern: open a call, cancel it at
once, repeat): the flood is refused on its own connection, other clients' calls are answered
and the server's memory does not keep what the flood cost."""

from __future__ import annotations

import pytest

from tests.service.limits.test_memory_bounds import linux_only
from tests.soak.grpc_flood import reset_case


@linux_only
@pytest.mark.slow  # a server start-up and 80,000 reset streams: about 5 s on 2 cores
def test_a_rapid_reset_flood_cancels_no_other_call_and_leaves_no_memory_behind():
    """Without a bound on a connection's streams, 4 rounds of 20,000 cancelled other clients'
    calls (34 of 38) and raised the server's memory from 127 to 248 MiB, where it stayed."""
    result = reset_case(rounds=4, streams=20_000)
    calls = result["valid_calls"]
    assert set(calls) == {"OK"}, calls
    assert result["rss_after_mib"] - result["rss_before_mib"] < 48, result
