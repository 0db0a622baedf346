"""The service on a GPU, measured in one go: where the time goes between the session and a client.

On a CUDA machine with onnxruntime-gpu (about 6 minutes on a 16-core H100 machine; stages that
would overrun ``--budget-s`` are skipped and say so):

1. the machine: GPU, driver, CPU cores, versions;
2. ResNet-50 SMSO, p = 2,048, 1,000 classes, random weights, the ``image_folder`` preset (resize
   256, crop 224), exported in parallel: float32 with the 1x1-conv form, float32 with the
   covariance form, float16 with the 1x1-conv form, and both float32 forms at 448 px (the ``dtd``
   preset) (``export_checkpoint``, parity checked; ``--models-dir`` keeps and reuses them,
   ``--exports`` picks);
3. the raw session by batch size (1, 8, 32, 64, 128; at 448 px up to 64) for each export, the
   float32 1x1 form also through IO binding and with a CUDA graph per bucket
   (``service.runtime.runner``): images/s and ms per call, the same numpy input each call, no server
   (``--raw`` picks the runs);
4. onnxruntime's own profiler on the float32 session at batch 64: the time by operator type,
   with the host-device copies, per run (``--stages profile``);
5. the real server (``smso-serve`` in a subprocess, CUDA provider, max batch 64), time until
   ``/readyz``, then driven by client *processes* (one Python process tops out near 1-2k req/s)
   at 1, 16 and 64 concurrent requests, on ``/classify`` with 640x480 JPEGs and on ``/v2`` with
   binary FP32 tensors: req/s, p50/p95/p99, the server's stage split from ``/metrics``
   (decoding, queue, the inference thread's time and the batch's round trip), GPU utilisation
   read through NVML once a second (never ``nvidia-smi`` during a load: on some virtual machines
   it stalls CUDA); for each of ``--servers`` (``SERVER_VARIANTS``), by default: the default
   server, the same with a 0.5 ms GIL switch interval, four workers with CUDA graphs on the
   float32 and on the float16 export (also: one worker with CUDA graphs, two batches in flight,
   four workers without graphs, with 3 decode threads each, with the short switch interval;
   eight and twelve workers, eight under CUDA MPS, eight with 2 decode threads each, four,
   eight and twelve workers handing their batches to one session host); the
   cores each load kept busy, the machine's and the server's (from ``/proc``);
6. a sampling profile of the first server under the 64-client ``/v2`` load (``py-spy``, where
   installed: a speedscope file and three dumps of every thread);
7. JPEG decoding on this machine's cores: threads against processes, 640x480 -> 224 px
   (``--stages decoding``).

A stage that fails is recorded with its error and the run goes on. Writes ``OUT/serve_gpu.json``
(with the end of each server's log), ``OUT/serve_gpu.md`` (the tables, also printed) and
py-spy's two files. ``--smoke`` runs every stage tiny, on the CPU, with the shipped model (what
the test suite checks). On a lent machine that files reach in pieces, ``bench/gpu_lease.sh``
stages onnxruntime-gpu and runs this script over four calls.

    python bench/serve_gpu.py --out /tmp/gpu                  # on a CUDA machine
    python bench/serve_gpu.py --smoke --out /tmp/gpu-smoke    # anywhere, about a minute
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.serve import (  # noqa: E402  (the repository root goes on the path first)
    cpu_seconds,
    free_port,
    jpegs,
    oip_bodies,
    resnet_model,
    scrape,
    split,
    wait_ready,
)

SHIPPED = ROOT / "models" / "fashion-mnist-smso" / "model.onnx"
CUDA_PROVIDERS = "CUDAExecutionProvider,CPUExecutionProvider"


@contextlib.contextmanager
def stage(report: dict[str, Any], key: str) -> Iterator[None]:
    """Run one stage; an exception is recorded as ``report[key] = {"error": ...}`` and the run
    goes on (a lent machine's minutes are too few to lose the later stages to one failure)."""
    try:
        yield
    except Exception as error:  # any failure of one stage: recorded, printed, not fatal
        report[key] = {"error": f"{type(error).__name__}: {error}"}
        print(f"stage {key} failed: {report[key]['error']}", flush=True)


class Budget:
    """Seconds left of ``--budget-s``; a stage that needs more than is left is skipped."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def allows(self, seconds: float) -> bool:
        return time.monotonic() + seconds <= self.end

    def left(self) -> float:
        return self.end - time.monotonic()


# --- 1. the machine ------------------------------------------------------------------------


def nvml_handle() -> Any:
    """The first GPU's NVML handle, or None without NVML (nvidia-ml-py) or a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # no library, no driver, no device: all mean "no NVML here"
        return None


def machine() -> dict[str, Any]:
    import onnxruntime as ort

    info: dict[str, Any] = {
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "providers": ort.get_available_providers(),
    }
    with contextlib.suppress(ImportError):
        import torch

        info["torch"] = torch.__version__
    handle = nvml_handle()
    if handle is not None:
        import pynvml

        info["gpu"] = pynvml.nvmlDeviceGetName(handle)
        info["driver"] = pynvml.nvmlSystemGetDriverVersion()
        info["gpu_memory_gib"] = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
    return info


class GpuSampler:
    """GPU utilisation and memory through NVML, once every ``period_s``, in a thread."""

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
        if not self.samples:
            return None
        return {
            "gpu_util_mean": statistics.fmean(u for u, _ in self.samples),
            "gpu_util_max": max(u for u, _ in self.samples),
            "memory_used_gib": max(m for _, m in self.samples),
        }


class CpuMeter:
    """Where the machine's cores went during a load, from ``/proc`` (Linux): the whole
    machine's busy cores (``/proc/stat``: all but idle and iowait) and the server's (the CPU
    seconds of every process in its process group, workers included), each as core-seconds
    per second of the load. The difference is the clients' and everything else's. ``None``
    where ``/proc`` cannot be read."""

    def __init__(self, server_group: int) -> None:
        self.group = server_group
        self.tick = os.sysconf("SC_CLK_TCK")
        self.start: tuple[float, float, float] | None = None
        self.result: dict[str, float] | None = None

    def _machine_busy_s(self) -> float:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return (sum(fields[:8]) - idle) / self.tick  # user .. steal; guest is inside user

    def _group_s(self) -> float:
        total = 0.0
        for folder in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError, IndexError, ValueError):  # gone meanwhile
                if os.getpgid(int(folder.name)) == self.group:
                    total += cpu_seconds(int(folder.name))
        return total

    def __enter__(self) -> CpuMeter:
        with contextlib.suppress(OSError, ValueError):
            self.start = (time.perf_counter(), self._machine_busy_s(), self._group_s())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.start is None:
            return
        with contextlib.suppress(OSError, ValueError):
            wall = time.perf_counter() - self.start[0]
            self.result = {
                "machine_cores_busy": (self._machine_busy_s() - self.start[1]) / wall,
                "server_cores": (self._group_s() - self.start[2]) / wall,
                "cores": float(os.cpu_count() or 0),
            }


