"""The service's HTTP front end: uvicorn (as ``smso-serve`` runs it) against Granian's ASGI
server (Rust, on hyper), the same app, model and workers, driven by ``wrk``.

For each row (the shipped model; ResNet-18 SMSO p = 2,048 at 224 px, exported once into
``--models``, shared with ``bench.peers``; the GPU-like stand-in, 1.3 ms + 0.03 ms per image),
both servers are started with ``--workers`` processes (default: ``smso-serve``'s ``auto``
here) and every worker's metrics combined (prometheus_client's multiprocess mode, as
``smso-serve`` runs its workers), then driven in interleaved rounds, each with the other
paused, by 1 and 16 connections uploading 640x480 JPEGs to ``/classify``. Printed: uvicorn's
requests/s over Granian's (median of the rounds), every server's requests/s, p50, p99 and
CPU ms per request (every process of it).

    python -m bench.front_end                        # bench/results/front_end.json
    python -m bench.front_end --rows shipped standin --seconds 2 --rounds 1
    python -m bench.front_end --limits               # broken requests: what each answers

Needs ``granian`` (``pip install granian``: not a dependency of the service) and ``wrk``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.lib import RESULTS, SHIPPED, http_probes, launch, report, wrk
from bench.lib.granian_app import STANDIN_ENV
from bench.lib.payloads import jpegs, multipart_body
from bench.peers import compare
from bench.peers.__main__ import ROWS, model_for, seconds_per_load
from bench.peers.setups import STANDIN_LATENCY_MS, STANDIN_PER_IMAGE_MS
from service.core.settings import Settings
from service.telemetry.metrics import MULTIPROC_ENV

FRONT_ENDS = ("uvicorn", "granian")


def uvicorn_server(
    model: Path | None, workers: int, log: Path, settings: dict[str, str] | None = None
) -> launch.Server:
    """``smso-serve`` (or ``bench.standin``, the same front end) with ``workers`` processes
    and ``settings`` (``SMSO_*``)."""
    flags = ("--workers", str(workers))
    if model is None:
        standin: tuple[str, ...] = ("--latency-ms", str(STANDIN_LATENCY_MS))
        standin += ("--per-image-ms", str(STANDIN_PER_IMAGE_MS))
        return launch.smso_serve(
            *standin, *flags, settings=settings, log=log, module="bench.standin"
        )
    return launch.smso_serve("--model-path", str(model), *flags, settings=settings, log=log)


def granian_server(
    model: Path | None,
    workers: int,
    log: Path,
    metrics: Path,
    settings: dict[str, str] | None = None,
) -> launch.Server:
    """The same app under ``granian --interface asgi`` with ``workers`` processes (HTTP/1,
    no websockets; the head bounded at 64 KiB, as the service bounds it; headers read within
    ``SMSO_HEADER_TIMEOUT_S``), their metrics combined in ``metrics``."""
    settings = {"SMSO_WORKERS": str(workers), MULTIPROC_ENV: str(metrics)} | (settings or {})
    header_ms = int(1000 * float(settings.get("SMSO_HEADER_TIMEOUT_S", 10)))
    if model is None:
        settings[STANDIN_ENV] = f"{STANDIN_LATENCY_MS},{STANDIN_PER_IMAGE_MS}"
    else:
        settings["SMSO_MODEL_PATH"] = str(model)
    command = [sys.executable, "-m", "granian", "--interface", "asgi", "--factory"]
    command += ["--workers", str(workers), "--http", "1", "--no-ws", "--log-level", "warning"]
    command += ["--http1-buffer-size", "65536", "--http1-header-read-timeout", str(header_ms)]
    command += ["--port", "{port}"]
    command += ["bench.lib.granian_app:create"]
    return launch.Server(command, "/readyz", launch.server_env(settings), log)


def same_answers(servers: dict[str, launch.Server], image: bytes) -> None:
    """Both front ends answer ``image`` (``/classify``) with the same results, or
    :class:`RuntimeError` says how they differ: the same app behind either."""
    answers = {}
    for name, server in servers.items():
        reply = httpx.post(f"{server.base}/classify", files={"file": ("0.jpg", image)})
        answers[name] = (reply.status_code, reply.json().get("results"))
    if len(set(map(repr, answers.values()))) != 1:
        raise RuntimeError(f"the front ends answered differently: {answers}")


def run_row(row: str, args: argparse.Namespace, files: list[bytes]) -> dict[str, Any]:
    """Both front ends on ``row``'s model, driven in interleaved rounds: the row's results."""
    model = model_for(row, args.models)
    bodies = [multipart_body(data, f"{i}.jpg") for i, data in enumerate(files)]
    logs = args.json.parent
    with contextlib.ExitStack() as stack:
        metrics = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="front-end-")))
        servers = {
            "uvicorn": stack.enter_context(
                uvicorn_server(model, args.workers, logs / f"front_end-{row}-uvicorn.log")
            ),
            "granian": stack.enter_context(
                granian_server(model, args.workers, logs / f"front_end-{row}-granian.log", metrics)
            ),
        }
        same_answers(servers, files[0])
        for server in servers.values():  # warm-up: first batches, connections
            wrk.load(f"{server.base}/classify", bodies, max(args.clients), 2)
        loads = {
            n: {
                name: functools.partial(wrk.load, f"{server.base}/classify", bodies, n, seconds)
                for name, server in servers.items()
            }
            for n, seconds in seconds_per_load(args).items()
        }
        measured = compare.measure(loads, args.rounds, servers)
    return {
        "model": str(model) if model else "stand-in",
        "loads": {n: compare.summarise(by_server) for n, by_server in measured.items()},
        "ratios": {n: compare.ratios_over(measured[n], ["uvicorn"], ["granian"]) for n in measured},
    }


#: The limits probed (docs/security.md): short deadlines, so that each probe ends soon.
PROBED = {"SMSO_HEADER_TIMEOUT_S": "2", "SMSO_REQUEST_TIMEOUT_S": "3"}


def probe_limits(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each front end on the shipped model (``PROBED``'s deadlines), sent each of
    :mod:`bench.lib.http_probes`' broken requests; last, a request on an idle keep-alive
    connection after SIGTERM (which stops it). What each answered."""
    probes = {
        "body stops arriving": http_probes.slow_body,
        "70 kB header": http_probes.large_head,
        "150 header fields": http_probes.many_headers,
        "head never ends": http_probes.unfinished_head,
    }
    found: dict[str, dict[str, Any]] = {}
    logs = args.json.parent
    for name in FRONT_ENDS:
        with contextlib.ExitStack() as stack:
            log = logs / f"front_end-limits-{name}.log"
            if name == "uvicorn":
                server = uvicorn_server(SHIPPED, args.workers, log, PROBED)
            else:
                metrics = stack.enter_context(tempfile.TemporaryDirectory(prefix="front-end-"))
                server = granian_server(SHIPPED, args.workers, log, Path(metrics), PROBED)
            stack.enter_context(server)
            results = {probe: run(server.base) for probe, run in probes.items()}
            results["request on an idle connection after SIGTERM"] = (
                http_probes.request_after_sigterm(server.base, server.pid)
            )
        found[name] = {probe: dataclasses.asdict(r) for probe, r in results.items()}
        print(f"[limits] {name}: " + "; ".join(f"{p}: {r}" for p, r in results.items()))
    return found


