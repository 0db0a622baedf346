"""onnxruntime execution providers: which ones a session gets, and with which options.

``"auto"`` tries TensorRT, then CUDA, then the CPU, keeping the first that a session really
starts on (a CUDA build of onnxruntime on a machine without a usable GPU falls back to the CPU
quietly). An explicit list is used as given, after checking that this onnxruntime has it.

Options of the accelerated providers (:func:`provider_options`):

* TensorRT: engines and the timing cache are kept in ``engine_cache_dir`` (a volume in a
  container; created with its parents before the session, :func:`prepare_engine_cache`), so a
  restart loads the engines instead of building them for minutes; one
  optimisation profile covers batch 1 to ``max_batch`` at the model's input size (an engine per
  new shape otherwise); float16 kernels where ``trt_fp16``.
* CUDA: ``enable_cuda_graph`` where ``cuda_graphs`` and CUDA leads the session (the backend
  then runs through IO binding with fixed buffers per batch-size bucket: see
  :mod:`service.runtime.runner`); cuDNN's exhaustive algorithm search (once per input shape, during
  warm-up).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

__all__ = [
    "ACCELERATED",
    "CPU",
    "CUDA",
    "TENSORRT",
    "Accelerator",
    "ProviderSpec",
    "check_providers",
    "choose_providers",
    "has_nvidia_gpu",
    "prepare_engine_cache",
    "provider_options",
    "quiet_native_output",
    "runs_on_gpu",
    "shaped_session",
]

# a stable name for logging configs, wherever the module lives
log = logging.getLogger("service.providers")

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
ACCELERATED = (TENSORRT, CUDA)

#: ``(provider name, its options)``, as ``InferenceSession(providers=...)`` takes them.
ProviderSpec = tuple[str, dict[str, str]]


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    """How to configure the GPU providers for one model (ignored on the CPU)."""

    input_shape: tuple[int, int, int]  # (C, H, W) the model is served at
    max_batch: int  # largest batch the batcher forms
    engine_cache_dir: Path | None = None  # TensorRT engines and timing cache; None: no cache
    trt_fp16: bool = False  # let TensorRT choose float16 kernels
    cuda_graphs: bool = False  # CUDA provider: capture one CUDA graph per batch-size bucket


#: Where a machine shows an NVIDIA driver: Linux's kernel driver, WSL2's GPU paravirtualisation
#: (any vendor's GPU: the session's providers then tell), a Jetson's L4T release file.
NVIDIA_MARKERS = (
    "/proc/driver/nvidia/version",
    "/dev/nvidiactl",
    "/dev/dxg",
    "/etc/nv_tegra_release",
)


def has_nvidia_gpu() -> bool:
    """Whether an NVIDIA driver and device may be present (no CUDA call needed)."""
    return any(Path(marker).exists() for marker in NVIDIA_MARKERS)


def runs_on_gpu(spec: str) -> bool:
    """Whether providers ``spec`` (``"auto"`` or a list) may run on an NVIDIA GPU here:
    ``auto`` where this onnxruntime has TensorRT or CUDA and the machine a GPU, or a list
    naming either."""
    if spec == "auto":
        available = ort.get_available_providers()
        return has_nvidia_gpu() and any(p in available for p in ACCELERATED)
    return any(name in ACCELERATED for name in _named(spec))


def _named(spec: str) -> list[str]:
    """The providers a comma-separated ``spec`` names, in its order."""
    return [name.strip() for name in spec.split(",") if name.strip()]


def _shape(name: str, batch: int, shape: tuple[int, int, int]) -> str:
    return f"{name}:{batch}x{shape[0]}x{shape[1]}x{shape[2]}"


def provider_options(
    provider: str, accelerator: Accelerator | None, input_name: str = "image"
) -> dict[str, str]:
    """The options ``provider`` gets for ``accelerator`` (none for the CPU or without one)."""
    if accelerator is None:
        return {}
    if provider == TENSORRT:
        shape = accelerator.input_shape
        options = {
            "trt_profile_min_shapes": _shape(input_name, 1, shape),
            "trt_profile_opt_shapes": _shape(input_name, accelerator.max_batch, shape),
            "trt_profile_max_shapes": _shape(input_name, accelerator.max_batch, shape),
            "trt_fp16_enable": "1" if accelerator.trt_fp16 else "0",
        }
        if accelerator.engine_cache_dir is not None:
            cache = str(accelerator.engine_cache_dir)
            options |= {
                "trt_engine_cache_enable": "1",
                "trt_engine_cache_path": cache,
                "trt_timing_cache_enable": "1",
                "trt_timing_cache_path": cache,
            }
        return options
    if provider == CUDA:
        options = {"cudnn_conv_algo_search": "EXHAUSTIVE", "do_copy_in_default_stream": "1"}
        if accelerator.cuda_graphs:
            options["enable_cuda_graph"] = "1"
        return options
    return {}


def prepare_engine_cache(folder: Path | None) -> None:
    """Create TensorRT's cache folder with its parents: onnxruntime's TensorRT provider creates
    only the last folder of its path and fails the session where the parent is missing (as
    ``~/.cache/smso`` is on a fresh machine). A ValueError saying what to change where the
    folder cannot be made or written."""
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        problem = f"cannot be created ({error.strerror or error})"
    else:
        if os.access(folder, os.W_OK | os.X_OK):
            return
        problem = "is not writable"
    raise ValueError(
        f"the TensorRT engine cache folder {folder} {problem}; set engine_cache_dir "
        "(--engine-cache-dir, SMSO_ENGINE_CACHE_DIR) to a writable folder"
    )


def check_providers(spec: str) -> list[str]:
    """The providers an explicit ``spec`` names, each one this onnxruntime has (a ValueError
    listing the available ones otherwise) and, for TensorRT and CUDA, on a machine with an
    NVIDIA GPU (a CUDA build of onnxruntime lists them everywhere); ``[]`` for ``"auto"``."""
    if spec == "auto":
        return []
    available = ort.get_available_providers()
    wanted = _named(spec)
    missing = [p for p in wanted if p not in available]
    if missing:
        raise ValueError(
            f"execution providers {missing} are not available in this onnxruntime; "
            f"available: {available}"
        )
    needing_gpu = [p for p in wanted if p in ACCELERATED]
    if needing_gpu and not has_nvidia_gpu():
        raise ValueError(
            f"execution providers {needing_gpu} need an NVIDIA GPU and this machine has none "
            f"(no NVIDIA driver): give providers 'auto', which runs on the CPU here, or {CPU!r}"
        )
    return wanted


@contextlib.contextmanager
def quiet_native_output() -> Iterator[None]:
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
    path: Path,
    providers: list[ProviderSpec],
    *,
    threads: int,
    spinning: bool,
    free_dims: Mapping[str, int] | None = None,
) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: no warnings about providers that are absent
    for name, value in (free_dims or {}).items():  # a symbolic dimension fixed for this session
        options.add_free_dimension_override_by_name(name, value)
    if threads:
        options.intra_op_num_threads = threads
    # onnxruntime's pool threads busy-wait for work between operators by default; in a server
    # that burns the cores that decoding and HTTP need (measured: 2 ms of CPU per request on the
    # shipped model, more than the inference itself), so they sleep unless asked to spin.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(str(path), options, providers=providers)


def _with_options(names: list[str], accelerator: Accelerator | None) -> list[ProviderSpec]:
    specs = []
    for name in names:
        options = provider_options(name, accelerator)
        if name == CUDA and name != names[0]:
            # onnxruntime refuses a session whose CUDA provider captures graphs unless every
            # compute node runs on CUDA: behind TensorRT, CUDA takes what TensorRT cannot
            options.pop("enable_cuda_graph", None)
        specs.append((name, options))
    return specs


def shaped_session(
    path: Path,
    providers: list[str],
    *,
    threads: int,
    spinning: bool,
    accelerator: Accelerator | None,
    free_dims: Mapping[str, int],
) -> ort.InferenceSession:
    """A session on exactly ``providers`` with the input's symbolic dimensions fixed
    (``free_dims``, e.g. ``{"batch": 8, "height": 224, "width": 224}``): every shape is then
    known when the graph is optimised, its shape arithmetic folds into constants, and every
    node can run on the accelerator (which a CUDA graph requires)."""
    specs = _with_options(providers, accelerator)
    return _session(path, specs, threads=threads, spinning=spinning, free_dims=free_dims)


def choose_providers(
    spec: str,
    path: Path,
    *,
    threads: int = 0,
    spinning: bool = False,
    accelerator: Accelerator | None = None,
) -> tuple[ort.InferenceSession, list[str]]:
    """A session on the providers ``spec`` names (``"auto"`` or a comma-separated list), and
    the providers it really runs on."""

    def session_on(providers: list[ProviderSpec]) -> ort.InferenceSession:
        return _session(path, providers, threads=threads, spinning=spinning)

    def with_options(names: list[str]) -> list[ProviderSpec]:
        return _with_options(names, accelerator)

    cache = accelerator.engine_cache_dir if accelerator is not None else None
    if spec != "auto":
        wanted = check_providers(spec)
        if TENSORRT in wanted:
            prepare_engine_cache(cache)
        session = session_on(with_options(wanted))
        used = session.get_providers()
        if wanted[0] in ACCELERATED and used[0] != wanted[0]:
            # onnxruntime falls back to the next provider, with its reason in its own log
            raise ValueError(
                f"execution provider {wanted[0]} was asked for and onnxruntime could not start "
                f"it (its libraries did not load; onnxruntime's message above says which); the "
                f"session would run on {used}: fix the libraries, or give providers 'auto'"
            )
        return session, used
    available = ort.get_available_providers()
    if not has_nvidia_gpu():  # a CUDA build of onnxruntime on a machine without a GPU
        available = [p for p in available if p not in ACCELERATED]
    for i, accelerated in enumerate(ACCELERATED):
        if accelerated not in available:
            continue
        if accelerated == TENSORRT:
            try:
                prepare_engine_cache(cache)
            except ValueError as error:
                log.warning("%s is not used: %s", accelerated, error)
                continue
        # TensorRT hands the nodes it cannot build to CUDA, then the CPU
        names = [p for p in ACCELERATED[i:] if p in available] + [CPU]
        try:
            # a missing CUDA library is reported by the C++ logger and print()
            with quiet_native_output():
                session = session_on(with_options(names))
        except Exception as error:  # onnxruntime raises bare RuntimeErrors of its own types
            log.info("%s is not usable here (%s)", accelerated, str(error).splitlines()[0][:200])
            continue
        if session.get_providers()[0] == accelerated:
            return session, session.get_providers()
        log.info("%s is not usable here (its libraries did not load)", accelerated)
    session = session_on([(CPU, {})])
    return session, session.get_providers()