# --- 2. the models -------------------------------------------------------------------------


def export_one(
    workdir: str, name: str, form: str, fp16: bool, side: int = 224
) -> tuple[str, str, float]:
    """One export of ResNet-50 SMSO p = 2,048, 1,000 classes, at 224 px (the ``image_folder``
    preset) or 448 px (the ``dtd`` preset: resize 512): ``bench/serve.py``'s model."""
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 3))
    start = time.perf_counter()
    preset = {224: "image_folder", 448: "dtd"}[side]
    path = resnet_model(Path(workdir), name, preset, 1000, form, fp16)
    return name, str(path), time.perf_counter() - start


#: The exports: name -> (SMSO form, float16, image side). The first is the reference every
#: later stage uses (the profile, the servers), so it is always made.
EXPORTS: dict[str, tuple[str, bool, int]] = {
    "fp32-conv": ("conv", False, 224),
    "fp32-covariance": ("covariance", False, 224),
    "fp16-conv": ("conv", True, 224),
    "fp32-conv-448": ("conv", False, 448),
    "fp32-covariance-448": ("covariance", False, 448),
}
#: A server variant's setting that runs the server under CUDA MPS (:func:`mps`), not passed on.
MPS = "SMSO_BENCH_MPS"
#: Raw-session modes (``--raw EXPORT/MODE``).
RAW_MODES = ("plain", "io-binding", "cuda-graphs")


def _graphs(export: str, workers: int, **settings: str) -> tuple[str, dict[str, str]]:
    """A variant of ``workers`` worker processes with CUDA graphs, on ``export``, and
    ``settings`` beside."""
    return export, {"SMSO_WORKERS": str(workers), "SMSO_CUDA_GRAPHS": "true", **settings}


SHARED = {"SMSO_SHARED_SESSION": "true"}
#: Server variants (``--servers``): name -> (export, settings), one change at a time from the
#: default server. The per-bucket CUDA sessions fix every dimension, so CUDA graphs need no
#: fixed-size export. SMSO_WORKERS as named (2 with ``--smoke``).
SERVER_VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "cuda": ("fp32-conv", {}),
    "cuda-2-in-flight": ("fp32-conv", {"SMSO_BATCHES_IN_FLIGHT": "2"}),
    "cuda-graphs": ("fp32-conv", {"SMSO_CUDA_GRAPHS": "true"}),
    "workers": ("fp32-conv", {"SMSO_WORKERS": "4"}),
    "workers-graphs": _graphs("fp32-conv", 4),
    "workers-graphs-fp16": _graphs("fp16-conv", 4),
    # is four workers' /v2 bound by the workers' CPU (cores busy (server) near 4)? eight
    "workers8-graphs": _graphs("fp32-conv", 8),
    "workers8-graphs-fp16": _graphs("fp16-conv", 8),
    "workers12-graphs-fp16": _graphs("fp16-conv", 12),
    # eight workers' contexts take turns on the GPU (a batch of 1 ran 4.3 ms against 0.65 ms
    # alone): under CUDA MPS (one daemon, started for the variant) their kernels share it
    "workers8-graphs-fp16-mps": _graphs("fp16-conv", 8, **{MPS: "1"}),
    # one session host runs every worker's batches, merged: one CUDA context, larger batches
    "workers-shared-graphs": _graphs("fp32-conv", 4, **SHARED),
    "workers8-shared-graphs-fp16": _graphs("fp16-conv", 8, **SHARED),
    "workers12-shared-graphs-fp16": _graphs("fp16-conv", 12, **SHARED),
    # /classify at eight workers left 6 of 16 cores idle with one decode thread a worker
    "workers8-graphs-fp16-decode2": _graphs("fp16-conv", 8, SMSO_DECODE_THREADS="2"),
    # /classify with JPEGs decoded and resized on the GPU (SMSO_DECODE_DEVICE=cuda:
    # nvImageCodec and the preprocessing graph on the CUDA provider), CPU left for HTTP
    "workers8-graphs-fp16-gpudecode": _graphs("fp16-conv", 8, SMSO_DECODE_DEVICE="cuda"),
    "workers12-graphs-fp16-gpudecode": _graphs("fp16-conv", 12, SMSO_DECODE_DEVICE="cuda"),
    "workers8-shared-graphs-fp16-gpudecode": _graphs(
        "fp16-conv", 8, SMSO_DECODE_DEVICE="cuda", **SHARED
    ),
    # /classify is bound by decoding: 3 decode threads a worker (12 on 16 cores) instead of
    # the default 2 (half the cores)
    "workers-graphs-decode3": _graphs("fp32-conv", 4, SMSO_DECODE_THREADS="3"),
    # the inference thread's time per batch is several times the raw session's in a busy
    # server: does it wait for the GIL? (a switch interval of 0.5 ms instead of 5 ms)
    "cuda-switch": ("fp32-conv", {"SMSO_BENCH_SWITCH_INTERVAL_MS": "0.5"}),
    "workers-graphs-switch": _graphs("fp32-conv", 4, SMSO_BENCH_SWITCH_INTERVAL_MS="0.5"),
}


