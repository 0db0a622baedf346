"""What the server says about a load: its ``/metrics`` page read before and after.

:func:`scrape` reads the page into ``name -> value``; :func:`split` turns two readings and the
clients' mean latency into the mean time per request by stage (decoding, queueing, inference,
and the rest: "response") and the inference thread's time per batch by stage.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from service.telemetry.stage_clock import STAGES

_SAMPLE = re.compile(r"^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+|NaN)$")
_KEYED = re.compile(r'(?:stage|decoder)="([^"]*)"')


def parse(page: str) -> dict[str, float]:
    """``name -> value`` of a Prometheus text page, each name's samples summed over their
    labels (every model's, for instance) except ``le`` (histogram buckets are skipped); a
    sample with a ``stage`` or ``decoder`` label also adds to ``name[that label's value]``."""
    values: dict[str, float] = {}
    for line in page.splitlines():
        match = _SAMPLE.match(line)
        if match and 'le="' not in (match.group(2) or ""):
            name, value = match.group(1), float(match.group(3))
            values[name] = values.get(name, 0.0) + value
            label = _KEYED.search(match.group(2) or "")
            if label:
                key = f"{name}[{label.group(1)}]"
                values[key] = values.get(key, 0.0) + value
    return values


def scrape(url: str) -> dict[str, float]:
    """:func:`parse` of the page at ``url``."""
    return parse(httpx.get(url, timeout=10).text)


def split(before: dict[str, float], after: dict[str, float], mean_ms: float) -> dict[str, Any]:
    """Mean ms per request by stage between two readings, and the rest of the clients'
    ``mean_ms`` ("response": HTTP, parsing, answering); the mean batch; and the inference
    thread's mean ms per batch by stage (``stage_ms``, :data:`STAGES` it recorded)."""

    def mean(metric: str, stage: str = "") -> float:
        count, total = f"{metric}_count{stage}", f"{metric}_sum{stage}"
        done = after[count] - before.get(count, 0)
        return 1e3 * (after[total] - before.get(total, 0)) / max(done, 1)

    decode, queue = mean("smso_decode_seconds"), mean("smso_queue_wait_seconds")
    inference, round_trip = mean("smso_inference_seconds"), mean("smso_batch_round_trip_seconds")
    batches = after["smso_batch_size_count"] - before.get("smso_batch_size_count", 0)
    images = after["smso_batch_size_sum"] - before.get("smso_batch_size_sum", 0)
    stages = "smso_inference_stage_seconds"
    return {
        "decode_ms": decode,
        "queue_ms": queue,
        "inference_ms": inference,
        "round_trip_ms": round_trip,
        "response_ms": mean_ms - decode - queue - round_trip,
        "mean_batch": images / max(batches, 1),
        "stage_ms": {
            name: mean(stages, f"[{name}]") for name in STAGES if f"{stages}_count[{name}]" in after
        },
    }
