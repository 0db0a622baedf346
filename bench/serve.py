"""The service under load: requests per second and latency, against what its parts could do.

For each model, in one run:

* the real server (``smso-serve`` in a subprocess on loopback) is driven by ``--clients``
  concurrent clients posting JPEG files to ``/classify`` (after a warm-up): requests and images
  per second, p50 / p95 / p99 latency, and the mean time per request split into decode, queue
  wait and inference (from the server's own metrics) and the rest (HTTP, multipart parsing,
  JSON: "response");
* what it is compared with, in ``--rounds`` interleaved rounds (this machine is shared and
  noisy: a ratio is taken per round, and the median reported): for the shipped model, a bare
  FastAPI endpoint on the same uvicorn that only reads the multipart upload; for ResNet-50, the
  raw onnxruntime session on the same preprocessed tensors at its best batch size;
* for the shipped model, the Open Inference Protocol beside ``/classify``: the same JPEGs sent
  to ``/v2/models/<name>/infer`` as binary ``BYTES`` and as preprocessed binary ``FP32``
  tensors, and the same tensors over gRPC (``ModelInfer`` with ``tritonclient.grpc``, on the
  same server), top-5 classification in all, in interleaved rounds.

* a GPU-like stand-in backend (``bench/standin.py``: it sleeps as a GPU batch takes, with the
  card of ResNet-50 at 224 px) behind the real server, against bare endpoints reading the same
  requests: the serving path's own cost, which a GPU no longer hides.

Models: the shipped Fashion-MNIST model with 640x480 JPEG uploads (Fashion-MNIST test images
scaled up: real picture content), and ResNet-50 SMSO at 448 px, p = 2,048, random weights, with
the same JPEGs. Targets: ResNet-50 service images/s at 16 clients >= 0.85 of the raw session's;
shipped model requests/s >= 0.5 of the bare endpoint's. Also reports the server's resident memory.

    python bench/serve.py                   # both models (a few minutes on 2 cores)
    python bench/serve.py --quick           # the shipped model only, fewer requests
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import io
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "models" / "fashion-mnist-smso" / "model.onnx"
DEFAULT_JSON = ROOT / "bench" / "results" / "serve.json"
FMNIST = Path("/usr/share/datasets/fashion-mnist")

BARE_APP = """
from fastapi import FastAPI, Request
app = FastAPI()

@app.post("/upload")
async def upload(request: Request):
    form = await request.form()
    sizes = [len(await f.read()) for f in form.getlist("file")]
    await form.close()
    return {"sizes": sizes}

@app.post("/body")
async def body(request: Request):
    return {"size": len(await request.body())}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jpegs(count: int, size: tuple[int, int] = (640, 480)) -> list[bytes]:
    """Fashion-MNIST test images (or smooth synthetic ones without the dataset) as JPEGs."""
    files = []
    try:
        sys.path.insert(0, str(ROOT))
        from training.datasets.fashion_mnist import read_idx

        images = read_idx(FMNIST / "t10k-images-idx3-ubyte.gz")[:count]
    except (OSError, ImportError):
        rng = np.random.default_rng(0)
        images = (rng.random((count, 28, 28)) * 255).astype(np.uint8)
    for image in images:
        buf = io.BytesIO()
        Image.fromarray(image).convert("RGB").resize(size, Image.Resampling.BILINEAR).save(
            buf, "JPEG", quality=90
        )
        files.append(buf.getvalue())
    return files


def wait_ready(url: str, process: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s:.0f} s")


#: ``send(client, i)``: the i-th request of a load, returning its response.
class Answer(Protocol):
    """What :func:`drive` reads of a sent request's answer (``httpx.Response`` has it)."""

    status_code: int


#: One request: ``send(client, i)`` sends the ``i``-th request through ``client``.
Send = Callable[[httpx.Client, int], Answer]


def multipart(url: str, files: list[bytes]) -> Send:
    """One JPEG per request as a multipart part named ``file`` (``/classify``, ``/upload``)."""

    def send(client: httpx.Client, i: int) -> httpx.Response:
        data = files[i % len(files)]
        return client.post(url, files=[("file", (f"{i}.jpg", data, "image/jpeg"))])

    return send


