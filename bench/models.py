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
  (2, 3, ...) is written beside the repository and renamed into ``<name>/<v>/model.onnx`` (as
  docs/model-repository.md says), and ``/models/{name}/metadata`` is polled every 5 ms until it
  names version v: the seconds from the rename, with the poll interval reported beside them
  (the scan's wait is uniform in [0, poll], so the rest is load and warm-up). Failed requests
  of the client during the swaps (any status but 200, or no answer) are counted: the target
  is 0.

    python -m bench.models            # about 1.5 minutes on 2 cores
    python -m bench.models --smoke    # seconds: small counts, for CI
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import random
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from bench.lib import RESULTS, SHIPPED, launch, report
from bench.lib.load import ClientProcesses, StdlibClient, merge, ratios, rps, without_latencies
from bench.lib.payloads import Body, multipart_body, pngs

TARGET_RATIO = 0.90
#: server log lines that are expected, not problems
BENIGN = ("no API key set",)


def _loop(url: str, bodies: Sequence[Body], stop: Any, pipe: Connection) -> None:
    """A client process posting to ``url`` without pause until ``stop`` is set; says when its
    first answer came, then sends back the answers by status (or error name) and the versions
    that answered."""
    client = StdlibClient(60)
    outcomes: Counter[str] = Counter()
    versions: Counter[str] = Counter()
    for i in itertools.count():
        if stop.is_set():
            break
        answer = client.post(url, bodies[i % len(bodies)])
        outcomes[answer.error or str(answer.status_code)] += 1
        if answer.status_code == 200:
            versions[json.loads(answer.content)["model"]["version"]] += 1
        if i == 0:
            pipe.send("answered")
    client.close()
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
    """``smso-serve --model-repository root`` (``server``), its output in ``log``; started when
    constructed (once ``/healthz`` answers), stopped by ``stop``."""

    def __init__(self, root: Path, poll_s: float, log: Path) -> None:
        repository = ("--model-repository", str(root), "--repository-poll-s", str(poll_s))
        # one process: its memory is the server's
        self.server = launch.smso_serve(*repository, "--workers", "1", ready="/healthz", log=log)
        self.base = self.server.base
        self.http = httpx.Client(base_url=self.base, timeout=30)

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
        return self.server.rss_mib()["VmRSS"]

    def stop(self) -> None:
        self.http.close()
        self.server.stop()


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


def throughput(args: argparse.Namespace, clients: ClientProcesses, workdir: Path) -> dict[str, Any]:
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

        def load(case: str, requests: int) -> dict[str, Any]:
            return clients.load(
                servers[case].base, paths(cases[case]), "png", args.clients, requests
            )

        for case in cases:  # warm-up: connections, allocator, thread pools
            load(case, args.requests // 2)
        runs: dict[str, list[dict[str, Any]]] = {"1": [], "3": []}
        order = []
        for r in range(args.rounds):
            for case in ("1", "3") if r % 2 == 0 else ("3", "1"):
                runs[case].append(load(case, args.requests))
                order.append(case)
        rss = {case: server.rss_mib() for case, server in servers.items()}
        providers = servers["1"].http.get("/models/m0/metadata").json()["providers"]
    finally:
        for server in servers.values():
            server.stop()
    return {
        "clients": args.clients,
        "requests_per_round": args.requests,
        "order": order,
        "one_model": merge_rounds(runs["1"]),
        "three_models": merge_rounds(runs["3"]),
        **ratios(rps(runs["3"]), rps(runs["1"])),
        "target_ratio": TARGET_RATIO,
        "providers": providers,
        "server_rss_mib": {
            "one_model": rss["1"],
            "three_models": rss["3"],
            "per_extra_model": (rss["3"] - rss["1"]) / 2,
        },
    }


def merge_rounds(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one load as one (:func:`bench.lib.load.merge`), and each round's figures."""
    return merge(rounds) | {"rounds": [without_latencies(r) for r in rounds]}


def memory(args: argparse.Namespace, clients: ClientProcesses, workdir: Path) -> dict[str, Any]:
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
            clients.load(server.base, paths(names), "png", args.clients, args.memory_requests)
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


def swaps(args: argparse.Namespace, bodies: list[Body], workdir: Path) -> dict[str, Any]:
    """New versions renamed into place under load: seconds until each takes traffic, and the
    failed requests of a client that never pauses."""
    root = workdir / "repo-swap"
    root.mkdir()
    add_version(root, "m", 1)
    server = Server(root, args.poll_s, workdir / "server-swap.log")
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    parent, child = context.Pipe()
    url = f"{server.base}/models/m/classify"
    loop = context.Process(target=_loop, args=(url, bodies, stop, child), daemon=True)
    rng = random.Random(0)
    seconds, rss, glitches = [], [], 0
    try:
        server.wait_models(["m"])
        loop.start()
        if not parent.poll(120) or parent.recv() != "answered":  # the process has started
            raise RuntimeError("the client process did not start within 120 s")
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
    import numpy as np
    import onnxruntime

    return report.machine(onnxruntime=onnxruntime.__version__, numpy=np.__version__)


def print_report(result: dict[str, Any]) -> None:
    ms, ratio, table = report.format_ms, report.format_ratio, report.markdown_table
    t = result["throughput"]
    print(
        f"\n### Throughput: 1 and 3 models, {t['clients']} client processes, "
        f"{t['requests_per_round']} requests per round\n"
    )
    rows = [
        [
            label,
            f"{r['requests_per_second']:.1f}",
            ms(r["p50_ms"]),
            ms(r["p99_ms"]),
            str(r["failures"]),
            ", ".join(f"{x:.0f}" for x in r["rounds_rps"]),
        ]
        for label, r in (("1 model", t["one_model"]), ("3 models", t["three_models"]))
    ]
    print(table(["models loaded", "req/s", "p50 ms", "p99 ms", "failed", "req/s by round"], rows))
    by_round = ", ".join(ratio(x) for x in t["ratio_by_round"])
    print(
        f"\n3 models / 1 model, req/s: {ratio(t['ratio'])} (median; rounds: {by_round}; "
        f"target >= {ratio(t['target_ratio'])})"
    )

    m = result["memory"]
    print("\n### Resident memory (VmRSS) after warm-up\n")
    rows = [
        [str(k), f"{rss:.1f}", "-" if k == 0 else f"{m['increase_mib_by_step'][k - 1]:.1f}"]
        for k, rss in enumerate(m["rss_mib_by_models"])
    ]
    print(table(["models", "RSS MiB", "increase MiB"], rows))
    extra = t["server_rss_mib"]
    print(
        f"\nper model (models 2 and 3): {m['per_model_mib']:.1f} MiB; throughput servers: "
        f"{extra['one_model']:.1f} MiB with 1, {extra['three_models']:.1f} MiB with 3 "
        f"({extra['per_extra_model']:.1f} MiB per extra model)"
    )

    s = result["swap"]
    print(f"\n### New version to traffic (--repository-poll-s {s['poll_s']}, {s['swaps']} swaps)\n")
    seconds = [f"{s[k]:.3f}" for k in ("median_s", "min_s", "max_s")]
    rows = [
        [f"{s['poll_s']:.2f}", *seconds, str(s["client"]["requests"]), str(s["client"]["failed"])]
    ]
    header = ["poll s", "median s", "min s", "max s", "client requests", "failed (target 0)"]
    print(table(header, rows))
    print(
        f"\nper swap: {', '.join(f'{x:.3f}' for x in s['seconds'])} s; answers by version: "
        f"{s['client']['versions']}"
    )
    logs = result["server_log"]
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
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "models.json", help="the JSON results file"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.clients, args.requests, args.rounds = 2, 24, 2
        args.memory_requests, args.poll_s, args.swaps = 12, 0.2, 2
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    bodies = [multipart_body(data, f"{i}.png", "image/png") for i, data in enumerate(pngs(32))]
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-models-") as tmp:
        workdir = Path(tmp)
        with ClientProcesses(args.clients, {"png": bodies}) as clients:
            results = {
                "throughput": throughput(args, clients, workdir),
                "memory": memory(args, clients, workdir),
            }
        results["swap"] = swaps(args, bodies, workdir)
        results["server_log"] = log_problems(sorted(workdir.glob("server-*.log")))
    result = {
        "machine": machine(),
        "settings": vars(args),
        "images": "Fashion-MNIST test images, 28x28 grey PNG, one per multipart request",
        "load_average_before_after": [load_before, os.getloadavg()[0]],
        **results,
    }
    print_report(result)
    print()
    report.save(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
