"""The torch benchmarks' device: which one, waiting for it, its peak memory, what it is.

Only the benchmarks that measure torch itself (heads, train_step, export) import this module.
It sets ``KINETO_LOG_LEVEL`` (unless the environment already does) before it imports torch, so
a script must import it before torch for the profiler to stay quiet.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

# Kineto (the profiler backend) logs every profiler start and stop to stderr; it reads its log
# level once, when torch is loaded. An explicit setting in the environment wins.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

import torch
from torch.profiler import ProfilerActivity, profile

from bench.lib.report import machine

MIB = 2**20


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


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synchronizer(device: torch.device) -> Callable[[], None] | None:
    """``sync`` for :mod:`bench.lib.timing` on ``device``: None on the CPU."""
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None


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


def machine_info(device: torch.device) -> dict[str, Any]:
    """:func:`bench.lib.report.machine` with torch's version, the device and the threads."""
    info = machine(torch=torch.__version__, device=str(device), threads=torch.get_num_threads())
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info