def models(workdir: Path, smoke: bool, only: list[str] | None = None) -> dict[str, Any]:
    """``name -> path`` of the exports (the shipped model alone with ``smoke``); an export
    already in ``workdir`` (``--models-dir``, from an earlier run) is used as it is. ``only``
    picks exports; ``fp32-conv`` is always among them."""
    if smoke:
        return {
            "paths": {"fp32-conv": str(SHIPPED)},
            "export_s": {},
        }
    names = [n for n in EXPORTS if not only or n in only or n == "fp32-conv"]
    variants = [(n, *EXPORTS[n]) for n in names]
    paths = {v[0]: str(workdir / f"{v[0]}.onnx") for v in variants}
    seconds: dict[str, float] = {}
    missing = [v for v in variants if not (workdir / f"{v[0]}.onnx").exists()]
    if not missing:
        return {"paths": paths, "export_s": seconds}
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(len(missing), mp_context=spawn) as pool:
        jobs = [pool.submit(export_one, str(workdir), *v) for v in missing]
        for job in jobs:
            name, path, took = job.result()
            paths[name], seconds[name] = path, took
    return {"paths": paths, "export_s": seconds}


# --- 3. and 4. the raw session -----------------------------------------------------------


def raw_session(
    path: str, mode: str, batches: list[int], providers: str, seconds: float
) -> dict[str, Any]:
    """Images/s and ms per call by batch size, through the service's own backend, and the
    median ms of each stage the runner records (:mod:`service.telemetry.stage_clock`)."""
    from service.runtime.backend import BackendOptions, OnnxBackend
    from service.telemetry import stage_clock

    if mode not in RAW_MODES:
        raise ValueError(f"unknown raw mode {mode!r}; valid: {', '.join(RAW_MODES)}")

    start = time.perf_counter()
    options = BackendOptions(
        providers=providers,
        max_batch=max(batches),
        io_binding=mode == "io-binding",
        cuda_graphs=mode == "cuda-graphs",
    )
    backend = OnnxBackend(path, options)
    spec = backend.card.input
    rng = np.random.default_rng(0)
    rows = {}
    for batch in batches:
        images = rng.standard_normal((batch, spec.channels, spec.height, spec.width), np.float32)
        for _ in range(3):  # first call at this shape; a CUDA graph's capture
            backend.run(images)
        times: list[float] = []
        stages: list[dict[str, float]] = []
        begin = time.perf_counter()
        while len(times) < 5 or time.perf_counter() - begin < seconds:
            stage_clock.take()
            t = time.perf_counter()
            backend.run(images)
            times.append(time.perf_counter() - t)
            stages.append(stage_clock.take())  # what the server's stage table shows, alone
        rows[batch] = {
            "images_per_second": batch * len(times) / sum(times),
            "ms_p50": 1e3 * statistics.median(times),
            "stages_ms_p50": {
                name: 1e3 * statistics.median(call[name] for call in stages) for name in stages[0]
            },
        }
    return {
        "mode": backend.mode,
        "providers": backend.providers,
        "by_batch": rows,
        "load_and_measure_s": time.perf_counter() - start,
    }


