"""Where a run executes: device, mixed precision and (optional) distributed process group.

Distributed runs are started by ``torchrun``, which sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK``; the backend is nccl on CUDA and gloo on the CPU.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DEVICES", "DEVICE_NAME", "Runtime", "setup_runtime", "teardown_runtime"]

#: The devices a run accepts (torch takes other names too, such as ``meta``, that a run cannot
#: use), and how the flags' help says them.
DEVICE_NAME = re.compile(r"auto|cpu|cuda(:\d+)?")
DEVICES = "auto (cuda when available, else cpu), cpu, cuda or cuda:N"


@dataclass(frozen=True)
class Runtime:
    """The resolved execution settings of this process."""

    device: torch.device
    amp_dtype: torch.dtype | None  # None: full float32
    rank: int
    world_size: int

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints, metrics and progress bars."""
        return self.rank == 0


def _device(name: str, local_rank: int) -> torch.device:
    if not DEVICE_NAME.fullmatch(name):
        raise ValueError(f"device must be {DEVICES}, got {name!r}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device cuda was asked for, but no CUDA device is available")
        if device.index is None:
            device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True  # presets crop to one size: autotune once
    return device


def _amp_dtype(mode: str, device: torch.device) -> torch.dtype | None:
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return None
    if mode == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[mode]


def setup_runtime(device: str = "auto", amp: str = "auto") -> Runtime:
    """Resolve the device and AMP dtype; join the process group when started by torchrun."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    resolved = _device(device, local_rank)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if resolved.type == "cuda" else "gloo")
    return Runtime(resolved, _amp_dtype(amp, resolved), rank, world_size)


def teardown_runtime(runtime: Runtime) -> None:
    """Leave the process group, if this run joined one."""
    if runtime.distributed and dist.is_initialized():
        dist.destroy_process_group()
