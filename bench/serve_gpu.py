"""The service on a GPU, measured in one go: where the time goes between the session and a client.

On a CUDA machine with onnxruntime-gpu (about 6 minutes on a 16-core H100 machine; with
``--budget-s``, stages that would overrun it are skipped and say so):

1. the machine: GPU, driver, CPU cores, versions;
2. ResNet-50 SMSO, p = 2,048, 1,000 classes, random weights, the ``image_folder`` preset (resize
   256, crop 224), exported in parallel: float32 with the 1x1-conv form, float32 with the
   covariance form, float16 with the 1x1-conv form, and both float32 forms at 448 px (the ``dtd``
   preset) (``export_checkpoint``, parity checked; ``--models-dir`` keeps and reuses them,
   ``--exports`` picks);
3. the raw session by batch size (1, 8, 32, 64, 128; at 448 px up to 64) for each export, the
   float32 1x1 form also through IO binding and with a CUDA graph per bucket
   (``service.runtime.runner``): images/s and ms per call, the same numpy input each call, no
   server (``--raw`` picks the runs);
4. onnxruntime's own profiler on the float32 session at batch 64: the time by operator type,
   with the host-device copies, per run (``--stages profile``);
5. the real server (``smso-serve`` in a subprocess, CUDA provider, max batch 64), time until
   ``/readyz``, then driven by client *processes* (one Python process tops out near 1-2k req/s)
   at 1, 16 and 64 concurrent requests, on ``/classify`` with 640x480 JPEGs and on ``/v2`` with
   binary FP32 tensors: req/s, p50/p95/p99, the server's stage split from ``/metrics``
   (decoding, queue, the inference thread's time and the batch's round trip), GPU utilisation
   read through NVML once a second (never ``nvidia-smi`` during a load: on some virtual machines
   it stalls CUDA); for each of ``--servers`` (``SERVER_VARIANTS``), by default: the default
   server, four workers with CUDA graphs on the float32 and on the float16 export (also: one
   worker with CUDA graphs, two batches in flight, four workers without graphs, with 3 decode
   threads each; eight and twelve workers, eight under CUDA MPS, eight with 2 decode threads
   each, four, eight and twelve workers handing their batches to one session host); the cores
   each load kept busy, the machine's and the server's (from ``/proc``);
6. a sampling profile of the first server under the 64-client ``/v2`` load (``py-spy``, where
   installed: a speedscope file and three dumps of every thread);
7. JPEG decoding on this machine's cores: threads against processes, 640x480 -> 224 px
   (``--stages decoding``).

A stage that fails is recorded with its error and the run goes on. Writes ``OUT/serve_gpu.json``
(with the end of each server's log), ``OUT/serve_gpu.md`` (the tables, also printed) and
py-spy's two files. ``--smoke`` runs every stage tiny, on the CPU, with the shipped model (what
the test suite checks). ``python -m bench.gpu`` runs it with the other GPU benchmarks.

    python -m bench.serve_gpu --out /tmp/gpu                  # on a CUDA machine
    python -m bench.serve_gpu --smoke --out /tmp/gpu-smoke    # anywhere, about a minute
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.lib import SHIPPED, launch, report
from bench.lib.decoding import Pools
from bench.lib.gpu import GpuSampler, gpu_info, mps
from bench.lib.load import CLIENTS, ClientProcesses, without_latencies
from bench.lib.metrics import scrape, split
from bench.lib.payloads import jpegs, multipart_body, tensor_bodies
from bench.lib.procfs import CpuMeter
from bench.lib.profiling import ort_profile, py_spy
from bench.lib.resnet import export_all
from bench.lib.session import MODES, open_backend, raw_session
from service.core.card import Preprocessing
from service.imaging.images import Preprocessor
from service.runtime.backend import read_card
from service.telemetry.stage_clock import STAGES

CUDA_PROVIDERS = "CUDAExecutionProvider,CPUExecutionProvider"

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
}


@contextlib.contextmanager
def stage(report: dict[str, Any], key: str) -> Iterator[None]:
    """Run one stage; an exception is recorded as ``report[key] = {"error": ...}`` and the run
    goes on (one failure does not cost the later stages their numbers)."""
    try:
        yield
    except Exception as error:  # any failure of one stage: recorded, printed, not fatal
        report[key] = {"error": f"{type(error).__name__}: {error}"}
        print(f"stage {key} failed: {report[key]['error']}", flush=True)


class Budget:
    """Seconds left of ``--budget-s`` (none: no limit); a stage that needs more than is left is
    skipped."""

    def __init__(self, seconds: float | None) -> None:
        self.end = time.monotonic() + (float("inf") if seconds is None else seconds)

    def allows(self, seconds: float) -> bool:
        return time.monotonic() + seconds <= self.end

    def left(self) -> float:
        return self.end - time.monotonic()


def machine() -> dict[str, Any]:
    """The CPU, onnxruntime and its providers, torch's version (not imported), the GPU."""
    import onnxruntime as ort

    info = report.machine(onnxruntime=ort.__version__, providers=ort.get_available_providers())
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        info["torch"] = importlib.metadata.version("torch")
    return info | gpu_info()