def oip_bodies(files: list[bytes], tensors: np.ndarray | None) -> list[tuple[bytes, int]]:
    """Open Inference Protocol ``infer`` bodies with binary data, one image each: the JPEG as
    ``image_bytes`` (or, given ``tensors``, its preprocessed ``FP32`` tensor as ``image``);
    asking for the top 5 classes as JSON, what ``/classify`` answers by default."""
    sys.path.insert(0, str(ROOT))
    from service.protocol.codec import pack_bytes

    bodies = []
    for i, data in enumerate(files):
        if tensors is None:
            name, datatype, shape, raw = "image_bytes", "BYTES", [1], pack_bytes([data])
        else:
            tensor = tensors[i : i + 1].astype("<f4")
            name, datatype, shape, raw = "image", "FP32", list(tensor.shape), tensor.tobytes()
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": name,
                        "datatype": datatype,
                        "shape": shape,
                        "parameters": {"binary_data_size": len(raw)},
                    }
                ],
                "outputs": [{"name": "logits", "parameters": {"classification": 5}}],
            }
        ).encode()
        bodies.append((header + raw, len(header)))
    return bodies


def oip(url: str, bodies: list[tuple[bytes, int]]) -> Send:
    def send(client: httpx.Client, i: int) -> httpx.Response:
        body, length = bodies[i % len(bodies)]
        headers = {
            "Inference-Header-Content-Length": str(length),
            "Content-Type": "application/octet-stream",
        }
        return client.post(url, content=body, headers=headers)

    return send


class _Answered:
    """What a gRPC send gives :func:`drive`: an HTTP-like status (200, or 500 on an error)."""

    def __init__(self, status_code: int) -> None:
        self.status_code = status_code


def grpc_infer(target: str, name: str, tensors: np.ndarray) -> Send:
    """One preprocessed ``FP32`` tensor per ``ModelInfer`` over gRPC (``tritonclient.grpc``,
    raw tensor contents), asking for the top 5 classes as ``/classify`` does; each client
    thread has a channel of its own. The httpx client :func:`drive` passes is not used."""
    import threading

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    local = threading.local()

    def send(client: httpx.Client, i: int) -> _Answered:
        if not hasattr(local, "client"):
            local.client = grpcclient.InferenceServerClient(target)
        tensor = tensors[i % len(tensors)][None].astype(np.float32)
        image = grpcclient.InferInput("image", list(tensor.shape), "FP32")
        image.set_data_from_numpy(tensor)
        wanted = [grpcclient.InferRequestedOutput("logits", class_count=5)]
        try:
            local.client.infer(name, [image], outputs=wanted)
        except InferenceServerException:
            return _Answered(500)
        return _Answered(200)

    return send


def drive(send: Send, clients: int, requests: int) -> dict[str, Any]:
    """``requests`` requests from ``clients`` threads; requests per second, latency percentiles."""
    latencies: list[float] = []
    failures = 0

    def worker(indices: list[int]) -> None:
        nonlocal failures
        with httpx.Client(timeout=120) as client:
            for i in indices:
                start = time.perf_counter()
                response = send(client, i)
                latencies.append(time.perf_counter() - start)
                failures += response.status_code != 200

    chunks = [list(range(k, requests, clients)) for k in range(clients)]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(worker, chunks))
    seconds = time.perf_counter() - start
    ms = sorted(1e3 * x for x in latencies)
    return {
        "requests": requests,
        "failures": failures,
        "seconds": seconds,
        "requests_per_second": requests / seconds,
        "mean_ms": statistics.fmean(ms),
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
        "p99_ms": float(np.percentile(ms, 99)),
        "latencies_ms": ms,
    }