def limits_table(found: dict[str, dict[str, Any]]) -> str:
    """One line per probe, one column per front end: the status (or how it ended), its body's
    first bytes, after how long."""
    names = list(found)

    def cell(r: dict[str, Any]) -> str:
        said = f"{r['status']} {r['body'][:40]!r}" if r["status"] else r["ended"]
        return f"{said}, {r['seconds']:.1f} s"

    rows = [[probe, *(cell(found[n][probe]) for n in names)] for probe in found[names[0]]]
    return report.markdown_table(["probe", *names], rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument(
        "--workers",
        type=int,
        default=Settings().worker_processes(gpu=False),
        help="processes of each server (default: smso-serve's auto on this machine's CPU)",
    )
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4, help="per load (1 client: half)")
    parser.add_argument(
        "--limits",
        action="store_true",
        help="probe each front end with broken requests (docs/security.md's limits) instead",
    )
    parser.add_argument("--models", type=Path, default=RESULTS / "peers-models")
    parser.add_argument(
        "--json", type=Path, help="default: bench/results/front_end.json (--limits: _limits)"
    )
    args = parser.parse_args(argv)
    if args.json is None:
        args.json = RESULTS / ("front_end_limits.json" if args.limits else "front_end.json")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not wrk.available():
        print("bench.front_end needs wrk (make wrk)", file=sys.stderr)
        return 2
    try:
        import granian
    except ImportError:
        print("bench.front_end needs granian (pip install granian)", file=sys.stderr)
        return 2
    args.json.parent.mkdir(parents=True, exist_ok=True)
    versions = report.machine(granian=granian.__version__)
    if args.limits:
        found = probe_limits(args)
        print("\n" + limits_table(found))
        report.save(args.json, {"settings": PROBED, "machine": versions, "limits": found})
        return 0
    files = jpegs(32)
    rows: dict[str, Any] = {}
    for row in args.rows:
        print(f"[{row}] uvicorn and granian, {args.workers} workers each", flush=True)
        rows[row] = result = run_row(row, args, files)
        print(f"\n## {row}\n")
        lines = {
            f"{n} connection{'s' * (n > 1)}": cells["uvicorn"]
            for n, cells in result["ratios"].items()
        }
        print(compare.ratio_table(lines) + "\n")
        print(compare.latency_table(result["loads"]), flush=True)
        payload = {
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "machine": versions,
            "rows": rows,
        }
        report.save(args.json, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