def models(workdir: Path, smoke: bool, only: list[str] | None = None) -> dict[str, Any]:
    """``name -> path`` of the exports (the shipped model alone with ``smoke``); an export
    already in ``workdir`` (``--models-dir``, from an earlier run) is used as it is. ``only``
    picks exports; ``fp32-conv`` is always among them."""
    if smoke:
        return {"paths": {"fp32-conv": str(SHIPPED)}, "export_s": {}}
    wanted = {n: spec for n, spec in EXPORTS.items() if not only or n in only or n == "fp32-conv"}
    return export_all(workdir, wanted)


# --- the server under load ------------------------------------------------------------------


def server_settings(variant: dict[str, str]) -> dict[str, str]:
    """A server's settings: the benchmark's, then the variant's (:data:`MPS` is not one)."""
    settings = {"SMSO_MAX_BATCH_SIZE": "64", "SMSO_QUEUE_SIZE": "1024"} | variant
    return {k: v for k, v in settings.items() if k != MPS}


def serve_loads(
    model: str,
    variant: str,
    settings: dict[str, str],
    clients: ClientProcesses,
    args: argparse.Namespace,
    out: Path,
    profile: bool,
    ready_timeout_s: float = 90,
) -> dict[str, Any]:
    """Every route at every concurrency against one server; a py-spy profile of the busiest.
    A failure part-way is recorded as ``error`` beside the loads already measured."""
    result: dict[str, Any] = {"env": settings, "loads": []}
    folder = Path(tempfile.mkdtemp(prefix="serve-gpu-log-"))
    log = folder / f"server-{variant}.log"
    env = server_settings(settings)
    try:
        with contextlib.ExitStack() as stack:
            if settings.get(MPS):
                env |= stack.enter_context(mps(folder / "mps"))
            server = stack.enter_context(
                launch.smso_serve(
                    "--model-path",
                    model,
                    settings=env,
                    log=log,
                    timeout_s=ready_timeout_s,
                    stop_s=20,
                )
            )
            result["ready_s"] = server.ready_s
            drive_server(server, result, clients, args, out, variant, profile)
    except Exception as error:  # one variant's failure: recorded with what it measured
        result["error"] = f"{type(error).__name__}: {error}"
    finally:  # the log's folder is temporary: its end goes into the report
        result["log_tail"] = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    return result


def drive_server(
    server: launch.Server,
    result: dict[str, Any],
    clients: ClientProcesses,
    args: argparse.Namespace,
    out: Path,
    variant: str,
    profile: bool,
) -> None:
    """The loads of :func:`serve_loads` against a running server; results into ``result``."""
    for _ in range(100):  # with several workers, /readyz may have been answered by one of them
        answer = httpx.get(f"{server.base}/metadata", timeout=10)
        if answer.status_code == 200:
            break
        time.sleep(0.2)
    name = answer.raise_for_status().json()["model"]["name"]
    routes = {
        "/classify JPEG": ("/classify", "jpeg"),
        "/v2 FP32": (f"/v2/models/{name}/infer", "fp32"),
    }
    for route, (path, kind) in routes.items():
        # warm connections
        clients.load(server.base, [path], kind, max(args.concurrency), seconds=args.seconds / 2)
        for concurrency in args.concurrency:
            before = scrape(f"{server.base}/metrics")
            with GpuSampler() as gpu, CpuMeter(server.pid) as cpu:
                load = clients.load(server.base, [path], kind, concurrency, seconds=args.seconds)
            load = without_latencies(load)
            after = scrape(f"{server.base}/metrics")
            if load["requests"]:
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
        path, kind = routes["/v2 FP32"]
        busy = (server.base, [path], kind, max(args.concurrency), None, args.seconds + 4)
        worker = threading.Thread(target=clients.load, args=busy)
        worker.start()
        time.sleep(2.0)
        result["py_spy"] = py_spy(server.pid, args.seconds, out, f"py-spy-{variant}")
        worker.join()