def scrape(url: str) -> dict[str, float]:
    """``name -> value`` of a Prometheus text page, each name's samples summed over their
    labels (every model's, for instance) except ``le`` (histogram buckets are skipped); a
    sample with a ``stage`` or ``decoder`` label also adds to ``name[that label's value]``."""
    values: dict[str, float] = {}
    for line in httpx.get(url, timeout=10).text.splitlines():
        match = re.match(r"^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if match and 'le="' not in (match.group(2) or ""):
            name, value = match.group(1), float(match.group(3))
            values[name] = values.get(name, 0.0) + value
            label = re.search(r'(?:stage|decoder)="([^"]*)"', match.group(2) or "")
            if label:
                key = f"{name}[{label.group(1)}]"
                values[key] = values.get(key, 0.0) + value
    return values


def rss_mib(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    out = {}
    for key in ("VmRSS", "VmHWM"):
        match = re.search(rf"{key}:\s+(\d+) kB", status)
        out[key] = int(match.group(1)) / 1024 if match else float("nan")
    return out


def protocol_case(
    base: str,
    grpc_target: str,
    model: Path,
    files: list[bytes],
    clients: int,
    requests: int,
    rounds: int,
) -> dict[str, Any]:
    """The same JPEGs through ``/classify`` (multipart), the protocol's ``infer`` with image
    bytes, and with preprocessed binary tensors over REST and over gRPC, in interleaved
    rounds."""
    backend, tensors = session_and_tensors(model, files)
    infer = f"{base}/v2/models/{backend.card.name}/infer"
    variants = {
        "/classify multipart JPEG": multipart(f"{base}/classify", files),
        "/v2 infer, JPEG as binary BYTES": oip(infer, oip_bodies(files, None)),
        "/v2 infer, preprocessed binary FP32": oip(infer, oip_bodies(files, tensors)),
        "gRPC ModelInfer, preprocessed FP32": grpc_infer(grpc_target, backend.card.name, tensors),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, send in variants.items():
            runs[name].append(drive(send, clients, requests // rounds))
    return {name: merge(results) for name, results in runs.items()}


def session_and_tensors(
    model: Path, files: list[bytes], max_batch: int = 256
) -> tuple[Any, np.ndarray]:
    """The model's onnxruntime backend and ``files`` preprocessed as the service does."""
    sys.path.insert(0, str(ROOT))
    from service.imaging.images import Preprocessor
    from service.runtime.backend import BackendOptions, OnnxBackend

    backend = OnnxBackend(model, BackendOptions(max_batch=max_batch))
    pre = Preprocessor(backend.card.preprocessing, 10**9)
    return backend, np.stack([pre(data) for data in files])


def raw_session(
    backend: Any, tensors: np.ndarray, batches: Sequence[int], seconds: float = 3.0
) -> dict[str, Any]:
    """The onnxruntime session alone on the service's own preprocessed tensors."""
    per_batch = {}
    for batch in batches:
        images = np.resize(tensors, (batch, *tensors.shape[1:])).astype(np.float32)
        backend.run(images)  # warm-up
        runs, start = 0, time.perf_counter()
        while runs < 3 or time.perf_counter() - start < seconds:
            backend.run(images)
            runs += 1
        per_batch[batch] = batch * runs / (time.perf_counter() - start)
    best = max(per_batch, key=per_batch.__getitem__)
    return {
        "images_per_second_by_batch": per_batch,
        "best_batch": best,
        "images_per_second": per_batch[best],
        "providers": backend.providers,
    }


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system, all threads) process ``pid`` has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def children_cpu_seconds(pid: int) -> float:
    """The CPU time the live child processes of ``pid`` have used so far (Linux)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                total += cpu_seconds(int(child))
    return total


@contextlib.contextmanager
def running(
    command: list[str], ready: str, cwd: Path, env: dict[str, str] | None = None, output: Any = None
) -> Iterator[tuple[str, subprocess.Popen]]:
    """A server subprocess on a free loopback port: ``(base URL, process)`` once ``ready``
    answers 200; SIGTERM on exit. ``{port}`` in ``command`` is replaced by the port; the
    server's output goes to ``output`` (a file) when given."""
    port = free_port()
    # HTTP only unless asked: several servers at once would share gRPC's default port
    env = {"SMSO_GRPC_PORT": "0"} | (os.environ if env is None else env)
    server = subprocess.Popen(
        [c.replace("{port}", str(port)) for c in command],
        cwd=cwd,
        env=env,
        stdout=output,
        stderr=output,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{base}{ready}", server)
        yield base, server
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def service(model: Path, max_batch: int, grpc_port: int = 0) -> contextlib.AbstractContextManager:
    """The real server on ``model``: HTTP on a free port, gRPC on ``grpc_port`` (0: none)."""
    env = os.environ | {
        "SMSO_MAX_BATCH_SIZE": str(max_batch),
        "SMSO_MAX_WAIT_MS": "5",
        "SMSO_LOG_LEVEL": "warning",
        "SMSO_GRPC_PORT": str(grpc_port),
    }
    command = [sys.executable, "-m", "service.cli", "--model-path", str(model), "--port", "{port}"]
    return running(command, "/readyz", ROOT, env)


@contextlib.contextmanager
def bare() -> Iterator[tuple[str, subprocess.Popen]]:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "bare_app.py").write_text(BARE_APP)
        command = [
            sys.executable,
            "-m",
            "uvicorn",
            "bare_app:app",
            "--port",
            "{port}",
            "--log-level",
            "warning",
        ]
        with running(command, "/docs", Path(tmp)) as server:
            yield server


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one load as one: requests/s over their summed time, latency over all."""
    ms = sorted(x for r in runs for x in r["latencies_ms"])
    requests, seconds = sum(r["requests"] for r in runs), sum(r["seconds"] for r in runs)
    return {
        "requests": requests,
        "failures": sum(r["failures"] for r in runs),
        "seconds": seconds,
        "requests_per_second": requests / seconds,
        "mean_ms": statistics.fmean(ms),
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
        "p99_ms": float(np.percentile(ms, 99)),
        "rounds_rps": [r["requests_per_second"] for r in runs],
    }


def split(before: dict[str, float], after: dict[str, float], mean_ms: float) -> dict[str, Any]:
    """Mean time per request by stage, from the server's metrics, and the rest ("response");
    and the inference thread's mean time per batch by stage (``stage_ms``)."""
    from service.telemetry.stage_clock import STAGES

    def mean(metric: str, stage: str = "") -> float:
        count, total = f"{metric}_count{stage}", f"{metric}_sum{stage}"
        return (
            1e3
            * (after[total] - before.get(total, 0))
            / max(after[count] - before.get(count, 0), 1)
        )

    decode, queue, inference = (
        mean("smso_decode_seconds"),
        mean("smso_queue_wait_seconds"),
        mean("smso_inference_seconds"),
    )
    round_trip = mean("smso_batch_round_trip_seconds")
    batches = after["smso_batch_size_count"] - before.get("smso_batch_size_count", 0)
    images = after["smso_batch_size_sum"] - before.get("smso_batch_size_sum", 0)
    stages = "smso_inference_stage_seconds"
    return {
        "decode_ms": decode,
        "queue_ms": queue,
        "inference_ms": inference,
        "round_trip_ms": round_trip,
        "response_ms": mean_ms - decode - queue - round_trip,
        "mean_batch": images / max(batches, 1),
        # the inference thread's time per batch by stage (service.telemetry.stage_clock.STAGES)
        "stage_ms": {
            name: mean(stages, f"[{name}]") for name in STAGES if f"{stages}_count[{name}]" in after
        },
    }


def shipped_case(args: argparse.Namespace, files: list[bytes]) -> dict[str, Any]:
    """The shipped model's service against the bare endpoint, in interleaved rounds (both
    servers up, one driven at a time); then the protocol routes; then the raw session."""
    per_round = args.requests // args.rounds
    grpc_port = free_port()
    with bare() as (bare_base, _), service(SHIPPED, 16, grpc_port) as (base, server):
        upload, classify = (
            multipart(f"{bare_base}/upload", files),
            multipart(f"{base}/classify", files),
        )
        drive(upload, args.clients, args.clients)
        drive(classify, args.clients, max(args.clients, args.requests // 10))
        before = scrape(f"{base}/metrics")
        bare_runs, service_runs = [], []
        for _ in range(args.rounds):
            bare_runs.append(drive(upload, args.clients, per_round))
            service_runs.append(drive(classify, args.clients, per_round))
        after = scrape(f"{base}/metrics")
        memory = rss_mib(server.pid)
        protocols = protocol_case(
            base, f"127.0.0.1:{grpc_port}", SHIPPED, files, args.clients, args.requests, args.rounds
        )
    bare_load, load = merge(bare_runs), merge(service_runs)
    ratios = [
        s["requests_per_second"] / b["requests_per_second"]
        for s, b in zip(service_runs, bare_runs, strict=True)
    ]
    return {
        "bare": bare_load,
        "service": {
            "model": "fashion-mnist (shipped)",
            **load,
            "images_per_second": load["requests_per_second"],
            "split": split(before, after, load["mean_ms"]),
            "memory_mib": memory,
            "protocols": protocols,
        },
        "raw": raw_session(*session_and_tensors(SHIPPED, files), (1, 16, 64, 256)),
        "ratio_by_round": ratios,
        "ratio": statistics.median(ratios),
    }


def standin(max_batch: int) -> contextlib.AbstractContextManager:
    """The real server on the GPU-like stand-in backend (``bench/standin.py``)."""
    env = os.environ | {"SMSO_LOG_LEVEL": "warning"}
    command = [
        sys.executable,
        str(ROOT / "bench" / "standin.py"),
        "--port",
        "{port}",
        "--max-batch-size",
        str(max_batch),
    ]
    return running(command, "/readyz", ROOT, env)


def raw_body(url: str, bodies: list[tuple[bytes, int]]) -> Send:
    """The protocol bodies posted to the bare endpoint's ``/body``, which only reads them."""

    def send(client: httpx.Client, i: int) -> httpx.Response:
        return client.post(url, content=bodies[i % len(bodies)][0])

    return send


def standin_case(args: argparse.Namespace, files: list[bytes]) -> dict[str, Any]:
    """The serving path with a GPU-like backend (1.3 ms + 0.19 ms per image, ResNet-50's card at
    224 px): ``/classify`` JPEGs against the bare multipart endpoint, ``/v2`` binary FP32
    tensors against a bare endpoint that reads the same bodies, in interleaved rounds at
    ``--clients``; then one client at a time, whose extra latency over the bare endpoint, less
    decoding and the backend's own time (from the server's metrics), is the service's overhead
    per request: queueing, thread hops, parsing and answering."""
    sys.path.insert(0, str(ROOT))
    from bench.standin import CARD
    from service.core.card import CARD_KEY, parse_card
    from service.imaging.images import Preprocessor

    card, _ = parse_card({CARD_KEY: json.dumps(CARD)})
    pre = Preprocessor(card.preprocessing, 10**9)
    bodies = oip_bodies(files, np.stack([pre(data) for data in files]))
    per_round = args.requests // args.rounds
    with bare() as (bare_base, _), standin(64) as (base, _):
        infer = f"{base}/v2/models/{card.name}/infer"
        pairs = {
            "/classify multipart JPEG": (
                multipart(f"{bare_base}/upload", files),
                multipart(f"{base}/classify", files),
            ),
            "/v2 infer, preprocessed binary FP32": (
                raw_body(f"{bare_base}/body", bodies),
                oip(infer, bodies),
            ),
        }
        results: dict[str, Any] = {}
        for name, (bare_send, send) in pairs.items():
            drive(bare_send, args.clients, args.clients)
            drive(send, args.clients, args.clients)
            bare_runs, runs = [], []
            for _ in range(args.rounds):
                bare_runs.append(drive(bare_send, args.clients, per_round))
                runs.append(drive(send, args.clients, per_round))
            ratios = [
                r["requests_per_second"] / b["requests_per_second"]
                for r, b in zip(runs, bare_runs, strict=True)
            ]
            one_bare = drive(bare_send, 1, per_round // 2)
            before = scrape(f"{base}/metrics")
            one = drive(send, 1, per_round // 2)
            stages = split(before, scrape(f"{base}/metrics"), one["mean_ms"])
            results[name] = {
                "bare": merge(bare_runs),
                "service": merge(runs),
                "ratio_by_round": ratios,
                "ratio": statistics.median(ratios),
                "one_client": {
                    "bare_p50_ms": one_bare["p50_ms"],
                    "service_p50_ms": one["p50_ms"],
                    "decode_ms": stages["decode_ms"],
                    "inference_ms": stages["inference_ms"],
                    "overhead_ms": one["p50_ms"]
                    - one_bare["p50_ms"]
                    - stages["decode_ms"]
                    - stages["inference_ms"],
                },
            }
    return results


def resnet_case(args: argparse.Namespace, files: list[bytes]) -> dict[str, Any]:
    """ResNet-50 SMSO's service against its raw session at its best batch size, in interleaved
    rounds (the raw session runs while the server is idle)."""
    per_round = max(args.clients, args.resnet_requests // args.rounds)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        model = resnet_model(Path(tmp))
        backend, tensors = session_and_tensors(model, files[:8])
        raw = raw_session(backend, tensors, (1, 4, 8, 16))
        with service(model, args.clients) as (base, _):
            classify = multipart(f"{base}/classify", files)
            drive(classify, args.clients, args.clients)
            before = scrape(f"{base}/metrics")
            service_runs, raw_rates = [], []
            for _ in range(args.rounds):
                service_runs.append(drive(classify, args.clients, per_round))
                best = raw_session(backend, tensors, (raw["best_batch"],), seconds=5.0)
                raw_rates.append(best["images_per_second"])
            after = scrape(f"{base}/metrics")
    load = merge(service_runs)
    ratios = [s["requests_per_second"] / r for s, r in zip(service_runs, raw_rates, strict=True)]
    raw["images_per_second_by_round"] = raw_rates
    return {
        "service": {
            "model": "resnet50 p=2048 448 px",
            **load,
            "images_per_second": load["requests_per_second"],
            "split": split(before, after, load["mean_ms"]),
        },
        "raw": raw,
        "ratio_by_round": ratios,
        "ratio": statistics.median(ratios),
    }


def resnet_model(
    workdir: Path,
    name: str = "resnet50",
    preset: str = "dtd",
    classes: int = 47,
    form: str = "conv",
    fp16: bool = False,
) -> Path:
    """ResNet-50 SMSO (p = 2,048), random weights (seed 0), at ``preset``'s size (``dtd``:
    448 px, resize 512; ``image_folder``: 224 px, resize 256; ImageNet mean and std), exported
    to ``workdir/<name>.onnx`` in SMSO ``form`` (parity checked)."""
    sys.path.insert(0, str(ROOT))
    import torch

    from export.onnx_export import export_checkpoint
    from training.checkpoint import save_checkpoint
    from training.datasets.presets import PRESETS
    from training.model import ModelConfig, build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(classes, "resnet50", "smso", {"dim": 2048})).eval()
    checkpoint = save_checkpoint(
        workdir / f"{name}.pt",
        model,
        preset=PRESETS[preset].to_dict(),
        classes=[f"class{k}" for k in range(classes)],
    )
    return export_checkpoint(
        checkpoint,
        workdir / f"{name}.onnx",
        form=form,  # type: ignore[arg-type]
        fp16=fp16,
        batch_sizes=(1, 2),
    ).path


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=800, help="shipped model, per load")
    parser.add_argument("--resnet-requests", type=int, default=144)
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per comparison")
    parser.add_argument("--quick", action="store_true", help="the shipped model only")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return parser.parse_args(argv)


def print_tables(shipped: dict[str, Any], resnet: dict[str, Any] | None) -> None:
    print(
        "| what | req/s | p50 ms | p95 ms | p99 ms | decode ms | queue ms | inference ms | "
        "response ms | raw session img/s (batch) |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    rows = [
        ("bare FastAPI upload", shipped["bare"], None),
        ("fashion-mnist service", shipped["service"], shipped["raw"]),
    ]
    if resnet is not None:
        rows.append(("resnet50 p=2048 service", resnet["service"], resnet["raw"]))
    for name, r, raw in rows:
        cells = [
            f"{r['split'][k]:.1f}" if "split" in r else "-"
            for k in ("decode_ms", "queue_ms", "inference_ms", "response_ms")
        ]
        raw_cell = f"{raw['images_per_second']:.1f} ({raw['best_batch']})" if raw else "-"
        print(
            f"| {name} | {r['requests_per_second']:.1f} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} "
            f"| {r['p99_ms']:.1f} | {' | '.join(cells)} | {raw_cell} |"
        )
    print()
    by_round = ", ".join(f"{x:.2f}" for x in shipped["ratio_by_round"])
    print(
        f"shipped model: service req/s / bare endpoint req/s = {shipped['ratio']:.2f} "
        f"(median of rounds: {by_round}; target >= 0.5)"
    )
    if resnet is not None:
        by_round = ", ".join(f"{x:.2f}" for x in resnet["ratio_by_round"])
        print(
            f"resnet50 p=2048: service img/s / raw session img/s = {resnet['ratio']:.2f} "
            f"(median of rounds: {by_round}; target >= 0.85)"
        )
    print()
    print(
        "Open Inference Protocol over REST and gRPC, shipped model, same JPEGs (interleaved "
        "rounds):"
    )
    print()
    print("| route | req/s | p50 ms | p95 ms | p99 ms | req/s by round |")
    print("|---|--:|--:|--:|--:|---|")
    for route, r in shipped["service"]["protocols"].items():
        rounds = ", ".join(f"{x:.0f}" for x in r["rounds_rps"])
        print(
            f"| {route} | {r['requests_per_second']:.1f} | {r['p50_ms']:.1f} | "
            f"{r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {rounds} |"
        )
    grpc = grpc_over_rest(shipped["service"]["protocols"])
    by_round = ", ".join(f"{x:.2f}" for x in grpc["by_round"])
    print(
        f"\ngRPC / REST, preprocessed FP32 tensors: {grpc['ratio']:.2f} (median of rounds: "
        f"{by_round}; target >= 1)"
    )
    print()
    memory = shipped["service"]["memory_mib"]
    print(
        f"server resident memory with the shipped model: {memory['VmRSS']:.0f} MiB "
        f"(peak {memory['VmHWM']:.0f} MiB)"
    )


def grpc_over_rest(protocols: dict[str, Any]) -> dict[str, Any]:
    """gRPC's requests/s over REST's for the same preprocessed tensors, per round and median."""
    grpc = protocols["gRPC ModelInfer, preprocessed FP32"]["rounds_rps"]
    rest = protocols["/v2 infer, preprocessed binary FP32"]["rounds_rps"]
    ratios = [g / r for g, r in zip(grpc, rest, strict=True)]
    return {"by_round": ratios, "ratio": statistics.median(ratios)}


def print_standin(results: dict[str, Any]) -> None:
    print()
    print(
        "GPU-like stand-in backend (1.3 ms + 0.19 ms per image; ResNet-50's card at 224 px), "
        "against a bare endpoint reading the same requests (interleaved rounds):"
    )
    print()
    print(
        "| route | service req/s | bare req/s | ratio (rounds) | service p50 / p99 ms | "
        "1 client: service p50 ms | bare p50 ms | decode ms | backend ms | overhead ms |"
    )
    print("|---|--:|--:|---|--:|--:|--:|--:|--:|--:|")
    for name, r in results.items():
        rounds = ", ".join(f"{x:.2f}" for x in r["ratio_by_round"])
        one = r["one_client"]
        print(
            f"| {name} | {r['service']['requests_per_second']:.1f} | "
            f"{r['bare']['requests_per_second']:.1f} | {r['ratio']:.2f} ({rounds}) | "
            f"{r['service']['p50_ms']:.1f} / {r['service']['p99_ms']:.1f} | "
            f"{one['service_p50_ms']:.2f} | {one['bare_p50_ms']:.2f} | {one['decode_ms']:.2f} | "
            f"{one['inference_ms']:.2f} | {one['overhead_ms']:.2f} |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    files = jpegs(32)
    shipped = shipped_case(args, files)
    stand_in = standin_case(args, files)
    resnet = None if args.quick else resnet_case(args, files)
    print_tables(shipped, resnet)
    print_standin(stand_in)
    report: dict[str, Any] = {
        "settings": vars(args) | {"json": str(args.json)},
        "bare": shipped["bare"],
        "cases": [
            {"service": c["service"], "raw": c["raw"], "ratio_by_round": c["ratio_by_round"]}
            for c in (shipped, resnet)
            if c is not None
        ],
        "standin": stand_in,
        "ratios": {
            "shipped_rps_over_bare": shipped["ratio"],
            "grpc_over_rest_fp32": grpc_over_rest(shipped["service"]["protocols"])["ratio"],
        }
        | {f"standin {name}: service over bare": r["ratio"] for name, r in stand_in.items()}
        | ({"resnet_service_over_raw": resnet["ratio"]} if resnet else {}),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"Results written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
