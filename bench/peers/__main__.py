"""``smso-serve`` against LitServe, BentoML, PyTriton and Ray Serve: requests/s ratios, latency.

For each row (model), and for each peer setup in turn (each peer as its documentation
recommends, and with 2 workers), that setup and ``smso-serve`` (its defaults, and the flags of
each ``--ours``) are started alone (``--together``: every server at once), sent the
same test images one at a time (every one must answer the same best class as ``smso-serve``
before anything is timed), then driven in interleaved rounds (each server with the others
paused: SIGSTOP to all their processes; ``--no-pause`` leaves them) by 1 and by 16 concurrent
clients uploading 640x480 JPEGs, ``/classify``-style (a multipart ``file``; PyTriton: the
Open Inference Protocol's binary ``BYTES``, what Triton takes). Printed: our requests/s over
each peer setup's (median of the rounds) and every server's requests/s and p50 latency.

Rows: ``shipped`` (the Fashion-MNIST model this repository ships: overhead-bound),
``resnet18`` (ResNet-18 SMSO p = 2,048 at 224 px, random weights, exported once into
``--models``: compute-bound), ``standin`` (a GPU-like backend, 1.3 ms + 0.03 ms per image, with
ResNet's card at 224 px: the serving path alone).

    make bench-peers                               # the peers' environment, then all of it
    python -m bench.peers --quick                  # a smoke test: few requests, one round
    python -m bench.peers --rows shipped --peers litserve --workers 1

The peers run in ``.venv-peers`` (``--peers-python``); servers' logs go beside the JSON.
Where a CUDA device is present every server takes it (``smso-serve``'s ``providers=auto``;
the peers' sessions on onnxruntime's CUDA provider, BentoML and Ray Serve given the GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.lib import RESULTS, SHIPPED, launch, report, wrk
from bench.lib.load import Send, drive
from bench.lib.payloads import jpegs
from bench.peers import compare, setups
from bench.peers.setups import PEERS, Row, Setup
from service.runtime.providers import has_nvidia_gpu

ROWS = ("shipped", "resnet18", "standin")
TITLES = {
    "shipped": "shipped Fashion-MNIST model",
    "resnet18": "ResNet-18 SMSO p = 2,048, 224 px",
    "standin": "GPU-like stand-in (1.3 ms + 0.03 ms per image)",
}
RESNET18 = "resnet18-smso-p2048-224"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument(
        "--peers", nargs="*", choices=list(PEERS), default=list(PEERS), help="none: ours alone"
    )
    parser.add_argument(
        "--workers", nargs="+", type=int, default=[1, 2], help="the peers' setups (1 and 2)"
    )
    parser.add_argument(
        "--ours",
        nargs="*",
        default=["--workers 1"],
        metavar="FLAGS",
        help="more smso-serve setups, each its flags in one string (default: '--workers 1'; "
        "'--workers 2 --decode-threads 2')",
    )
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 16])
    parser.add_argument(
        "--together",
        action="store_true",
        help="every server up at once, driven in turn (default: each peer setup beside "
        "smso-serve alone, pair by pair)",
    )
    parser.add_argument(
        "--no-pause",
        action="store_true",
        help="leave the other servers running while one is driven (default: SIGSTOP to "
        "all their processes, so that their idle work does not take the cores)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--driver",
        choices=("wrk", "httpx"),
        default="wrk" if wrk.available() else "httpx",
        help="what sends the load: wrk (a C load generator, one thread; the default where it "
        "is installed) or httpx threads of this process",
    )
    parser.add_argument(
        "--seconds", type=int, default=4, help="wrk: seconds per load (1 client: half, >= 2)"
    )
    parser.add_argument(
        "--requests", type=int, default=800, help="httpx: per load of many clients (1: 1/8)"
    )
    parser.add_argument("--resnet-requests", type=int, default=160, help="the same, ResNet-18")
    parser.add_argument("--parity-images", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="few requests, one round")
    parser.add_argument("--peers-python", type=Path, default=setups.PEERS_PYTHON)
    parser.add_argument("--models", type=Path, default=RESULTS / "peers-models")
    parser.add_argument("--json", type=Path, default=RESULTS / "peers.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.requests, args.resnet_requests, args.seconds = 1, 32, 16, 2
        args.parity_images = min(args.parity_images, 8)
    return args


def requests_per_load(args: argparse.Namespace, row: str) -> dict[int, int]:
    """Requests in one load, by number of clients: a load of one client has an eighth."""
    many = args.resnet_requests if row == "resnet18" else args.requests
    return {n: max(many // 8, 4) if n == 1 else max(many, n) for n in args.clients}


def seconds_per_load(args: argparse.Namespace) -> dict[int, int]:
    """wrk's seconds in one load, by number of clients: a load of one client has half."""
    return {n: max(args.seconds // 2, 2) if n == 1 else args.seconds for n in args.clients}


def loads_for(
    args: argparse.Namespace,
    row: str,
    sends: dict[str, Send],
    targets: dict[str, setups.Target],
) -> dict[int, dict[str, compare.Load]]:
    """Each server's load at each number of clients, from ``--driver``."""
    if args.driver == "httpx":
        return compare.python_loads(sends, requests_per_load(args, row))
    return {
        n: {
            label: functools.partial(wrk.load, found.url, found.bodies, n, seconds)
            for label, found in targets.items()
        }
        for n, seconds in seconds_per_load(args).items()
    }


def model_for(row: str, folder: Path) -> Path | None:
    """The row's model file (ResNet-18 exported into ``folder`` the first time); None for the
    stand-in."""
    if row == "shipped":
        return SHIPPED
    if row == "standin":
        return None
    path = folder / f"{RESNET18}.onnx"
    if not path.exists():
        from bench.lib.resnet import resnet_model

        print(f"exporting ResNet-18 SMSO p = 2,048 to {path} (once)", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        resnet_model(folder, RESNET18, "image_folder", 1000, backbone="resnet18")
    return path


def run_row(row: Row, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """Start every setup on ``row``'s model, check parity, time them: the row's results."""
    failed: dict[str, str] = {}
    sends: dict[str, Send] = {}
    targets: dict[str, setups.Target] = {}
    readers: dict[str, compare.Reader] = {}
    started: dict[str, float] = {}
    servers: dict[str, launch.Server] = {}
    with contextlib.ExitStack() as stack:
        for setup in setups.setups(args.peers, args.workers, args.ours):
            path = logs / f"{row.name}-{setup.slug}.log"
            print(f"[{row.name}] starting {setup.label}", flush=True)
            try:
                server = stack.enter_context(setups.start(setup, row, args.peers_python, path))
            except (RuntimeError, TimeoutError, OSError) as error:
                if setup.ours:
                    raise
                failed[setup.label] = f"{error} (log: {path})"
                print(f"[{row.name}] {setup.label} did not start: {failed[setup.label]}")
                continue
            started[setup.label] = server.ready_s
            servers[setup.label] = server
            targets[setup.label] = setups.target(setup, server.base, row.files)
            sends[setup.label] = setups.sender(setup, server.base, row.files)
            readers[setup.label] = functools.partial(setups.top1, setup)
        answers = {
            label: compare.top1_answers(send, readers[label], args.parity_images)
            for label, send in sends.items()
        }
        parity = compare.check_parity(answers)
        print(f"[{row.name}] parity: {len(sends)} servers, {parity['images']} images", flush=True)
        for send in sends.values():  # warm-up: first batches, connections, lazy imports
            drive(send, max(args.clients), 2 * max(args.clients))
        paused = None if args.no_pause else servers
        loads = compare.measure(loads_for(args, row.name, sends, targets), args.rounds, paused)
    ours = [label for label in sends if label.startswith("smso-serve")]
    theirs = [label for label in sends if label not in ours]
    return {
        "title": row.title,
        "model": str(row.model) if row.model else "stand-in",
        "not_started": failed,
        "ready_s": started,
        "parity": parity,
        "loads": {n: compare.summarise(by_server) for n, by_server in loads.items()},
        "ratios": {n: compare.ratios_over(loads[n], ours, theirs) for n in loads},
    }


def run_pairs(row: Row, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """Each peer setup beside ``smso-serve``'s setups alone (:func:`run_row` on each pair): on
    2 cores the servers not being driven still take CPU (Ray's cluster, the peers' idle
    workers), which with every server up at once halved everyone's figures. ``smso-serve`` is
    started again for each pair; its figures are shown per pair."""
    merged: dict[str, Any] = {
        "title": row.title,
        "model": str(row.model) if row.model else "stand-in",
        "not_started": {},
        "ready_s": {},
        "parity": {},
        "loads": {},
        "ratios": {},
        "pairs": {},
    }
    for peer in args.peers:
        for n in args.workers:
            pair = argparse.Namespace(**(vars(args) | {"peers": [peer], "workers": [n]}))
            label = Setup(peer, n).label
            print(f"[{row.name}] pair: {label}", flush=True)
            try:
                result = run_row(row, pair, logs)
            except compare.ParityError as error:
                merged["not_started"][label] = f"parity: {error}"
                continue
            merged["pairs"][label] = result
            merged["not_started"] |= result["not_started"]
            # every pair checks the same images against smso-serve's answers: the first's
            # check stands for the row (each pair's is in its own result)
            merged["parity"] = merged["parity"] or result["parity"]
            for clients_n, by_server in result["loads"].items():
                loads = merged["loads"].setdefault(clients_n, {})
                for server, summary in by_server.items():
                    shown = server if server == label else f"{server} (beside {label})"
                    loads[shown] = summary
            for clients_n, by_ours in result["ratios"].items():
                ratios = merged["ratios"].setdefault(clients_n, {})
                for ours, cells in by_ours.items():
                    ratios.setdefault(ours, {}).update(cells)
    return merged


def clients(n: int) -> str:
    return f"{n} client{'s' * (n > 1)}"


def print_row(result: dict[str, Any]) -> None:
    print(f"\n## {result['title']}\n")
    lines = {
        f"{clients(n)}: {ours}": cells
        for n, by_ours in result["ratios"].items()
        for ours, cells in by_ours.items()
        if cells
    }
    if lines:
        print(compare.ratio_table(lines) + "\n")
    print(compare.latency_table(result["loads"]))
    for label, why in result["not_started"].items():
        print(f"\n{label} did not start: {why}")


def record(args: argparse.Namespace) -> dict[str, Any]:
    """The settings, the machine and the versions of both environments."""
    peers = setups.versions(args.peers_python, setups.PEER_PACKAGES) if args.peers else {}
    chosen = setups.setups(args.peers, args.workers, args.ours)
    return {
        "settings": vars(args),
        "machine": report.machine(gpu=has_nvidia_gpu()),
        "versions": {
            "service": setups.versions(sys.executable, setups.OUR_PACKAGES),
            "peers": peers,
        },
        "setups": {setup.label: setup.settings() for setup in chosen},
        "standin": {
            "latency_ms": setups.STANDIN_LATENCY_MS,
            "per_image_ms": setups.STANDIN_PER_IMAGE_MS,
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.peers and not args.peers_python.exists():
        print(
            f"bench.peers: no peers' interpreter at {args.peers_python}: `make bench-peers` "
            "creates .venv-peers (or give --peers-python)",
            file=sys.stderr,
        )
        return 2
    logs = args.json.parent / "peers-logs"
    logs.mkdir(parents=True, exist_ok=True)
    files = jpegs(32)
    payload = record(args) | {"rows": {}}
    status = 0
    for name in args.rows:
        row = Row(name, TITLES[name], model_for(name, args.models), files)
        try:
            alone = args.together or not args.peers  # no peers: our setups side by side
            result = run_row(row, args, logs) if alone else run_pairs(row, args, logs)
        except compare.ParityError as error:
            print(f"\n## {row.title}\n\n{error}", file=sys.stderr)
            payload["rows"][name] = {"title": row.title, "parity_error": str(error)}
            status = 1
            continue
        payload["rows"][name] = result
        print_row(result)
        report.save(args.json, payload)  # row by row: a later row's failure keeps this one
    report.save(args.json, payload)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
