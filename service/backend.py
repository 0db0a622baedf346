"""The inference backend: a small interface, and its onnxruntime implementation.

The app talks to a :class:`Backend` only, so tests can put a fake, slow or failing one in its
place. :class:`OnnxBackend` loads a file written by smso-export, reads its model card, and picks
execution providers: with ``"auto"``, TensorRT or CUDA only when a session really starts on them
(a CUDA build of onnxruntime on a machine without a usable GPU falls back to the CPU quietly).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from service.card import ModelCard, parse_card

__all__ = ["Backend", "OnnxBackend", "choose_providers"]

log = logging.getLogger(__name__)
ACCELERATED = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


class Backend(Protocol):
    """What the service needs from a model: its card, and a batched forward pass."""

    card: ModelCard
    card_dict: dict[str, Any]
    providers: list[str]

    def run(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(N, C, H, W)`` float32 -> ``(logits (N, K), embedding (N, p))``; thread-safe."""
        ...


def _has_nvidia_gpu() -> bool:
    """Whether an NVIDIA driver and device are present (no CUDA call needed)."""
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidiactl").exists()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence file descriptors 1 and 2 (C++ logs and print()) for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def _session(
    path: Path, providers: list[str], threads: int, spinning: bool = False
) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: no warnings about providers that are absent
    if threads:
        options.intra_op_num_threads = threads
    # onnxruntime's pool threads busy-wait for work between operators by default; in a server
    # that burns the cores that decoding and HTTP need (measured: 2 ms of CPU per request on the
    # shipped model, more than the inference itself), so they sleep unless asked to spin.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(str(path), options, providers=providers)


def choose_providers(
    spec: str, path: Path, threads: int = 0, spinning: bool = False
) -> tuple[ort.InferenceSession, list[str]]:
    """A session on the providers ``spec`` names (``"auto"`` or a comma-separated list)."""
    available = ort.get_available_providers()
    if spec != "auto":
        wanted = [p.strip() for p in spec.split(",") if p.strip()]
        missing = [p for p in wanted if p not in available]
        if missing:
            raise ValueError(
                f"execution providers {missing} are not available in this onnxruntime; "
                f"available: {available}"
            )
        session = _session(path, wanted, threads, spinning)
        return session, session.get_providers()
    if not _has_nvidia_gpu():  # a CUDA build of onnxruntime on a machine without a GPU
        available = [p for p in available if p not in ACCELERATED]
    for accelerated in ACCELERATED:
        if accelerated not in available:
            continue
        try:
            with _quiet():  # a missing CUDA library is reported by the C++ logger and print()
                session = _session(path, [accelerated, "CPUExecutionProvider"], threads, spinning)
        except Exception as error:  # onnxruntime raises bare RuntimeErrors of its own types
            log.info("%s is not usable here (%s)", accelerated, str(error).splitlines()[0][:200])
            continue
        if session.get_providers()[0] == accelerated:
            return session, session.get_providers()
        log.info("%s is not usable here (its libraries did not load)", accelerated)
    session = _session(path, ["CPUExecutionProvider"], threads, spinning)
    return session, session.get_providers()


class OnnxBackend:
    """An ONNX file written by smso-export, run by onnxruntime."""

    def __init__(
        self, path: str | Path, providers: str = "auto", threads: int = 0, spinning: bool = False
    ) -> None:
        path = Path(path)
        try:
            self.session, self.providers = choose_providers(providers, path, threads, spinning)
        except ValueError:
            raise
        except Exception as error:  # onnxruntime's own types: Fail, InvalidProtobuf, ...
            message = str(error).splitlines()[0][:300]
            raise ValueError(f"{path} is not a loadable ONNX model: {message}") from None
        metadata = self.session.get_modelmeta().custom_metadata_map
        self.card, self.card_dict = parse_card(metadata)
        names = [o.name for o in self.session.get_outputs()]
        if names[:2] != ["logits", "embedding"] and set(names) != {"logits", "embedding"}:
            raise ValueError(f"{path} has outputs {names}; expected logits and embedding")
        log.info("loaded %s on %s", path, ", ".join(self.providers))

    def run(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        logits, embedding = self.session.run(["logits", "embedding"], {"image": images})
        return logits, embedding
