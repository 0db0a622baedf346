"""Several models in one server: throughput with 1 and 3 models loaded at the same total load,
resident memory per model, and the time from a new version's file appearing to it taking traffic.

Each part runs the real server (``smso-serve --model-repository DIR`` in a subprocess on a free
loopback port, ``--log-level warning``, its output to a log file) on a repository in Triton's
layout, ``DIR/<name>/<version>/model.onnx``, made of copies of the shipped model. Clients are
processes (not threads: the GIL would make the client the bottleneck on a small machine), each
on a keep-alive connection (a fresh one per load), posting one 28x28 PNG (Fashion-MNIST test
images) per multipart request to ``/models/{name}/classify``.

* **throughput**: two servers, one with 1 model and one with 3, both up; ``--clients`` clients send
  ``--requests`` requests per round to one of them, spread evenly over its models (request i goes
  to model i mod N). Rounds alternate between the servers in ABBA order (1, 3, 3, 1, 1, 3, ...),
  ``--rounds`` each, after a warm-up round: requests/s, p50 and p99 latency per round, and the
  ratio 3 models / 1 model per pair of adjacent rounds; the median ratio is the result (target:
  >= 0.90, "3 models cost at most 10 % at the same total load"). The machine is shared and noisy:
  compare ratios within one run, not absolute numbers between runs.
* **memory**: one server started on an empty repository; models are added one at a time, and after
  each is READY every loaded model is sent the same warm-up load, then the server's ``VmRSS`` is
  read from ``/proc/<pid>/status``. Also the throughput servers' RSS after their identical loads.
* **version swap**: a server on one model with ``--repository-poll-s`` (``--poll-s``); while one
  client process sends requests to that model without pause, ``--swaps`` times a new version
  (2, 3, ...) is written beside the repository and renamed into ``<name>/<v>/model.onnx`` (as the
  README says), and ``/models/{name}/metadata`` is polled every 5 ms until it names version v: the
  seconds from the rename, with the poll interval reported beside them (the scan's wait is uniform
  in [0, poll], so the rest is load and warm-up). Failed requests of the client during the swaps
  (any status but 200, or no answer) are counted: the target is 0.

    python -m bench.models            # about 1.5 minutes on 2 cores
    python -m bench.models --smoke    # seconds: small counts, for CI
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import io
import itertools
import json
import multiprocessing
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from bench.serve import free_port, rss_mib, wait_ready

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "models" / "fashion-mnist-smso" / "model.onnx"
DEFAULT_JSON = ROOT / "bench" / "results" / "models.json"
FMNIST = Path("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")
HOST = "127.0.0.1"
BOUNDARY = "b3nchm0dels"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"
TARGET_RATIO = 0.90
#: server log lines that are expected, not problems
BENIGN = ("no API key set",)


# --- requests -------------------------------------------------------------------------------


def pngs(count: int) -> list[bytes]:
    """``count`` Fashion-MNIST test images (28x28 grey) as PNG; random ones without the dataset."""
    try:
        with gzip.open(FMNIST) as f:
            raw = f.read(16 + 28 * 28 * count)[16:]  # idx3: 16-byte header, then uint8 pixels
        images = np.frombuffer(raw, np.uint8).reshape(-1, 28, 28)
    except OSError:
        images = np.random.default_rng(0).integers(0, 256, (count, 28, 28), dtype=np.uint8)
    files = []
    for image in images:
        buf = io.BytesIO()
        Image.fromarray(image).save(buf, "PNG")
        files.append(buf.getvalue())
    return files


def multipart(data: bytes, filename: str) -> bytes:
    """One file in a ``multipart/form-data`` body, as the part named ``file``."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: image/png\r\n\r\n"
    )
    return head.encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def post(
    connections: dict[int, http.client.HTTPConnection], port: int, path: str, body: bytes
) -> tuple[int | None, bytes, str]:
    """POST ``body`` on the keep-alive connection to ``port``: ``(status, body, error)``;
    status ``None`` and the exception's name when no answer came (the connection is dropped)."""
    conn = connections.get(port)
    if conn is None:
        conn = connections[port] = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        conn.request("POST", path, body, {"Content-Type": CONTENT_TYPE})
        response = conn.getresponse()
        return response.status, response.read(), ""
    except (OSError, http.client.HTTPException) as error:
        conn.close()
        del connections[port]
        return None, b"", type(error).__name__