def ort_profile(path: str, providers: str, batch: int, runs: int, out: Path) -> dict[str, Any]:
    """onnxruntime's profiler: milliseconds per run by operator type (copies included)."""
    import onnxruntime as ort

    from service.runtime.providers import Accelerator, provider_options

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(out / "ort_profile")
    options.log_severity_level = 3
    names = [p.strip() for p in providers.split(",")]
    session = ort.InferenceSession(
        path,
        options,
        providers=[(n, provider_options(n, Accelerator((3, 224, 224), batch))) for n in names],
    )
    from service.core.card import parse_card

    spec = parse_card(session.get_modelmeta().custom_metadata_map)[0].input
    shape = (batch, spec.channels, spec.height, spec.width)
    images = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for _ in range(runs + 2):
        session.run(None, {"image": images})
    trace_file = Path(session.end_profiling())
    trace = json.loads(trace_file.read_text())
    trace_file.unlink()  # tens of MB; the summary below is what is kept
    by_op: dict[str, float] = {}
    run_us = []
    for event in trace:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            op = event.get("args", {}).get("op_name", "?")
            provider = event.get("args", {}).get("provider", "")
            key = f"{op} ({provider.replace('ExecutionProvider', '')})"
            by_op[key] = by_op.get(key, 0.0) + event["dur"]
        elif event.get("cat") == "Session" and event.get("name") == "model_run":
            run_us.append(event["dur"])
    total_runs = max(len(run_us), 1)
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:15]
    return {
        "batch": batch,
        "run_ms_median": statistics.median(run_us) / 1e3 if run_us else None,
        "ms_per_run_by_op": {k: v / 1e3 / total_runs for k, v in top},
        "providers": session.get_providers(),
    }


# --- 5. and 6. the server under load -------------------------------------------------------

_PAYLOADS: dict[str, Any] = {}


def _client_init(payloads: dict[str, Any]) -> None:
    _PAYLOADS.update(payloads)


_BOUNDARY = "smso-bench-boundary"


def _requests(kind: str) -> list[tuple[bytes, dict[str, str]]]:
    """Every payload of ``kind`` as a request body and its headers, encoded once."""
    if kind == "jpeg":
        head = (
            f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="i.jpg"'
            "\r\nContent-Type: image/jpeg\r\n\r\n"
        ).encode()
        tail = f"\r\n--{_BOUNDARY}--\r\n".encode()
        kind_header = {"Content-Type": f"multipart/form-data; boundary={_BOUNDARY}"}
        return [(head + data + tail, kind_header) for data in _PAYLOADS[kind]]
    return [
        (
            body,
            {
                "Inference-Header-Content-Length": str(length),
                "Content-Type": "application/octet-stream",
            },
        )
        for body, length in _PAYLOADS[kind]
    ]


class _StdlibClient:
    """One keep-alive connection through ``http.client``: a tenth of httpx's CPU per request,
    so that the clients leave the machine's cores to the server."""

    def __init__(self, url: str, timeout: float) -> None:
        import http.client
        import urllib.parse

        parts = urllib.parse.urlsplit(url)
        self.path = parts.path
        host = parts.hostname or "127.0.0.1"
        self.connection = http.client.HTTPConnection(host, parts.port, timeout=timeout)

    def post(self, body: bytes, headers: dict[str, str]) -> int:
        try:
            self.connection.request("POST", self.path, body=body, headers=headers)
            response = self.connection.getresponse()
            response.read()
            return response.status
        except (OSError, ValueError) as error:  # http.client's errors are OSError or ValueError
            self.connection.close()  # reconnects on the next request
            raise ConnectionError(str(error)) from error

    def close(self) -> None:
        self.connection.close()


class _HttpxClient:
    """One ``httpx.Client`` (what a Python user of the service would write)."""

    def __init__(self, url: str, timeout: float) -> None:
        import httpx

        self.url, self.http = url, httpx.Client(timeout=timeout)

    def post(self, body: bytes, headers: dict[str, str]) -> int:
        import httpx

        try:
            return self.http.post(self.url, content=body, headers=headers).status_code
        except httpx.HTTPError as error:
            raise ConnectionError(str(error)) from error

    def close(self) -> None:
        self.http.close()


#: ``--client``: the HTTP client each client thread uses.
CLIENT_KINDS: dict[str, type[_StdlibClient | _HttpxClient]] = {
    "stdlib": _StdlibClient,
    "httpx": _HttpxClient,
}


