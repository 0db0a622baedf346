"""Training throughput of the Fashion-MNIST table's runs: one run on every core against several
one-thread runs side by side (``smso-experiment run --jobs``).

A step of the small CNN at batch 64 is too small to split well over threads, so several runs
at once, each on its own core, may train more steps per second in total than one run using
them all. For each row named (default: SMSO p = 64, the shipped model, and CBP-RM, the costliest
head), in interleaved rounds (this machine is shared and noisy):

* **one run, T threads**: one process training with ``torch.set_num_threads(T)``, T the cores;
* **J runs, 1 thread each**: J processes at once (J = the cores), their steps/s summed.

Steps are the table's own (the row's model, SGD with momentum, cross-entropy, batch 64 of
28 x 28 random images), timed for ``--seconds`` after a few untimed ones.

    python -m bench.train_jobs               # about two minutes on 2 cores
    python -m bench.train_jobs --rows all --alone   # every row's speed alone: ~7 minutes
    python -m bench.train_jobs --quick       # a smoke test

``--alone`` measures only the one run on every core: each head's training speed with nothing
else on the machine (the table's own images/s are each run's median epoch, slowed by whatever
shared the machine with it), in images per second (steps x 64).

Prints a markdown table and writes ``bench/results/train_jobs.json`` (``--json PATH``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.lib import RESULTS, report

BATCH = 64  # the table's batch size


def steps_per_second(row: str, threads: int, seconds: float, start_at: float) -> float:
    """Training steps per second of ``row``'s model with ``threads`` torch threads, timed from
    ``start_at`` (a ``time.time()``, so that side-by-side processes time the same window)."""
    import torch

    from training.experiments import TABLES, find_row
    from training.model import ModelConfig, build_model

    assert row in {r.name for r in TABLES["fmnist"]}
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    settings = dict(find_row("fmnist", row).settings)
    model = build_model(ModelConfig(num_classes=10, **settings), load_pretrained=False)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images, labels = torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(images).logits, labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()

    for _ in range(3):
        step()
    time.sleep(max(0.0, start_at - time.time()))
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        count += 1
    return count / (time.perf_counter() - start)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    context = multiprocessing.get_context("spawn")
    rows = []
    with concurrent.futures.ProcessPoolExecutor(cores, mp_context=context) as pool:
        for row in args.rows:
            one: list[float] = []
            side_by_side: list[float] = []
            for _ in range(args.rounds):
                start = time.time() + 5.0  # every process built and warmed up by then
                one.append(pool.submit(steps_per_second, row, cores, args.seconds, start).result())
                if args.alone:
                    continue
                start = time.time() + 5.0
                futures = [
                    pool.submit(steps_per_second, row, 1, args.seconds, start) for _ in range(cores)
                ]
                side_by_side.append(sum(f.result() for f in futures))
            result: dict[str, Any] = {
                "row": row,
                "one_run_steps_per_second": statistics.median(one),
                "one_run_images_per_second": BATCH * statistics.median(one),
                "rounds": {"one": one},
            }
            if not args.alone:
                ratios = [s / o for s, o in zip(side_by_side, one, strict=True)]
                result |= {
                    "side_by_side_steps_per_second": statistics.median(side_by_side),
                    "side_by_side_over_one": statistics.median(ratios),
                }
                result["rounds"]["side_by_side"] = side_by_side
            rows.append(result)
    return {"cores": cores, "seconds": args.seconds, "batch": BATCH, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", nargs="+", default=["smso-64", "cbp-rm"], help="rows of the table, or all"
    )
    parser.add_argument("--alone", action="store_true", help="only one run on every core")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one row, 1 s, one round")
    parser.add_argument("--json", type=Path, default=RESULTS / "train_jobs.json")
    args = parser.parse_args(argv)
    from training.experiments import TABLES

    names = [r.name for r in TABLES["fmnist"]]
    if args.rows == ["all"]:
        args.rows = names
    unknown = sorted(set(args.rows) - set(names))
    if unknown:
        parser.error(f"unknown rows {unknown}; rows: all, {', '.join(names)}")
    if args.quick:
        args.rows, args.seconds, args.rounds = args.rows[:1], 1.0, 1
    result = {"python": report.machine()["python"], **measure(args)}
    cores = result["cores"]
    print(f"Training steps per second, batch {BATCH}, {cores} cores:\n")
    header = ["row", f"one run, {cores} threads"]
    header += ["images/s"] if args.alone else [f"{cores} runs, 1 thread each", "ratio"]
    rows = []
    for row in result["rows"]:
        cells = [row["row"], f"{row['one_run_steps_per_second']:.2f}"]
        if args.alone:
            cells.append(f"{row['one_run_images_per_second']:,.0f}")
        else:
            cells.append(f"{row['side_by_side_steps_per_second']:.2f}")
            cells.append(report.format_ratio(row["side_by_side_over_one"]))
        rows.append(cells)
    print(report.markdown_table(header, rows), end="\n\n")
    report.save(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