# --- client processes -----------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """For one client: requests ``first``, ``first + stride``, ... (``count`` of them); request
    i posts ``bodies[i % len(bodies)]`` to ``paths[i % len(paths)]``."""

    port: int
    paths: tuple[str, ...]
    bodies: tuple[bytes, ...]
    count: int
    first: int
    stride: int


def _client(pipe: Connection) -> None:
    """A client process: runs each job it receives and sends back ``(latencies in seconds,
    answers by status or error name, start, end)`` (``time.perf_counter`` is the system's
    monotonic clock, the same in every process), until it receives ``None``."""
    connections: dict[int, http.client.HTTPConnection] = {}
    while (job := pipe.recv()) is not None:
        # a fresh connection per job: one left idle while the other server's rounds run would
        # outlive the server's keep-alive timeout (uvicorn: 5 s), and http.client does not retry
        # a request on a connection the server has closed
        for conn in connections.values():
            conn.close()
        connections.clear()
        latencies, outcomes = [], Counter[str]()
        start = time.perf_counter()
        for j in range(job.count):
            i = job.first + j * job.stride
            sent = time.perf_counter()
            path, body = job.paths[i % len(job.paths)], job.bodies[i % len(job.bodies)]
            status, _, error = post(connections, job.port, path, body)
            latencies.append(time.perf_counter() - sent)
            outcomes[str(status) if status is not None else error] += 1
        pipe.send((latencies, outcomes, start, time.perf_counter()))
    for conn in connections.values():
        conn.close()


class Clients:
    """``count`` client processes, started once and given one job each per load."""

    def __init__(self, count: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes, self.processes = [], []
        for _ in range(count):
            parent, child = context.Pipe()
            process = context.Process(target=_client, args=(child,), daemon=True)
            process.start()
            self.pipes.append(parent)
            self.processes.append(process)

    def load(
        self, port: int, paths: Sequence[str], bodies: Sequence[bytes], requests: int
    ) -> dict[str, Any]:
        """``requests`` requests (rounded down to a multiple of the clients) spread evenly over
        ``paths``; requests/s over the whole load, latency percentiles."""
        stride = len(self.pipes)
        for k, pipe in enumerate(self.pipes):
            pipe.send(Job(port, tuple(paths), tuple(bodies), requests // stride, k, stride))
        results = [pipe.recv() for pipe in self.pipes]
        seconds = max(r[3] for r in results) - min(r[2] for r in results)
        outcomes = sum((r[1] for r in results), Counter[str]())
        return summarize([x for r in results for x in r[0]], outcomes, seconds)

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for process in self.processes:
            process.join(timeout=30)


def summarize(latencies: Sequence[float], outcomes: Counter[str], seconds: float) -> dict[str, Any]:
    """Requests/s and latency of a load; failed: any answer but 200, or none."""
    ms = 1e3 * np.asarray(latencies)
    return {
        "requests": len(ms),
        "failures": len(ms) - outcomes["200"],
        "outcomes": dict(outcomes),
        "seconds": seconds,
        "requests_per_second": len(ms) / seconds,
        "mean_ms": float(ms.mean()),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
    }


def _loop(port: int, path: str, bodies: Sequence[bytes], stop: Any, pipe: Connection) -> None:
    """A client process posting to ``path`` without pause until ``stop`` is set; sends back the
    answers by status (or error name) and the versions that answered."""
    connections: dict[int, http.client.HTTPConnection] = {}
    outcomes: Counter[str] = Counter()
    versions: Counter[str] = Counter()
    i = 0
    while not stop.is_set():
        status, body, error = post(connections, port, path, bodies[i % len(bodies)])
        outcomes[str(status) if status is not None else error] += 1
        if status == 200:
            versions[json.loads(body)["model"]["version"]] += 1
        i += 1
    for conn in connections.values():
        conn.close()
    pipe.send({"outcomes": dict(outcomes), "versions": dict(versions)})


# --- the repository and its server ----------------------------------------------------------


def add_version(root: Path, name: str, version: int) -> float:
    """Put a copy of the shipped model at ``root/name/version/model.onnx`` whole: written under
    ``root/.staging`` (a folder the scan skips, on the same file system), then renamed. Returns
    the ``time.perf_counter()`` of the rename."""
    staging = root / ".staging"
    staging.mkdir(exist_ok=True)
    written = staging / f"{name}-{version}.onnx"
    shutil.copyfile(SHIPPED, written)
    folder = root / name / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    os.replace(written, folder / "model.onnx")
    return time.perf_counter()


class Server:
    """``smso-serve --model-repository root`` in a subprocess on a free loopback port, its output
    in ``log``; started when constructed (once ``/healthz`` answers), SIGTERM on ``stop``."""

    def __init__(self, root: Path, poll_s: float, log: Path) -> None:
        self.port = free_port()
        self.base = f"http://{HOST}:{self.port}"
        self.log = log
        command = [
            sys.executable,
            "-m",
            "service.cli",
            "--model-repository",
            str(root),
            "--repository-poll-s",
            str(poll_s),
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            "--grpc-port",  # two servers at once: HTTP only (gRPC's default 8001 is one port)
            "0",
        ]
        with log.open("ab") as out:
            self.process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        self.http = httpx.Client(base_url=self.base, timeout=30)
        wait_ready(f"{self.base}/healthz", self.process)

    def wait_models(self, names: Sequence[str], timeout_s: float = 120) -> None:
        """Until each of ``names`` is READY in the repository index (raises if one is
        UNAVAILABLE)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = {m["name"]: m for m in self.http.post("/v2/repository/index").json()}
            for name in names:
                if states.get(name, {}).get("state") == "UNAVAILABLE":
                    raise RuntimeError(f"model {name} is unavailable: {states[name]['reason']}")
            if all(states.get(n, {}).get("state") == "READY" for n in names):
                return
            time.sleep(0.05)
        raise TimeoutError(f"models {list(names)} not READY within {timeout_s:.0f} s")

    def version(self, name: str) -> str | None:
        """The version ``/models/{name}/metadata`` names (``None`` unless it answers 200)."""
        response = self.http.get(f"/models/{name}/metadata")
        return response.json()["model"]["version"] if response.status_code == 200 else None

    def rss_mib(self) -> float:
        return rss_mib(self.process.pid)["VmRSS"]

    def stop(self) -> None:
        self.http.close()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)


