"""The GPU as the benchmarks read it: NVML (never ``nvidia-smi`` during a load: on some virtual
machines it stalls CUDA), and a CUDA MPS daemon for servers whose processes share the GPU.

Without NVML (the ``nvidia-ml-py`` package), a driver or a GPU, :func:`gpu_info` is empty and
:class:`GpuSampler` samples nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def nvml_handle() -> Any:
    """The first GPU's NVML handle, or None without NVML (nvidia-ml-py) or a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # no library, no driver, no device: all mean "no NVML here"
        return None


def gpu_info() -> dict[str, Any]:
    """The first GPU's name, driver and memory (GiB); empty without NVML."""
    handle = nvml_handle()
    if handle is None:
        return {}
    import pynvml

    return {
        "gpu": pynvml.nvmlDeviceGetName(handle),
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "gpu_memory_gib": pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30,
    }


class GpuSampler:
    """GPU utilisation and memory through NVML, once every ``period_s``, in a thread, while
    the ``with`` block runs."""

    def __init__(self, period_s: float = 1.0) -> None:
        self.handle = nvml_handle()
        self.period_s = period_s
        self.samples: list[tuple[float, float]] = []  # (utilisation %, memory used GiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import pynvml

        while not self._stop.wait(self.period_s):
            rates = pynvml.nvmlDeviceGetUtilizationRates(self.handle)
            used = pynvml.nvmlDeviceGetMemoryInfo(self.handle).used / 2**30
            self.samples.append((float(rates.gpu), used))

    def __enter__(self) -> GpuSampler:
        if self.handle is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def summary(self) -> dict[str, float] | None:
        """Mean and largest utilisation (%), largest memory used (GiB); None without samples."""
        if not self.samples:
            return None
        return {
            "gpu_util_mean": statistics.fmean(u for u, _ in self.samples),
            "gpu_util_max": max(u for u, _ in self.samples),
            "memory_used_gib": max(m for _, m in self.samples),
        }


@contextlib.contextmanager
def mps(folder: Path) -> Iterator[dict[str, str]]:
    """A CUDA MPS control daemon for the duration (``nvidia-cuda-mps-control -d``, its pipes and
    logs in ``folder``): yields the environment a CUDA process needs to be its client, and
    quits the daemon on the way out. Raises ``RuntimeError`` where it cannot be started."""
    exe = shutil.which("nvidia-cuda-mps-control")
    if exe is None:
        raise RuntimeError("nvidia-cuda-mps-control is not on PATH")
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(folder / "log"),
    }
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    client = os.environ | env
    started = subprocess.run(
        [exe, "-d"],
        env=client,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if started.returncode != 0:
        raise RuntimeError(f"nvidia-cuda-mps-control -d: {started.stderr.strip()[-300:]}")
    try:
        yield env
    finally:
        subprocess.run(
            [exe], input="quit\n", env=client, capture_output=True, text=True, timeout=30
        )