def decoding(
    files: list[bytes], preprocessing: Preprocessing, workers: list[int], seconds: float
) -> dict[str, Any]:
    """640x480 JPEG -> (3, 224, 224) float32 images/s with a thread pool and a process pool
    (the process pool's figure leaves out sending the arrays back)."""
    pre = Preprocessor(preprocessing, 10**9)
    rows = []
    for kind in ("threads", "processes"):
        for n in workers:
            name = f"{kind} x{n}"
            pools = Pools.start(pre, [name], files[: 2 * n])
            # at least 8 images per worker in each map (2 chunks of 4 for a process), so that
            # every worker stays busy until the map's last few images
            work = files * -(-8 * n // len(files))
            try:
                done, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds:
                    pools.run(
                        name, work, send_back=False, chunksize=4 if kind == "processes" else 1
                    )
                    done += len(work)
                rate = done / (time.perf_counter() - start)
            finally:
                pools.close()
            rows.append({"kind": kind, "workers": n, "images_per_second": rate})
    return {"rows": rows}


# --- the report ----------------------------------------------------------------------------


def stage_table(loads: list[dict[str, Any]], raw: dict[str, Any] | None) -> list[str]:
    """The inference thread's mean ms per batch by stage (``smso_inference_stage_seconds``),
    a row per load, and the raw session's median ``run`` by batch size with the same export
    and mode (``raw``, where measured): a server's ``run`` well above the raw one at its batch
    size is what the server adds to the onnxruntime call (waits for the GIL, a busy device)."""
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
    cells = []
    for load in rows:
        split_, stages = load["split"], load["split"]["stage_ms"]
        cells.append(
            [load["route"], str(load["concurrency"]), f"{split_['mean_batch']:.1f}"]
            + [f"{stages[name]:.2f}" if name in stages else "-" for name in STAGES]
        )
    title = "Inference thread, ms per batch by stage"
    title += f" (the raw session's `run` by batch size: {alone})" if alone else ""
    header = ["route", "clients", "mean batch", *STAGES]
    return [f"{title}:", "", report.markdown_table(header, cells), ""]


def load_row(load: dict[str, Any]) -> list[str]:
    """A load's row of a server's table."""
    if not load.get("requests"):
        return [load["route"], "-", f"no answers ({load.get('failures')} failed)", *["-"] * 11]
    s, gpu, cpu = load["split"], load.get("gpu"), load.get("cpu")
    return [
        load["route"],
        str(load["concurrency"]),
        f"{load['requests_per_second']:,.0f}",
        *(f"{load[k]:.1f}" for k in ("p50_ms", "p95_ms", "p99_ms")),
        *(f"{s[k]:.2f}" for k in ("decode_ms", "queue_ms", "inference_ms")),
        f"{s.get('round_trip_ms', 0.0):.2f}",
        f"{s['response_ms']:.2f}",
        f"{s['mean_batch']:.1f}",
        f"{gpu['gpu_util_mean']:.0f}" if gpu else "-",
        f"{cpu['machine_cores_busy']:.1f} ({cpu['server_cores']:.1f})" if cpu else "-",
    ]


LOAD_HEADER = ["route", "clients", "req/s", "p50 ms", "p95 ms", "p99 ms", "decode", "queue"]
LOAD_HEADER += ["inference", "round trip", "rest", "mean batch", "GPU util %"]
LOAD_HEADER += ["cores busy (server)"]


def markdown(result: dict[str, Any]) -> str:
    lines = [f"Machine: {json.dumps(result['machine'])}", ""]
    raw = {k: r for k, r in result.get("raw", {}).items() if "by_batch" in r}
    if raw:
        columns = sorted({int(b) for r in raw.values() for b in r["by_batch"]})
        rows = []
        for key, r in raw.items():
            by_batch = {int(b): v for b, v in r["by_batch"].items()}
            rows.append(
                [key.split("/")[0], r["mode"]]
                + [
                    f"{by_batch[b]['images_per_second']:,.0f} ({by_batch[b]['ms_p50']:.2f})"
                    if b in by_batch
                    else "-"
                    for b in columns
                ]
            )
        header = ["export", "mode", *(f"batch {b} img/s (ms)" for b in columns)]
        lines += [report.markdown_table(header, rows), ""]
    profile = result.get("ort_profile")
    if profile and "ms_per_run_by_op" in profile:
        rows = [[op, f"{ms:.3f}"] for op, ms in profile["ms_per_run_by_op"].items()]
        lines += [
            f"onnxruntime profile, batch {profile['batch']}: run "
            f"{profile['run_ms_median']:.2f} ms (median)",
            "",
            report.markdown_table(["operator (provider)", "ms per run"], rows),
            "",
        ]
    for variant, served in result.get("server", {}).items():
        if "loads" not in served:
            lines += [f"server {variant}: {served}", ""]
            continue
        ready = f"ready after {served['ready_s']:.1f} s" if "ready_s" in served else "not ready"
        error = f", then failed: {served['error']}" if "error" in served else ""
        table = report.markdown_table(LOAD_HEADER, [load_row(load) for load in served["loads"]])
        lines += [f"Server `{variant}` ({served['env'] or 'defaults'}), {ready}{error}:", ""]
        lines += [table, ""]
        export, env = SERVER_VARIANTS.get(variant, ("", {}))
        mode = "cuda-graphs" if env.get("SMSO_CUDA_GRAPHS") == "true" else "plain"
        lines += stage_table(served["loads"], raw.get(f"{export}/{mode}"))
    if result.get("decoding"):
        rows = [
            [r["kind"], str(r["workers"]), f"{r['images_per_second']:,.0f}"]
            for r in result["decoding"]["rows"]
        ]
        lines += [report.markdown_table(["JPEG decoding", "workers", "img/s"], rows), ""]
    if result.get("skipped"):
        lines.append(f"Skipped for the time budget: {', '.join(result['skipped'])}")
    return "\n".join(lines) + "\n"


# --- the run -------------------------------------------------------------------------------


def load_seconds(args: argparse.Namespace, profile: bool) -> float:
    """Seconds one server variant's loads take: per route a warm-up of half a load, then a
    load per concurrency (each starting a second after it is submitted); the profile's load."""
    per_route = args.seconds / 2 + 1 + len(args.concurrency) * (args.seconds + 1)
    return 2 * per_route + (args.seconds + 4 + 5 if profile else 0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument("--smoke", action="store_true", help="every stage, tiny, on the CPU")
    parser.add_argument(
        "--budget-s", type=float, default=None, help="skip stages past this (default: no limit)"
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="per load")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    parser.add_argument("--client-processes", type=int, default=8)
    parser.add_argument(
        "--client",
        choices=list(CLIENTS),
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
        default=["cuda", "workers-graphs", "workers-graphs-fp16"],
        choices=list(SERVER_VARIANTS),
        help="server variants to load (the first is profiled)",
    )
    args = parser.parse_args(argv)
    for item in args.raw or []:
        name, _, mode = item.partition("/")
        if name not in EXPORTS or mode not in MODES:
            parser.error(
                f"--raw {item}: expected EXPORT/MODE with EXPORT one of {', '.join(EXPORTS)} "
                f"and MODE one of {', '.join(MODES)}"
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


def raw_stage(
    result: dict[str, Any], paths: dict[str, str], args: argparse.Namespace, budget: Budget
) -> None:
    """Step 3: the raw session of each export and mode asked for."""
    plan = [(name, "plain") for name in paths] + [("fp32-conv", m) for m in MODES[1:]]
    if args.raw is not None:
        plan = [(item.split("/", 1)[0], item.split("/", 1)[1]) for item in args.raw]
    providers = "auto" if args.smoke else CUDA_PROVIDERS
    result["raw"] = {}
    for name, mode in plan:
        key = f"{name}/{mode}"
        if name not in paths:
            result["raw"][key] = {"error": f"{name} was not exported (--exports)"}
            continue
        if not budget.allows(60 + 200):
            result["skipped"].append(f"raw {name} {mode}")
            continue
        batches = [b for b in args.batches if b <= 64] if "448" in name else args.batches
        with stage(result["raw"], key):
            start = time.perf_counter()
            backend = open_backend(paths[name], mode, providers, max(batches))
            measured = raw_session(backend, batches, args.seconds / 5)
            result["raw"][key] = measured | {"load_and_measure_s": time.perf_counter() - start}
        print(f"raw {name} {mode}: {result['raw'][key]}", flush=True)


def server_stage(
    result: dict[str, Any],
    paths: dict[str, str],
    files: list[bytes],
    args: argparse.Namespace,
    budget: Budget,
    save: Any,
) -> None:
    """Steps 5 and 6: each server variant under load, the first one profiled."""
    card = read_card(paths["fp32-conv"])
    payloads = {"jpeg": [multipart_body(f) for f in files], "fp32": tensor_bodies(card, files)}
    providers = "auto" if args.smoke else CUDA_PROVIDERS
    result["server"] = {}
    with ClientProcesses(args.client_processes, payloads, args.client) as clients:
        for variant in args.servers:
            model, settings = SERVER_VARIANTS[variant]
            model = "fp32-conv" if args.smoke else model  # smoke: the shipped model only
            profiled = args.profile and variant == args.servers[0]
            loads = load_seconds(args, profiled)
            if not budget.allows(20 + loads + 45):  # ready, the loads, the stop
                result["skipped"].append(f"server {variant}")
                continue
            settings = {"SMSO_PROVIDERS": providers} | settings
            if "SMSO_WORKERS" in settings and args.smoke:
                settings["SMSO_WORKERS"] = "2"
            result["server"][variant] = serve_loads(
                paths[model],
                variant,
                settings,
                clients,
                args,
                args.out,
                profile=profiled,
                ready_timeout_s=min(90.0, budget.left() - loads - 45),
            )
            print(f"server {variant}: done", flush=True)
            save()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s)
    result: dict[str, Any] = {"settings": vars(args), "skipped": [], "machine": machine()}
    print(f"machine: {result['machine']}", flush=True)

    def save() -> None:
        report.write_json(out / "serve_gpu.json", result)
        (out / "serve_gpu.md").write_text(markdown(result))

    with tempfile.TemporaryDirectory(prefix="serve-gpu-") as tmp:
        workdir = args.models_dir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        exported = models(workdir, args.smoke, args.exports)
        result["export_s"], paths = exported["export_s"], exported["paths"]
        print(f"exported: {exported['export_s']}", flush=True)
        if args.export_only:
            return 0
        raw_stage(result, paths, args, budget)
        save()
        if "profile" in args.stages and not budget.allows(30):
            result["skipped"].append("profile")
        elif "profile" in args.stages:
            with stage(result, "ort_profile"):
                providers = "CPUExecutionProvider" if args.smoke else CUDA_PROVIDERS
                batch = 8 if args.smoke else 64
                result["ort_profile"] = ort_profile(
                    paths["fp32-conv"], providers, batch, 5, Path(tmp)
                )
        save()
        files = jpegs(32)
        server_stage(result, paths, files, args, budget, save)
        if "decoding" not in args.stages:
            pass
        elif budget.allows(30):
            cores = os.cpu_count() or 2
            workers = sorted({1, max(1, cores // 4), max(1, cores // 2), cores})
            preprocessing = read_card(paths["fp32-conv"]).preprocessing
            with stage(result, "decoding"):
                seconds = 0.5 if args.smoke else 2.0
                result["decoding"] = decoding(files, preprocessing, workers, seconds)
        else:
            result["skipped"].append("decoding")
    save()
    print(markdown(result))
    print(f"Results written to {out / 'serve_gpu.json'} and {out / 'serve_gpu.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