def log_problems(logs: Sequence[Path]) -> dict[str, Any]:
    """The servers' log lines beyond the expected ones, and how many tracebacks."""
    lines = [
        line
        for log in logs
        for line in log.read_text(errors="replace").splitlines()
        if line.strip() and not any(b in line for b in BENIGN)
    ]
    return {
        "tracebacks": sum("Traceback" in line for line in lines),
        "lines": lines[:40],
        "line_count": len(lines),
    }


def paths(names: Sequence[str]) -> list[str]:
    return [f"/models/{name}/classify" for name in names]


# --- the three measurements ------------------------------------------------------------------


def throughput(
    args: argparse.Namespace, clients: Clients, bodies: list[bytes], workdir: Path
) -> dict[str, Any]:
    """1 model against 3 at the same total load, rounds in ABBA order."""
    cases = {"1": ["m0"], "3": ["m0", "m1", "m2"]}
    servers: dict[str, Server] = {}
    try:
        for case, names in cases.items():
            root = workdir / f"repo-{case}"
            root.mkdir()
            for name in names:
                add_version(root, name, 1)
            servers[case] = Server(root, 5.0, workdir / f"server-{case}.log")
            servers[case].wait_models(names)
        for case, names in cases.items():  # warm-up: connections, allocator, thread pools
            clients.load(servers[case].port, paths(names), bodies, args.requests // 2)
        runs: dict[str, list[dict[str, Any]]] = {"1": [], "3": []}
        order = []
        for r in range(args.rounds):
            for case in ("1", "3") if r % 2 == 0 else ("3", "1"):
                load = clients.load(servers[case].port, paths(cases[case]), bodies, args.requests)
                runs[case].append(load)
                order.append(case)
        rss = {case: server.rss_mib() for case, server in servers.items()}
        providers = servers["1"].http.get("/models/m0/metadata").json()["providers"]
    finally:
        for server in servers.values():
            server.stop()
    ratios = [
        three["requests_per_second"] / one["requests_per_second"]
        for one, three in zip(runs["1"], runs["3"], strict=True)
    ]
    return {
        "clients": len(clients.pipes),
        "requests_per_round": args.requests,
        "order": order,
        "one_model": merge_rounds(runs["1"]),
        "three_models": merge_rounds(runs["3"]),
        "ratio_by_round": ratios,
        "ratio": statistics.median(ratios),
        "target_ratio": TARGET_RATIO,
        "providers": providers,
        "server_rss_mib": {
            "one_model": rss["1"],
            "three_models": rss["3"],
            "per_extra_model": (rss["3"] - rss["1"]) / 2,
        },
    }


def merge_rounds(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one load as one: requests/s over their summed time, and each round's values."""
    requests, seconds = sum(r["requests"] for r in rounds), sum(r["seconds"] for r in rounds)
    return {
        "requests": requests,
        "failures": sum(r["failures"] for r in rounds),
        "outcomes": dict(sum((Counter(r["outcomes"]) for r in rounds), Counter[str]())),
        "seconds": seconds,
        "requests_per_second": requests / seconds,
        "p50_ms": statistics.median(r["p50_ms"] for r in rounds),
        "p99_ms": statistics.median(r["p99_ms"] for r in rounds),
        "rounds": list(rounds),
    }


def memory(
    args: argparse.Namespace, clients: Clients, bodies: list[bytes], workdir: Path
) -> dict[str, Any]:
    """The server's RSS with 0, 1, 2 and 3 models, each after the same warm-up load."""
    root = workdir / "repo-memory"
    root.mkdir()
    server = Server(root, args.poll_s, workdir / "server-memory.log")
    try:
        time.sleep(1.0)  # a first scan of the empty folder
        rss = [server.rss_mib()]
        names: list[str] = []
        for k in range(3):
            names.append(f"m{k}")
            add_version(root, names[-1], 1)
            server.wait_models(names)
            clients.load(server.port, paths(names), bodies, args.memory_requests)
            time.sleep(0.5)
            rss.append(server.rss_mib())
    finally:
        server.stop()
    steps = [after - before for before, after in itertools.pairwise(rss)]
    return {
        "requests_per_step": args.memory_requests,
        "rss_mib_by_models": rss,
        "increase_mib_by_step": steps,
        "per_model_mib": (rss[3] - rss[1]) / 2,
    }


def swaps(args: argparse.Namespace, bodies: list[bytes], workdir: Path) -> dict[str, Any]:
    """New versions renamed into place under load: seconds until each takes traffic, and the
    failed requests of a client that never pauses."""
    root = workdir / "repo-swap"
    root.mkdir()
    add_version(root, "m", 1)
    server = Server(root, args.poll_s, workdir / "server-swap.log")
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    parent, child = context.Pipe()
    loop = context.Process(
        target=_loop, args=(server.port, "/models/m/classify", bodies, stop, child), daemon=True
    )
    rng = random.Random(0)
    seconds, rss, glitches = [], [], 0
    try:
        server.wait_models(["m"])
        loop.start()
        time.sleep(1.0)
        for version in range(2, args.swaps + 2):
            time.sleep(args.poll_s * rng.uniform(0.5, 1.5))  # a different phase of the scan
            renamed = add_version(root, "m", version)
            while (seen := server.version("m")) != str(version):
                glitches += seen is None  # metadata should answer throughout
                time.sleep(0.005)
            seconds.append(time.perf_counter() - renamed)
            rss.append(server.rss_mib())
        time.sleep(1.0)
    finally:
        stop.set()
        result = parent.recv() if loop.pid is not None and parent.poll(90) else {}
        loop.join(timeout=30)
        server.stop()
    outcomes = result.get("outcomes", {})
    requests = sum(outcomes.values())
    return {
        "poll_s": args.poll_s,
        "swaps": args.swaps,
        "seconds": seconds,
        "median_s": statistics.median(seconds),
        "min_s": min(seconds),
        "max_s": max(seconds),
        "rss_mib_after_each_swap": rss,
        "metadata_not_200": glitches,
        "client": {
            "requests": requests,
            "failed": requests - outcomes.get("200", 0),
            "outcomes": outcomes,
            "versions": result.get("versions", {}),
        },
    }


# --- the report -----------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    # onnxruntime and benchlib (which imports torch) are imported where they are used, not
    # above: every client process is spawned, so imports this module, and needs neither
    import onnxruntime

    from bench.benchlib import cpu_model

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": cpu_model(),
        "cpu_count": os.cpu_count(),
        "onnxruntime": onnxruntime.__version__,
        "numpy": np.__version__,
    }


def print_report(report: dict[str, Any]) -> None:
    from bench.benchlib import format_ms, format_ratio, markdown_table

    t = report["throughput"]
    print(
        f"\n### Throughput: 1 and 3 models, {t['clients']} client processes, "
        f"{t['requests_per_round']} requests per round\n"
    )
    rows = []
    for label, key in (("1 model", "one_model"), ("3 models", "three_models")):
        r = t[key]
        per_round = ", ".join(f"{x['requests_per_second']:.0f}" for x in r["rounds"])
        rows.append(
            [
                label,
                f"{r['requests_per_second']:.1f}",
                format_ms(r["p50_ms"]),
                format_ms(r["p99_ms"]),
                str(r["failures"]),
                per_round,
            ]
        )
    print(
        markdown_table(
            ["models loaded", "req/s", "p50 ms", "p99 ms", "failed", "req/s by round"], rows
        )
    )
    by_round = ", ".join(format_ratio(x) for x in t["ratio_by_round"])
    print(
        f"\n3 models / 1 model, req/s: {format_ratio(t['ratio'])} (median; rounds: {by_round}; "
        f"target >= {format_ratio(t['target_ratio'])})"
    )

    m = report["memory"]
    print("\n### Resident memory (VmRSS) after warm-up\n")
    rows = [
        [str(k), f"{rss:.1f}", "-" if k == 0 else f"{m['increase_mib_by_step'][k - 1]:.1f}"]
        for k, rss in enumerate(m["rss_mib_by_models"])
    ]
    print(markdown_table(["models", "RSS MiB", "increase MiB"], rows))
    extra = t["server_rss_mib"]
    print(
        f"\nper model (models 2 and 3): {m['per_model_mib']:.1f} MiB; throughput servers: "
        f"{extra['one_model']:.1f} MiB with 1, {extra['three_models']:.1f} MiB with 3 "
        f"({extra['per_extra_model']:.1f} MiB per extra model)"
    )

    s = report["swap"]
    print(f"\n### New version to traffic (--repository-poll-s {s['poll_s']}, {s['swaps']} swaps)\n")
    rows = [
        [
            f"{s['poll_s']:.2f}",
            f"{s['median_s']:.3f}",
            f"{s['min_s']:.3f}",
            f"{s['max_s']:.3f}",
            str(s["client"]["requests"]),
            str(s["client"]["failed"]),
        ]
    ]
    print(
        markdown_table(
            ["poll s", "median s", "min s", "max s", "client requests", "failed (target 0)"], rows
        )
    )
    print(
        f"\nper swap: {', '.join(f'{x:.3f}' for x in s['seconds'])} s; answers by version: "
        f"{s['client']['versions']}"
    )
    logs = report["server_log"]
    print(f"\nserver logs: {logs['line_count']} unexpected lines, {logs['tracebacks']} tracebacks")
    for line in logs["lines"][:10]:
        print(f"    {line}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8, help="client processes")
    parser.add_argument("--requests", type=int, default=2400, help="requests per round")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of each case (ABBA)")
    parser.add_argument(
        "--memory-requests",
        type=int,
        default=480,
        help="warm-up requests after each model is added",
    )
    parser.add_argument("--poll-s", type=float, default=0.5, help="--repository-poll-s")
    parser.add_argument("--swaps", type=int, default=12, help="new versions renamed into place")
    parser.add_argument("--smoke", action="store_true", help="small counts: seconds, for CI")
    parser.add_argument("--out", type=Path, default=DEFAULT_JSON, help="the JSON results file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.clients, args.requests, args.rounds = 2, 24, 2
        args.memory_requests, args.poll_s, args.swaps = 12, 0.2, 2
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    bodies = [multipart(data, f"{i}.png") for i, data in enumerate(pngs(32))]
    load_before = os.getloadavg()[0]
    clients = Clients(args.clients)
    with tempfile.TemporaryDirectory(prefix="bench-models-") as tmp:
        workdir = Path(tmp)
        try:
            results = {
                "throughput": throughput(args, clients, bodies, workdir),
                "memory": memory(args, clients, bodies, workdir),
            }
        finally:
            clients.close()
        results["swap"] = swaps(args, bodies, workdir)
        results["server_log"] = log_problems(sorted(workdir.glob("server-*.log")))
    report = {
        "machine": machine(),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "images": "Fashion-MNIST test images, 28x28 grey PNG, one per multipart request",
        "load_average_before_after": [load_before, os.getloadavg()[0]],
        **results,
    }
    print_report(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nResults written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
