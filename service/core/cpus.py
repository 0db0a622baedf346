"""The CPU cores this process may use: the ones it may run on (its affinity, what ``taskset``
and Docker's ``--cpuset-cpus`` set), at most its cgroup's CPU quota, rounded up (what Docker's
``--cpus`` and a Kubernetes CPU limit set). ``os.cpu_count()`` counts the machine's cores, which
in a container with a CPU limit would start more workers and threads than the limit can run.

(loky's ``cpu_count`` computes the same; it is not a dependency of the serving install, and
these few lines are all the service needs of it.)
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["usable_cores"]

#: cgroup v2's quota (``"max 100000"`` or ``"200000 100000"``: microseconds per period).
CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")
#: cgroup v1's quota and period (-1: no quota).
CGROUP_V1 = (
    Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
    Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
)


def _quota(v2: Path = CGROUP_V2, v1: tuple[Path, Path] = CGROUP_V1) -> float | None:
    """The cgroup's CPU quota in cores (``quota / period``), or None where it sets none."""
    try:
        quota, period = v2.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us, period_us = (int(path.read_text()) for path in v1)
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def usable_cores(v2: Path = CGROUP_V2, v1: tuple[Path, Path] = CGROUP_V1) -> int:
    """``min(cores in this process's affinity, ceil(cgroup CPU quota))``, at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = _quota(v2, v1)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)
