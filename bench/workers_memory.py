"""The memory price of ``smso-serve``'s worker processes: what N workers hold, for N in
``--workers`` (1, 2, 4), on the shipped model and on ResNet-18 SMSO p = 2,048 at 224 px.

Each server is started, sent ``--requests`` 640x480 JPEG uploads from 16 clients (so that every
worker has run batches and onnxruntime has grown its buffers), then measured: the proportional
set size (PSS, from ``/proc/PID/smaps_rollup``: shared pages split among the processes sharing
them, so the sum is what the server costs the machine) and the resident set size (RSS) of every
process in its group (the parent, the workers, the multiprocessing helper).

    python -m bench.workers_memory                    # both models, 1, 2 and 4 workers
    python -m bench.workers_memory --rows shipped --workers 1 2

Prints a table and writes ``bench/results/workers_memory.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.lib import RESULTS, launch, report
from bench.lib.load import drive, multipart
from bench.lib.payloads import jpegs
from bench.lib.procfs import group_memory_mib
from bench.peers.__main__ import model_for


def measure(model: Path, workers: int, requests: int) -> dict[str, Any]:
    """One server with ``workers`` processes: its group's PSS and RSS after a load."""
    with launch.smso_serve("--model-path", str(model), "--workers", str(workers)) as server:
        load = drive(multipart(f"{server.base}/classify", jpegs(32)), 16, requests)
        if load["failures"]:
            raise RuntimeError(f"the load failed: {load['outcomes']}")
        memory = group_memory_mib(os.getpgid(server.pid))
    return {"workers": workers} | memory


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", choices=["shipped", "resnet18"])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--requests", type=int, default=320)
    parser.add_argument("--out", type=Path, default=RESULTS / "workers_memory.json")
    args = parser.parse_args(argv)
    rows = args.rows or ["shipped", "resnet18"]
    # bench.peers' models: ResNet-18 exported there once (torch, only then)
    models = {row: model_for(row, RESULTS / "peers-models") for row in rows}
    found: dict[str, Any] = {"machine": report.machine(), "rows": {}}
    table = []
    for row in rows:
        model = models[row]
        assert model is not None  # not the stand-in
        results = [measure(model, n, args.requests) for n in args.workers]
        found["rows"][row] = results
        base = results[0]
        for result in results:
            extra = (result["pss_mib"] - base["pss_mib"]) / max(
                result["workers"] - base["workers"], 1
            )
            table.append(
                [
                    row,
                    str(result["workers"]),
                    str(result["processes"]),
                    f"{result['pss_mib']:,.0f}",
                    f"{result['rss_mib']:,.0f}",
                    "" if result is base else f"{extra:,.0f}",
                ]
            )
    header = ["model", "workers", "processes", "PSS MiB", "RSS MiB", "PSS per extra worker"]
    print(report.markdown_table(header, table))
    report.save(args.out, found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
