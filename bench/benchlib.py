"""Shared machinery of the benchmark scripts under ``bench/``, independent of what is measured.

* timing: :class:`TimingPolicy` (how many calls to time), :func:`timed_call` (one call, device
  work included), :func:`repeat_count` and :func:`measure_time` (median of the timed calls after
  warm-up);
* memory: :func:`peak_bytes` (peak tensor bytes allocated while a function runs, above the level
  at its start: CUDA allocator statistics on a GPU, the profiler's allocator events on CPU) and
  :func:`memory_note`, which says so in words;
* output: :func:`markdown_table` (padded columns, numbers right-aligned), :func:`format_ms`,
  :func:`format_ratio` and :func:`write_json`;
* the machine: :func:`machine_info`, :func:`cpu_model` and :func:`resolve_device` (``--device``).

Importing this module sets ``KINETO_LOG_LEVEL`` (unless the environment already does) before it
imports torch, so a script must import it before torch for the profiler to stay quiet.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Kineto (the profiler backend) logs every profiler start and stop to stderr; it reads its log
# level once, when torch is loaded. An explicit setting in the environment wins.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

import torch
from torch.profiler import ProfilerActivity, profile

MIB = 2**20


# --- timing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimingPolicy:
    """How many calls to time: about ``budget_s`` per measurement, at most ``max_repeats``."""

    max_repeats: int
    budget_s: float
    warmups: int = 2  # warm-up calls, but only one when a call is slow
    slow_s: float = 1.0  # above this, one call is "slow": 1-3 timed calls


@dataclass(frozen=True)
class Timing:
    """Median wall time of one call and how many timed calls it is the median of."""

    median_ms: float
    repeats: int


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_call(fn: Callable[[], object], device: torch.device) -> float:
    """Wall time of one call of ``fn`` in seconds (device work included)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def repeat_count(one_call_s: float, policy: TimingPolicy) -> int:
    """Timed calls for a call of ``one_call_s``: fill the budget; 1-3 for slow calls."""
    wanted = math.ceil(policy.budget_s / max(one_call_s, 1e-9))
    floor = 1 if one_call_s > policy.slow_s else 3
    ceiling = 3 if one_call_s > policy.slow_s else policy.max_repeats
    return max(1, min(policy.max_repeats, ceiling, max(floor, wanted)))


def measure_time(fn: Callable[[], object], device: torch.device, policy: TimingPolicy) -> Timing:
    """Median wall time of ``fn`` after ``policy.warmups`` warm-up calls (one if a call is slow)."""
    warm = timed_call(fn, device)
    for _ in range(policy.warmups - 1):
        if warm > policy.slow_s / 2:
            break
        warm = timed_call(fn, device)
    times = [timed_call(fn, device) for _ in range(repeat_count(warm, policy))]
    return Timing(statistics.median(times) * 1e3, len(times))


# --- memory ---------------------------------------------------------------------------------


def profiled_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak live CPU tensor bytes allocated while ``fn`` runs, above the level at its start.

    Sums the profiler's allocator events (``+nbytes`` on allocation, ``-nbytes`` on free) in time
    order and returns the largest running total.
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [
        e
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
    ]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def cuda_peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak CUDA bytes allocated while ``fn`` runs, above the level at its start."""
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak tensor bytes allocated while ``fn`` runs on ``device``, above the level at its start."""
    if device.type == "cuda":
        return cuda_peak_bytes(fn, device)
    return profiled_peak_bytes(fn)


def memory_note(device: torch.device, what: str) -> str:
    """What a memory column of :func:`peak_bytes` of ``what`` (e.g. ``"one fwd+bwd"``) holds."""
    method = (
        "torch.cuda.max_memory_allocated"
        if device.type == "cuda"
        else "from torch.profiler allocator events (profile_memory=True)"
    )
    return f"peak tensor memory of {what} above the resident input and parameters (MiB), {method}"


# --- output ---------------------------------------------------------------------------------


def format_ms(value: float) -> str:
    """Milliseconds with three or more significant digits: ``1,234``, ``56.7``, ``8.90``."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_ratio(value: float | None) -> str:
    """A ratio as ``12.3x``, ``1.23x`` or ``0.012x``; ``-`` for None."""
    if value is None:
        return "-"
    if value >= 10:
        return f"{value:,.1f}x"
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.3f}x"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table with padded columns (numbers right-aligned)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    numeric = [all(_looks_numeric(r[i]) for r in rows) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(cells, widths, numeric, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(
            "-" * (w + 1) + ":" if num else "-" * (w + 2)
            for w, num in zip(widths, numeric, strict=True)
        )
        + "|"
    )
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def _looks_numeric(cell: str) -> bool:
    """A number as the formatters write it (``-1,234.5``, ``2.00x``) or ``-`` (no value)."""
    return cell == "-" or cell.lstrip("-").replace(",", "").replace(".", "").rstrip("x").isdigit()


def write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` as indented JSON to ``path``, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


# --- the machine ----------------------------------------------------------------------------


def machine_info(device: torch.device) -> dict[str, Any]:
    """Versions, platform, CPU, device and thread count, for a results file."""
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": cpu_model(),
        "cpu_count": os.cpu_count(),
        "device": str(device),
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def resolve_device(name: str) -> torch.device:
    """The torch device of a ``--device`` argument ("auto": cuda if available); exits when it
    is not usable here."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available here")
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device must be cpu or cuda, got {name!r}")
    return device
