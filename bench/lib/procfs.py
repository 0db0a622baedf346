"""A process's memory and CPU time, and the machine's busy cores, read from ``/proc`` (Linux)."""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import Any


def rss_mib(pid: int) -> dict[str, float]:
    """The process's resident memory now (``VmRSS``) and at its peak (``VmHWM``), in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    out = {}
    for key in ("VmRSS", "VmHWM"):
        match = re.search(rf"{key}:\s+(\d+) kB", status)
        out[key] = int(match.group(1)) / 1024 if match else float("nan")
    return out


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system, all threads) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def processes() -> dict[int, tuple[int, int]]:
    """Every live process: ``{pid: (parent pid, process group)}`` (``/proc/PID/stat``)."""
    found = {}
    for folder in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):  # gone meanwhile
            fields = (folder / "stat").read_text().rsplit(")", 1)[1].split()
            found[int(folder.name)] = (int(fields[1]), int(fields[2]))  # ppid, pgrp
    return found


def group_pids(group: int) -> list[int]:
    """The live processes of the server that leads process group ``group``: the group's
    members and every descendant of its leader, also those that went on to lead a group of
    their own (Ray starts its actors so: its Serve replicas, proxy and controller)."""
    table = processes()
    found = {pid: None for pid, (_, pgrp) in table.items() if pgrp == group}
    by_parent: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        by_parent.setdefault(parent, []).append(pid)
    queue, seen = ([group] if group in table else []), {group}
    while queue:  # the leader's descendants, through members of the group too
        pid = queue.pop()
        found[pid] = None
        for child in by_parent.get(pid, []):
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return list(found)


def group_cpu_seconds(group: int) -> float:
    """The CPU time of every live process of the server leading process group ``group``
    (:func:`group_pids`: its workers, and its descendants that left the group)."""
    total = 0.0
    for pid in group_pids(group):
        with contextlib.suppress(OSError, IndexError, ValueError):  # gone meanwhile
            total += cpu_seconds(pid)
    return total


def wait_idle(
    group: int, quiet_cores: float = 0.15, interval_s: float = 0.1, timeout_s: float = 5.0
) -> bool:
    """Wait until the server leading process group ``group`` is idle: its processes together
    used under ``quiet_cores`` core-seconds a second over one ``interval_s``. False where it
    was still busy after ``timeout_s`` (or ``/proc`` cannot be read)."""
    deadline = time.monotonic() + timeout_s
    try:
        before = group_cpu_seconds(group)
        while time.monotonic() < deadline:
            time.sleep(interval_s)
            now = group_cpu_seconds(group)
            if 0 <= now - before < quiet_cores * interval_s:
                return True
            before = now
    except OSError:
        pass
    return False


def memory_mib(pid: int) -> dict[str, float]:
    """``Pss`` (shared pages split among the processes sharing them) and ``Rss`` of one
    process, in MiB (``/proc/PID/smaps_rollup``)."""
    found = {"Pss": 0.0, "Rss": 0.0}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in found:
            found[key] = int(rest.split()[0]) / 1024
    return found


def group_memory_mib(group: int) -> dict[str, Any]:
    """What process group ``group`` holds: the sum of its processes' PSS (what it costs the
    machine) and RSS, in MiB, and each process's."""
    processes = {}
    for pid in group_pids(group):
        with contextlib.suppress(OSError, ValueError):
            processes[pid] = memory_mib(pid)
    return {
        "processes": len(processes),
        "pss_mib": sum(m["Pss"] for m in processes.values()),
        "rss_mib": sum(m["Rss"] for m in processes.values()),
        "by_process": {str(pid): m for pid, m in processes.items()},
    }


def machine_busy_seconds() -> float:
    """Core-seconds the machine has been busy (``/proc/stat``: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # user .. steal; guest in user


class CpuMeter:
    """Where the machine's cores went while the ``with`` block ran: the whole machine's busy
    cores and the server's (every process in its group, workers included), each as
    core-seconds per second. The difference is the clients' and everything else's.
    ``result`` stays ``None`` where ``/proc`` cannot be read."""

    def __init__(self, server_group: int) -> None:
        self.group = server_group
        self.start: tuple[float, float, float] | None = None
        self.result: dict[str, float] | None = None

    def __enter__(self) -> CpuMeter:
        with contextlib.suppress(OSError, ValueError):
            self.start = (
                time.perf_counter(),
                machine_busy_seconds(),
                group_cpu_seconds(self.group),
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.start is None:
            return
        with contextlib.suppress(OSError, ValueError):
            wall = time.perf_counter() - self.start[0]
            self.result = {
                "machine_cores_busy": (machine_busy_seconds() - self.start[1]) / wall,
                "server_cores": (group_cpu_seconds(self.group) - self.start[2]) / wall,
                "cores": float(os.cpu_count() or 0),
            }