def _client_process(
    url: str, kind: str, threads: int, start_at: float, seconds: float, client: str = "stdlib"
) -> tuple[list[float], int]:
    """``threads`` clients in one process, each sending one request after another from
    ``start_at`` (a ``time.time()``) for ``seconds``: the latencies (s) of the 200 answers and
    the number of other answers (a timeout, a refused or dropped connection included)."""
    requests = _requests(kind)
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()

    def one_client(k: int) -> None:
        mine: list[float] = []
        # a request that takes longer than the load itself has failed
        http = CLIENT_KINDS[client](url, seconds + 10)
        try:
            time.sleep(max(0.0, start_at - time.time()))
            i, end = k, start_at + seconds
            while time.time() < end:
                body, headers = requests[i % len(requests)]
                t = time.perf_counter()
                try:
                    ok = http.post(body, headers) == 200
                except ConnectionError:
                    ok = False
                if ok:  # req/s and latencies count answers only
                    mine.append(time.perf_counter() - t)
                else:
                    with lock:
                        failures[0] += 1
                i += threads
        finally:
            http.close()
            with lock:
                latencies.extend(mine)

    pool = [threading.Thread(target=one_client, args=(k,)) for k in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return latencies, failures[0]


class Clients:
    """A pool of client processes that drives ``concurrency`` requests at a time."""

    def __init__(self, payloads: dict[str, Any], processes: int, client: str = "stdlib") -> None:
        spawn = multiprocessing.get_context("spawn")
        self.processes, self.client = processes, client
        self.pool = concurrent.futures.ProcessPoolExecutor(
            processes, mp_context=spawn, initializer=_client_init, initargs=(payloads,)
        )

    def load(self, url: str, kind: str, concurrency: int, seconds: float) -> dict[str, Any]:
        processes = min(self.processes, concurrency)
        threads = [
            concurrency // processes + (k < concurrency % processes) for k in range(processes)
        ]
        start_at = time.time() + 1.0
        jobs = [
            self.pool.submit(_client_process, url, kind, t, start_at, seconds, self.client)
            for t in threads
        ]
        latencies: list[float] = []
        failures = 0
        for job in jobs:
            part, failed = job.result()
            latencies.extend(part)
            failures += failed
        ms = sorted(1e3 * x for x in latencies)
        if not ms:
            return {"requests": 0, "failures": failures}
        return {
            "concurrency": concurrency,
            "requests": len(ms),
            "failures": failures,
            "requests_per_second": len(ms) / seconds,
            "mean_ms": statistics.fmean(ms),
            "p50_ms": float(np.percentile(ms, 50)),
            "p95_ms": float(np.percentile(ms, 95)),
            "p99_ms": float(np.percentile(ms, 99)),
        }

    def close(self) -> None:
        self.pool.shutdown()


def server_env(env_extra: dict[str, str]) -> dict[str, str]:
    """The server's environment: this one, the benchmark's settings, then ``env_extra``; with
    ``SMSO_BENCH_SWITCH_INTERVAL_MS``, ``bench/switch_interval`` first on ``PYTHONPATH`` (its
    ``sitecustomize`` sets the interval at start-up, in every worker process too)."""
    env = (
        os.environ
        | {
            "SMSO_MAX_BATCH_SIZE": "64",
            "SMSO_LOG_LEVEL": "warning",
            "SMSO_QUEUE_SIZE": "1024",
            "SMSO_GRPC_PORT": "0",
        }
        | env_extra
    )
    if "SMSO_BENCH_SWITCH_INTERVAL_MS" in env_extra:
        paths = [str(ROOT / "bench" / "switch_interval"), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


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
    started = subprocess.run(
        [exe, "-d"],
        env={**os.environ, **env},
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
            [exe],
            input="quit\n",
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=30,
        )


@contextlib.contextmanager
def server(
    model: str, env_extra: dict[str, str], log: Path, ready_timeout_s: float = 90
) -> Iterator[tuple[str, Any, float]]:
    """``smso-serve`` on a free port: ``(base URL, process, seconds until /readyz)``. The server
    runs in its own process group, which is terminated (killed after 20 s) on the way out, so
    a worker that ignores SIGTERM does not keep the GPU through the next variant."""
    port = free_port()
    env = server_env(env_extra)
    command = [sys.executable, "-m", "service.cli", "--model-path", model, "--port", str(port)]
    with log.open("w") as sink:
        start = time.perf_counter()
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=sink, stderr=sink, start_new_session=True
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_ready(f"{base}/readyz", process, timeout_s=ready_timeout_s)
            yield base, process, time.perf_counter() - start
        finally:
            stop_group(process)


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process's group; after the leader has exited (or 20 s), SIGKILL to
    whatever is left of the group (a worker that outlived its parent)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=20)


def py_spy(pid: int, seconds: float, out: Path, name: str) -> dict[str, Any]:
    """A sampling profile of the server (speedscope JSON) and a dump of its threads."""
    exe = shutil.which("py-spy")
    if exe is None:
        return {"skipped": "py-spy is not installed"}
    record = subprocess.run(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "200",
            "--format",
            "speedscope",
            "--output",
            str(out / f"{name}.speedscope.json"),
            "--threads",
            "--idle",
            "--nonblocking",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    dumps = []
    for _ in range(3):  # snapshots of every thread, a second apart
        dump = subprocess.run(
            [exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60
        )
        dumps.append(dump.stdout + dump.stderr)
        time.sleep(1.0)
    (out / f"{name}.dump.txt").write_text("\n\n".join(dumps))
    return {"record_status": record.returncode, "record_stderr": record.stderr[-500:]}


def serve_loads(
    model: str,
    variant: str,
    env_extra: dict[str, str],
    clients: Clients,
    args: argparse.Namespace,
    out: Path,
    profile: bool,
    ready_timeout_s: float = 90,
) -> dict[str, Any]:
    """Every route at every concurrency against one server; a py-spy profile of the busiest.
    A failure part-way is recorded as ``error`` beside the loads already measured."""

    result: dict[str, Any] = {"env": env_extra, "loads": []}
    folder = Path(tempfile.mkdtemp(prefix="serve-gpu-log-"))
    log = folder / f"server-{variant}.log"
    settings = {k: v for k, v in env_extra.items() if k != MPS}
    try:
        with contextlib.ExitStack() as stack:
            if env_extra.get(MPS):
                settings |= stack.enter_context(mps(folder / "mps"))
            base, process, ready_s = stack.enter_context(
                server(model, settings, log, ready_timeout_s)
            )
            _drive(base, process, ready_s, result, clients, args, out, variant, profile)
    except Exception as error:  # one variant's failure: recorded with what it measured
        result["error"] = f"{type(error).__name__}: {error}"
    finally:  # the machine's file transfer is limited: the log's end goes into the report
        result["log_tail"] = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    return result


def _drive(
    base: str,
    process: Any,
    ready_s: float,
    result: dict[str, Any],
    clients: Clients,
    args: argparse.Namespace,
    out: Path,
    variant: str,
    profile: bool,
) -> None:
    """The loads of :func:`serve_loads` against a running server; results into ``result``."""
    import httpx

    from service.core.card import CARD_KEY, parse_card

    result["ready_s"] = ready_s
    for _ in range(100):  # with several workers, /readyz may have been answered by one of them
        answer = httpx.get(f"{base}/metadata", timeout=10)
        if answer.status_code == 200:
            break
        time.sleep(0.2)
    card = answer.raise_for_status().json()["card"]
    name, _ = parse_card({CARD_KEY: json.dumps(card)})
    routes = {
        "/classify JPEG": (f"{base}/classify", "jpeg"),
        "/v2 FP32": (f"{base}/v2/models/{name.name}/infer", "fp32"),
    }
    for route, (url, kind) in routes.items():
        clients.load(url, kind, max(args.concurrency), args.seconds / 2)  # warm connections
        for concurrency in args.concurrency:
            before = scrape(f"{base}/metrics")
            with GpuSampler() as gpu, CpuMeter(process.pid) as cpu:
                load = clients.load(url, kind, concurrency, args.seconds)
            after = scrape(f"{base}/metrics")
            if load.get("requests"):
                load["split"] = split(before, after, load["mean_ms"])
            decoded = {  # with SMSO_DECODE_DEVICE=cuda: the images each path took
                where: after.get(f"smso_images_decoded_total[{where}]", 0.0)
                - before.get(f"smso_images_decoded_total[{where}]", 0.0)
                for where in ("device", "pillow")
            }
            if any(decoded.values()):
                load["decoded"] = decoded
            result["loads"].append(
                {"route": route, **load, "gpu": gpu.summary(), "cpu": cpu.result}
            )
    if profile:
        url, kind = routes["/v2 FP32"]
        worker = threading.Thread(
            target=clients.load, args=(url, kind, max(args.concurrency), args.seconds + 4)
        )
        worker.start()
        time.sleep(2.0)
        result["py_spy"] = py_spy(process.pid, args.seconds, out, f"py-spy-{variant}")
        worker.join()


# --- 7. decoding ---------------------------------------------------------------------------

_PRE: Any = None


def _decode_init(preprocessing: dict[str, Any]) -> None:
    global _PRE
    from service.core.card import Preprocessing
    from service.imaging.images import Preprocessor

    _PRE = Preprocessor(Preprocessing(**preprocessing), 10**9)


def _decode(data: bytes) -> int:
    return _PRE(data).shape[0]  # the array stays here: what a process pool would send back


def decoding(
    files: list[bytes], preprocessing: dict[str, Any], workers: list[int], seconds: float
) -> dict[str, Any]:
    """640x480 JPEG -> (3, 224, 224) float32 images/s with a thread pool and a process pool
    (the process pool's figure leaves out sending the arrays back)."""
    _decode_init(preprocessing)
    spawn = multiprocessing.get_context("spawn")
    rows = []
    for kind in ("threads", "processes"):
        for n in workers:
            if kind == "threads":
                pool: concurrent.futures.Executor = concurrent.futures.ThreadPoolExecutor(n)
            else:
                pool = concurrent.futures.ProcessPoolExecutor(
                    n, mp_context=spawn, initializer=_decode_init, initargs=(preprocessing,)
                )
            # at least 8 images per worker in each map (2 chunks of 4 for a process), so that
            # every worker stays busy until the map's last few images
            work = files * -(-8 * n // len(files))
            with pool:
                list(pool.map(_decode, files[: 2 * n]))  # start the workers
                done, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds:
                    list(pool.map(_decode, work, chunksize=4 if kind == "processes" else 1))
                    done += len(work)
                rate = done / (time.perf_counter() - start)
            rows.append({"kind": kind, "workers": n, "images_per_second": rate})
    return {"rows": rows}


# --- the report ----------------------------------------------------------------------------


def stage_table(loads: list[dict[str, Any]], raw: dict[str, Any] | None) -> list[str]:
    """The inference thread's mean ms per batch by stage (``smso_inference_stage_seconds``),
    a row per load, and the raw session's median ``run`` by batch size with the same export
    and mode (``raw``, where measured): a server's ``run`` well above the raw one at its batch
    size is what the server adds to the onnxruntime call (waits for the GIL, a busy device)."""
    from service.telemetry.stage_clock import STAGES

    rows = [load for load in loads if load.get("requests") and load["split"].get("stage_ms")]
    if not rows:
        return []
    alone = ""
    if raw and "by_batch" in raw:
        alone = ", ".join(
            f"{batch}: {row['stages_ms_p50']['run']:.2f}"
            for batch, row in raw["by_batch"].items()
            if "run" in row.get("stages_ms_p50", {})
        )
    lines = [
        "Inference thread, ms per batch by stage"
        + (f" (the raw session's `run` by batch size: {alone})" if alone else "")
        + ":",
        "",
        "| route | clients | mean batch | " + " | ".join(STAGES) + " |",
        "|---|--:|--:|" + "--:|" * len(STAGES),
    ]
    for load in rows:
        stages = load["split"]["stage_ms"]
        cells = [f"{stages[name]:.2f}" if name in stages else "-" for name in STAGES]
        lines.append(
            f"| {load['route']} | {load['concurrency']} | {load['split']['mean_batch']:.1f} | "
            + " | ".join(cells)
            + " |"
        )
    return [*lines, ""]


def markdown(report: dict[str, Any]) -> str:
    lines = [f"Machine: {json.dumps(report['machine'])}", ""]
    raw = report.get("raw", {})
    raw = {k: r for k, r in raw.items() if "by_batch" in r}
    if raw:
        columns = sorted({int(b) for r in raw.values() for b in r["by_batch"]})
        lines += [
            "| export | mode | " + " | ".join(f"batch {b} img/s (ms)" for b in columns) + " |",
            "|---|---|" + "--:|" * len(columns),
        ]
        for key, r in raw.items():
            by_batch = {int(b): v for b, v in r["by_batch"].items()}
            cells = [
                f"{by_batch[b]['images_per_second']:,.0f} ({by_batch[b]['ms_p50']:.2f})"
                if b in by_batch
                else "-"
                for b in columns
            ]
            lines.append(f"| {key.split('/')[0]} | {r['mode']} | " + " | ".join(cells) + " |")
        lines.append("")
    profile = report.get("ort_profile")
    if profile and "ms_per_run_by_op" in profile:
        lines += [
            f"onnxruntime profile, batch {profile['batch']}: run "
            f"{profile['run_ms_median']:.2f} ms (median)",
            "",
            "| operator (provider) | ms per run |",
            "|---|--:|",
        ]
        lines += [f"| {op} | {ms:.3f} |" for op, ms in profile["ms_per_run_by_op"].items()]
        lines.append("")
    for variant, result in report.get("server", {}).items():
        if "loads" not in result:
            lines += [f"server {variant}: {result}", ""]
            continue
        ready = f"ready after {result['ready_s']:.1f} s" if "ready_s" in result else "not ready"
        error = f", then failed: {result['error']}" if "error" in result else ""
        lines += [
            f"Server `{variant}` ({result['env'] or 'defaults'}), {ready}{error}:",
            "",
            "| route | clients | req/s | p50 ms | p95 ms | p99 ms | decode | queue | "
            "inference | round trip | rest | mean batch | GPU util % | cores busy (server) |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for load in result["loads"]:
            if not load.get("requests"):
                lines.append(
                    f"| {load['route']} | - | no answers ({load.get('failures')} failed) |"
                )
                continue
            s, gpu = load["split"], load.get("gpu")
            util = f"{gpu['gpu_util_mean']:.0f}" if gpu else "-"
            cpu = load.get("cpu")
            cores = f"{cpu['machine_cores_busy']:.1f} ({cpu['server_cores']:.1f})" if cpu else "-"
            lines.append(
                f"| {load['route']} | {load['concurrency']} | {load['requests_per_second']:,.0f} "
                f"| {load['p50_ms']:.1f} | {load['p95_ms']:.1f} | {load['p99_ms']:.1f} | "
                f"{s['decode_ms']:.2f} | {s['queue_ms']:.2f} | {s['inference_ms']:.2f} | "
                f"{s.get('round_trip_ms', 0.0):.2f} | {s['response_ms']:.2f} | "
                f"{s['mean_batch']:.1f} | {util} | {cores} |"
            )
        lines.append("")
        export, env = SERVER_VARIANTS.get(variant, ("", {}))
        mode = "cuda-graphs" if env.get("SMSO_CUDA_GRAPHS") == "true" else "plain"
        lines += stage_table(result["loads"], raw.get(f"{export}/{mode}"))
    decode = report.get("decoding")
    if decode:
        lines += ["| JPEG decoding | workers | img/s |", "|---|--:|--:|"]
        lines += [
            f"| {r['kind']} | {r['workers']} | {r['images_per_second']:,.0f} |"
            for r in decode["rows"]
        ]
        lines.append("")
    if report.get("skipped"):
        lines.append(f"Skipped for the time budget: {', '.join(report['skipped'])}")
    return "\n".join(lines) + "\n"


def load_seconds(args: argparse.Namespace, profile: bool) -> float:
    """Seconds one server variant's loads take: per route a warm-up of half a load, then a
    load per concurrency (each starting a second after it is submitted); the profile's load."""
    per_route = args.seconds / 2 + 1 + len(args.concurrency) * (args.seconds + 1)
    return 2 * per_route + (args.seconds + 4 + 5 if profile else 0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument("--smoke", action="store_true", help="every stage, tiny, on the CPU")
    parser.add_argument("--budget-s", type=float, default=450, help="skip stages past this")
    parser.add_argument("--seconds", type=float, default=5.0, help="per load")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    parser.add_argument("--client-processes", type=int, default=8)
    parser.add_argument(
        "--client",
        choices=list(CLIENT_KINDS),
        default="stdlib",
        help="the clients' HTTP library: http.client (light, the default) or httpx",
    )
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=None,
        help="export here and reuse the exports found here (default: a temporary folder)",
    )
    parser.add_argument("--export-only", action="store_true", help="export the models, then stop")
    parser.add_argument(
        "--exports",
        nargs="*",
        default=None,
        choices=list(EXPORTS),
        help="export only these (default: all five; fp32-conv always)",
    )
    parser.add_argument(
        "--raw",
        nargs="*",
        default=None,
        metavar="EXPORT/MODE",
        help="raw-session runs (default: every export plainly, fp32-conv with "
        "io-binding and with cuda-graphs)",
    )
    parser.add_argument(
        "--stages",
        nargs="*",
        default=["profile", "decoding"],
        choices=["profile", "decoding"],
        help="optional stages to run",
    )
    parser.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="py-spy on the first server variant under load",
    )
    parser.add_argument(
        "--servers",
        nargs="*",
        default=["cuda", "cuda-switch", "workers-graphs", "workers-graphs-fp16"],
        choices=list(SERVER_VARIANTS),
        help="server variants to load (the first is profiled)",
    )
    args = parser.parse_args(argv)
    for item in args.raw or []:
        name, _, mode = item.partition("/")
        if name not in EXPORTS or mode not in RAW_MODES:
            parser.error(
                f"--raw {item}: expected EXPORT/MODE with EXPORT one of {', '.join(EXPORTS)} "
                f"and MODE one of {', '.join(RAW_MODES)}"
            )
    # what --raw and --servers use must be exported (--smoke serves the shipped model alone)
    made = set(args.exports or EXPORTS) | {"fp32-conv"}
    needed = {item.partition("/")[0] for item in args.raw or []}
    needed |= {SERVER_VARIANTS[v][0] for v in args.servers}
    if not args.smoke and needed - made:
        parser.error(
            f"--exports {' '.join(args.exports)} leaves out {', '.join(sorted(needed - made))}, "
            "which --raw or --servers use"
        )
    if args.smoke:
        args.seconds, args.concurrency, args.batches = 1.0, [1, 4], [1, 8]
        args.client_processes = 2
    return args


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds, so a running server's group is stopped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s)
    providers = "auto" if args.smoke else CUDA_PROVIDERS
    report: dict[str, Any] = {"settings": vars(args) | {"out": str(out)}, "skipped": []}
    report["machine"] = machine()
    print(f"machine: {report['machine']}", flush=True)

    def save() -> None:
        (out / "serve_gpu.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        (out / "serve_gpu.md").write_text(markdown(report))

    with tempfile.TemporaryDirectory(prefix="serve-gpu-") as tmp:
        workdir = args.models_dir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        exported = models(workdir, args.smoke, args.exports)
        report["export_s"] = exported["export_s"]
        paths = exported["paths"]
        print(f"exported: {exported['export_s']}", flush=True)
        if args.export_only:
            return 0
        raw_plan = [(name, "plain") for name in paths] + [
            ("fp32-conv", "io-binding"),
            ("fp32-conv", "cuda-graphs"),
        ]
        if args.raw is not None:
            raw_plan = [tuple(item.split("/", 1)) for item in args.raw]
        report["raw"] = {}
        for name, mode in raw_plan:
            if name not in paths:
                report["raw"][f"{name}/{mode}"] = {"error": f"{name} was not exported (--exports)"}
                continue
            if not budget.allows(60 + 200):
                report["skipped"].append(f"raw {name} {mode}")
                continue
            batches = [b for b in args.batches if b <= 64] if "448" in name else args.batches
            with stage(report["raw"], f"{name}/{mode}"):
                report["raw"][f"{name}/{mode}"] = raw_session(
                    paths[name], mode, batches, providers, args.seconds / 5
                )
            print(f"raw {name} {mode}: {report['raw'][f'{name}/{mode}']}", flush=True)
            save()
        if "profile" in args.stages and not budget.allows(30):
            report["skipped"].append("profile")
        elif "profile" in args.stages:
            with stage(report, "ort_profile"):
                report["ort_profile"] = ort_profile(
                    paths["fp32-conv"],
                    "CPUExecutionProvider" if args.smoke else CUDA_PROVIDERS,
                    8 if args.smoke else 64,
                    5,
                    Path(tmp),
                )
        save()

        files = jpegs(32)
        from service.imaging.images import Preprocessor
        from service.runtime.backend import read_card

        card = read_card(paths["fp32-conv"])
        pre = Preprocessor(card.preprocessing, 10**9)
        payloads = {"jpeg": files, "fp32": oip_bodies(files, np.stack([pre(f) for f in files]))}
        clients = Clients(payloads, args.client_processes, args.client)
        report["server"] = {}
        try:
            for variant in args.servers:
                model, env = SERVER_VARIANTS[variant]
                model = "fp32-conv" if args.smoke else model  # smoke: the shipped model only
                profiled = args.profile and variant == args.servers[0]
                loads = load_seconds(args, profiled)
                if not budget.allows(20 + loads + 45):  # ready, the loads, the stop
                    report["skipped"].append(f"server {variant}")
                    continue
                env = {"SMSO_PROVIDERS": providers} | env
                if "SMSO_WORKERS" in env and args.smoke:
                    env["SMSO_WORKERS"] = "2"
                report["server"][variant] = serve_loads(
                    paths[model],
                    variant,
                    env,
                    clients,
                    args,
                    out,
                    profile=profiled,
                    ready_timeout_s=min(90.0, budget.left() - loads - 45),
                )
                print(f"server {variant}: done", flush=True)
                save()
        finally:
            clients.close()
        if "decoding" not in args.stages:
            pass
        elif budget.allows(30):
            cores = os.cpu_count() or 2
            workers = sorted({1, max(1, cores // 4), max(1, cores // 2), cores})
            with stage(report, "decoding"):
                report["decoding"] = decoding(
                    files, card.preprocessing.model_dump(), workers, 0.5 if args.smoke else 2.0
                )
        else:
            report["skipped"].append("decoding")
    save()
    print(markdown(report))
    print(f"Results written to {out / 'serve_gpu.json'} and {out / 'serve_gpu.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
