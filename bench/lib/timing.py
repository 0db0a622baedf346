"""How many calls to time, and their median wall time (and this process's CPU time).

:class:`TimingPolicy` says how many calls to time (about ``budget_s`` per measurement, fewer
when one call is slow); :func:`measure_time` warms up and takes the median. ``sync`` waits for
a device's queued work before and after each call (``bench.lib.torch_device.synchronizer``
for a CUDA device); without it only this thread's work is timed.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TimingPolicy:
    """How many calls to time: about ``budget_s`` per measurement, at most ``max_repeats``."""

    max_repeats: int
    budget_s: float
    warmups: int = 2  # warm-up calls, but only one when a call is slow
    slow_s: float = 1.0  # above this, one call is "slow": 1-3 timed calls


@dataclass(frozen=True)
class Timing:
    """Median wall and process CPU time of one call and how many timed calls they are the
    medians of."""

    median_ms: float
    repeats: int
    cpu_ms: float = 0.0


def timed_call(fn: Callable[[], object], sync: Callable[[], None] | None = None) -> float:
    """Wall time of one call of ``fn`` in seconds (the device's work included with ``sync``)."""
    if sync is not None:
        sync()
    start = time.perf_counter()
    fn()
    if sync is not None:
        sync()
    return time.perf_counter() - start


def repeat_count(one_call_s: float, policy: TimingPolicy) -> int:
    """Timed calls for a call of ``one_call_s``: fill the budget; 1-3 for slow calls."""
    wanted = math.ceil(policy.budget_s / max(one_call_s, 1e-9))
    floor = 1 if one_call_s > policy.slow_s else 3
    ceiling = 3 if one_call_s > policy.slow_s else policy.max_repeats
    return max(1, min(policy.max_repeats, ceiling, max(floor, wanted)))


def measure_time(
    fn: Callable[[], object], policy: TimingPolicy, sync: Callable[[], None] | None = None
) -> Timing:
    """Median wall time of ``fn`` after ``policy.warmups`` warm-up calls (one if a call is slow)."""
    warm = timed_call(fn, sync)
    for _ in range(policy.warmups - 1):
        if warm > policy.slow_s / 2:
            break
        warm = timed_call(fn, sync)
    times = [timed_call(fn, sync) for _ in range(repeat_count(warm, policy))]
    return Timing(statistics.median(times) * 1e3, len(times))


def median_time(fn: Callable[[], object], repeats: int) -> Timing:
    """Median wall and process CPU time of ``fn`` over ``repeats`` calls, after one untimed."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return Timing(1e3 * statistics.median(wall), repeats, 1e3 * statistics.median(cpu))
