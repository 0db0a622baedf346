"""smso-embed (``batch/``, Ray Data) against what else could embed a collection, and its faults.

Speed, in ``--rounds`` interleaved rounds (this machine is shared and noisy: ratios are taken
per round and the median reported), on ``--images`` Fashion-MNIST test images written as PNG
files, with the shipped model:

* ``smso-embed``: the command as a user runs it (``python -m batch.cli MODEL DIR -o OUT``), in a
  process of its own that starts its local Ray; images/s over the job (the summary's, from the
  pipeline's start to the last file written) and over the whole command (Ray's start included);
* ``smso-embed, running Ray``: the same command with ``--address``, on a local Ray started once
  before the rounds (``ray start --head``), as a user who runs many jobs would keep one: the
  command's time without Ray's start and shutdown (about 9 s here);
* ``loop``: one process, one loop: read each file, the same decoder
  (``service.imaging.images.Preprocessor``), and the same onnxruntime session
  (``service.runtime.backend.OnnxBackend``, its threads on every core) in batches of 64: the
  physical limit of a machine's cores without any framework;
* ``service``: ``smso-serve`` (started once) and 4 concurrent clients posting batches of 64
  files to ``/embed`` (multipart bodies built before the clock starts).

Targets: smso-embed >= 0.9x the loop and >= 3x the service. ResNet-50 SMSO at 224 px
(random weights) is measured the same way on ``--resnet-images`` JPEGs (256 x 256).

Parity (``--only parity``): ``--parity-images`` (1,000) Fashion-MNIST test images as PNG files,
each embedding smso-embed writes against ``/embed``'s answer for the same file (within 1e-5) and
its top-1 against ``/classify``'s (every image).

Faults (``--only faults``), each on its own folder: a Ray worker (the inference actor) killed
with SIGKILL mid-run, the job must still write every image once; a run stopped with SIGINT
halfway and resumed with ``--resume``, every image once; 1 % corrupt files, in the errors
table, the rest embedded.

    python -m bench.embed                  # 10,000 images, 3 rounds, ResNet-50, faults
    python -m bench.embed --quick          # 2,000 images, 1 round, no ResNet-50, faults
    python -m bench.embed --only faults     # or: --only speed, resnet, parity

Results: a table on stdout and ``bench/results/embed.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as pads

from bench.lib import RESULTS, SHIPPED, launch, report
from bench.lib.load import drive, post
from bench.lib.payloads import BOUNDARY, Body, jpegs, pngs
from service.imaging.images import Preprocessor
from service.runtime.backend import BackendOptions, OnnxBackend

BATCH = 64  # images per request and per loop step
CLIENTS = 4


def write_files(folder: Path, files: Sequence[bytes], suffix: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, data in enumerate(files):
        path = folder / f"{i:06d}{suffix}"
        path.write_bytes(data)
        paths.append(path)
    return paths


def embed_command(model: Path, source: Path, out: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "batch.cli", str(model), str(source), "-o", str(out), *flags]


def run_embed(model: Path, source: Path, out: Path, *flags: str) -> dict[str, Any]:
    """smso-embed in a process of its own: its JSON summary and the command's wall time."""
    start = time.perf_counter()
    done = subprocess.run(
        embed_command(model, source, out, "--json", "--no-progress", *flags),
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"smso-embed exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    summary = json.loads(done.stdout)
    images = summary["embedded"] + sum(summary["refused"].values())
    return summary | {"wall_s": wall, "wall_images_per_s": images / wall}


@contextlib.contextmanager
def running_ray(cpus: int) -> Iterator[str]:
    """A local Ray head (``ray start --head``) for the rounds; yields the address that joins it
    (``auto``: the one started here; its GCS listens on the node's address, not 127.0.0.1)."""
    ray = Path(sys.executable).with_name("ray")
    port = launch.free_port()
    env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"}
    start = [str(ray), "start", "--head", f"--port={port}", f"--num-cpus={cpus}"]
    start += ["--include-dashboard=false", "--disable-usage-stats"]
    subprocess.run(start, env=env, check=True, capture_output=True)
    try:
        yield "auto"
    finally:
        subprocess.run([str(ray), "stop", "--force"], env=env, check=False, capture_output=True)


def loop_rate(model: Path, files: Sequence[Path]) -> dict[str, Any]:
    """The single-process loop: read, decode, run a batch of 64, in turn."""
    backend = OnnxBackend(model, BackendOptions(providers="CPUExecutionProvider"))
    preprocess = Preprocessor(backend.card.preprocessing, 50_000_000)
    start = time.perf_counter()
    for i in range(0, len(files), BATCH):
        chunk = files[i : i + BATCH]
        backend.run(np.stack([preprocess(path.read_bytes(), str(path)) for path in chunk]))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "images_per_s": len(files) / seconds}


def multipart_batch(files: Sequence[Path], content_type: str) -> Body:
    """``files`` as the parts ``file`` of one multipart form."""
    parts = []
    for path in files:
        head = (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{path.name}"\r\nContent-Type: {content_type}\r\n\r\n'
        )
        parts.append(head.encode() + path.read_bytes() + b"\r\n")
    body = b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()
    return Body(body, {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})


def service_rate(url: str, bodies: Sequence[Body], images: int) -> dict[str, Any]:
    """``CLIENTS`` clients posting the batches to /embed, each batch once."""
    load = drive(post(f"{url}/embed", bodies), CLIENTS, len(bodies))
    if load["failures"]:
        raise RuntimeError(f"/embed failed: {load['outcomes']}")
    return {"images_per_s": load["requests_per_second"] * images / len(bodies)}


def fixed_and_rate(small: tuple[int, float], large: tuple[int, float]) -> dict[str, float]:
    """The line ``seconds = fixed + images / rate`` through two runs ``(images, seconds)``:
    the cost of a job of no images (Ray's start, its workers and actors) and the rate of every
    image beyond."""
    (n, t), (big_n, big_t) = small, large
    rate = (big_n - n) / (big_t - t) if big_t > t else float("inf")
    return {"fixed_s": big_t - big_n / rate, "rate": rate}


def crossover(fixed_s: float, rate: float, target: float) -> float:
    """The fewest images for which ``images / (fixed_s + images / rate)`` reaches ``target``
    images/s (infinite where ``rate`` does not exceed it)."""
    return target * fixed_s / (1 - target / rate) if rate > target else float("inf")


def speed(
    name: str,
    model: Path,
    files: list[Path],
    content_type: str,
    rounds: int,
    work: Path,
    embed_flags: Sequence[str] = (),
) -> dict[str, Any]:
    """The ways, interleaved, on ``files``; each round's figures and the median ratios.

    smso-embed runs on every file and, to separate its fixed cost from its rate, on a fifth of
    them; the line through the two gives the fixed seconds and the rate beyond (over the job and
    over the whole command), and the collection size from which the command reaches 0.9x the
    loop."""
    bodies = [
        multipart_batch(files[i : i + BATCH], content_type) for i in range(0, len(files), BATCH)
    ]
    folder = files[0].parent
    fifth = work / f"{name}-fifth"
    fifth.mkdir(exist_ok=True)
    for path in files[: max(1, len(files) // 5)]:
        if not (fifth / path.name).exists():
            os.link(path, fifth / path.name)
    small = len(list(fifth.iterdir()))
    results: dict[str, list[dict[str, Any]]] = {
        "smso-embed": [],
        "smso-embed, a fifth": [],
        "smso-embed, running Ray": [],
        "loop": [],
        "service": [],
    }
    settings = {"SMSO_MAX_BATCH_SIZE": str(BATCH), "SMSO_MAX_FILES": str(BATCH)}
    with (
        launch.smso_serve("--model-path", str(model), settings=settings) as server,
        running_ray(os.cpu_count() or 1) as address,
    ):
        service_rate(server.base, bodies[:2], 2 * BATCH)  # warm-up
        for r in range(rounds):
            joined = ("--address", address, *embed_flags)
            order: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                (
                    "smso-embed",
                    functools.partial(
                        run_embed, model, folder, work / f"{name}-out-{r}", *embed_flags
                    ),
                ),
                (
                    "smso-embed, a fifth",
                    functools.partial(
                        run_embed, model, fifth, work / f"{name}-fifth-{r}", *embed_flags
                    ),
                ),
                (
                    "smso-embed, running Ray",
                    functools.partial(run_embed, model, folder, work / f"{name}-on-{r}", *joined),
                ),
                ("loop", functools.partial(loop_rate, model, files)),
                ("service", functools.partial(service_rate, server.base, bodies, len(files))),
            ]
            for variant, measure in order if r % 2 == 0 else order[::-1]:
                results[variant].append(measure())
                rate = results[variant][-1]["images_per_s"]
                print(f"  {name} round {r + 1}: {variant} {rate:,.0f} images/s")

    def median_ratio(variant: str, key: str, against: str) -> float:
        pairs = zip(results[variant], results[against], strict=True)
        return statistics.median(e[key] / run["images_per_s"] for e, run in pairs)

    ratios = {
        "embed/loop": median_ratio("smso-embed", "images_per_s", "loop"),
        "embed/service": median_ratio("smso-embed", "images_per_s", "service"),
        "command/loop": median_ratio("smso-embed", "wall_images_per_s", "loop"),
        "command_on_running_ray/loop": median_ratio(
            "smso-embed, running Ray", "wall_images_per_s", "loop"
        ),
    }
    fits: dict[str, dict[str, float]] = {}
    loop = statistics.median(run["images_per_s"] for run in results["loop"])
    for over, key in (("job", "seconds"), ("command", "wall_s")):
        fit = fixed_and_rate(
            (small, statistics.median(run[key] for run in results["smso-embed, a fifth"])),
            (len(files), statistics.median(run[key] for run in results["smso-embed"])),
        )
        fits[over] = fit | {
            "rate/loop": fit["rate"] / loop,
            "images_for_0.9x_loop": crossover(fit["fixed_s"], fit["rate"], 0.9 * loop),
        }
    return {"images": len(files), "fifth": small, "rounds": results, "ratios": ratios, "fit": fits}


# --- parity -------------------------------------------------------------------------------


def parity(model: Path, work: Path, count: int) -> dict[str, Any]:
    """``count`` Fashion-MNIST test images as PNG files: each embedding smso-embed writes
    against ``/embed``'s for the same file (max absolute difference, target <= 1e-5), and its
    top-1 against ``/classify``'s (target: every image)."""
    files = write_files(work / "parity-in", pngs(count), ".png")
    out = work / "parity-out"
    run_embed(model, files[0].parent, out)
    table = pads.dataset(out / "embeddings", format="parquet").to_table()
    rows = table.to_pydict()
    written = {
        Path(path).name: (np.asarray(vector, np.float64), top[0])
        for path, vector, top in zip(
            rows["path"], rows["embedding"], rows["top_k_labels"], strict=True
        )
    }
    import httpx

    served: dict[str, tuple[np.ndarray, str]] = {}
    settings = {"SMSO_MAX_FILES": str(BATCH)}
    with (
        launch.smso_serve("--model-path", str(model), settings=settings) as server,
        httpx.Client() as client,
    ):
        for i in range(0, len(files), BATCH):
            chunk = files[i : i + BATCH]
            parts = [("file", (f.name, f.read_bytes(), "image/png")) for f in chunk]
            embedded = client.post(f"{server.base}/embed", files=parts, timeout=60).json()
            classified = client.post(
                f"{server.base}/classify", files=parts, params={"top_k": 1}, timeout=60
            ).json()
            for e, c in zip(embedded["results"], classified["results"], strict=True):
                served[e["filename"]] = (
                    np.asarray(e["embedding"], np.float64),
                    c["predictions"][0]["label"],
                )
    names = sorted(served)
    missing = sorted(set(names) ^ set(written))
    differences = [float(np.abs(written[n][0] - served[n][0]).max()) for n in names if n in written]
    top1 = sum(written[n][1] == served[n][1] for n in names if n in written)
    result = {
        "images": count,
        "compared": len(differences),
        "missing_either_side": missing[:20],
        "max_abs_difference": max(differences) if differences else None,
        "top1_agree": top1,
    }
    print(f"  parity: {json.dumps(result)}")
    return result


# --- faults -------------------------------------------------------------------------------


def descendants(pid: int) -> Iterator[tuple[int, str]]:
    """``(pid, command line)`` of every process below ``pid`` (Linux's /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    below: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - below
        below |= frontier
    for child in sorted(below):
        with contextlib.suppress(OSError):
            command = (Path(f"/proc/{child}/cmdline").read_bytes()).replace(b"\0", b" ")
            yield child, command.decode(errors="replace")


def parts_written(out: Path) -> int:
    return len(list((out / "embeddings").glob("part-*.parquet")))


def wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def exactly_once(out: Path, files: Sequence[Path]) -> dict[str, Any]:
    """Whether every file is in OUT's two tables exactly once."""
    paths: list[str] = []
    for table in ("embeddings", "errors"):
        parts = sorted(str(part) for part in (out / table).glob("part-*.parquet"))
        if parts:
            dataset = pads.dataset(parts, format="parquet")
            paths += dataset.to_table(columns=["path"]).column("path").to_pylist()
    expected = {str(path) for path in files}
    return {
        "rows": len(paths),
        "missing": len(expected - set(paths)),
        "repeated": len(paths) - len(set(paths)),
        "exactly_once": len(paths) == len(expected) and set(paths) == expected,
    }


def start_faulted_job(model: Path, files: Sequence[Path], out: Path) -> subprocess.Popen[str]:
    """smso-embed over ``files``' folder in small parts (256 rows), for a fault to interrupt."""
    flags = ("--no-progress", "--rows-per-file", "256", "--decode-batch", "128")
    return subprocess.Popen(
        embed_command(model, files[0].parent, out, *flags),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def fault_kill_worker(model: Path, files: Sequence[Path], out: Path) -> dict[str, Any]:
    """SIGKILL to the inference actor's process once the first part is written."""
    job = start_faulted_job(model, files, out)
    killed = None
    if wait_for(lambda: parts_written(out) > 0 or job.poll() is not None, 300):
        actors = [pid for pid, cmd in descendants(job.pid) if "MapWorker" in cmd]
        if actors and job.poll() is None:
            os.kill(actors[0], signal.SIGKILL)
            killed = actors[0]
    _, err = job.communicate(timeout=600)
    return {"killed_pid": killed, "exit": job.returncode, "stderr": err[-500:]} | exactly_once(
        out, files
    )


def fault_stop_and_resume(model: Path, files: Sequence[Path], out: Path) -> dict[str, Any]:
    """SIGINT once the first part is written (the parts come out in bursts: waiting for half of
    them can see the job end first); then the same command with --resume. ``interrupted``: the
    job did stop (exit 130) with images still to do, which the check requires."""
    job = start_faulted_job(model, files, out)
    wait_for(lambda: parts_written(out) >= 1 or job.poll() is not None, 300)
    stopped_with = parts_written(out)
    job.send_signal(signal.SIGINT)
    _, err = job.communicate(timeout=120)
    rows_after_stop: int = exactly_once(out, files)["rows"]
    first = {"exit": job.returncode, "parts_at_stop": stopped_with, "stderr": err[-300:]}
    first |= {"rows_after_stop": rows_after_stop}
    resumed = run_embed(model, files[0].parent, out, "--resume")
    once = exactly_once(out, files)
    interrupted = job.returncode == 130 and rows_after_stop < len(files)
    return (
        {
            "stopped": first,
            "resumed": {k: resumed[k] for k in ("skipped", "todo", "embedded")},
            "interrupted": interrupted,
        }
        | once
        | {"exactly_once": once["exactly_once"] and interrupted}
    )


def fault_corrupt(model: Path, folder: Path, out: Path, count: int) -> dict[str, Any]:
    """1 % of the files truncated to a third of their bytes."""
    files = write_files(folder, pngs(count), ".png")
    corrupt = files[:: max(1, count // (count // 100 or 1))][: max(1, count // 100)]
    for path in corrupt:
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 3])
    summary = run_embed(model, folder, out)
    errors = pads.dataset(out / "errors", format="parquet").to_table().column("path").to_pylist()
    return {
        "corrupt": len(corrupt),
        "refused": summary["refused"],
        "embedded": summary["embedded"],
        "errors_are_the_corrupt_files": sorted(errors) == sorted(str(p) for p in corrupt),
    } | exactly_once(out, files)


def faults(model: Path, work: Path, count: int) -> dict[str, Any]:
    files = write_files(work / "faults-in", pngs(count), ".png")
    found = {
        "kill_worker": fault_kill_worker(model, files, work / "faults-kill"),
        "stop_and_resume": fault_stop_and_resume(model, files, work / "faults-resume"),
        "corrupt_1_percent": fault_corrupt(model, work / "faults-corrupt", work / "c-out", count),
    }
    for name, result in found.items():
        shown = {k: v for k, v in result.items() if k != "stderr"}
        print(f"  fault {name}: {json.dumps(shown, default=str)}")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 images, 1 round, no ResNet")
    parser.add_argument("--images", type=int, help="Fashion-MNIST images (10,000)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (3)")
    parser.add_argument("--resnet-images", type=int, default=500)
    parser.add_argument("--only", choices=["speed", "resnet", "faults", "parity"])
    parser.add_argument("--parity-images", type=int, default=1_000)
    parser.add_argument("--out", type=Path, default=RESULTS / "embed.json")
    args = parser.parse_args(argv)
    images = args.images or (2_000 if args.quick else 10_000)
    rounds = args.rounds or (1 if args.quick else 3)
    found: dict[str, Any] = {"machine": report.machine(), "images": images, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
        work = Path(tmp)
        if args.only in (None, "speed"):
            files = write_files(work / "fmnist", pngs(images), ".png")
            found["fashion_mnist"] = speed("fmnist", SHIPPED, files, "image/png", rounds, work)
        if args.only == "resnet" or (args.only in (None, "speed") and not args.quick):
            from bench.lib.resnet import resnet_model  # torch: only here

            model = resnet_model(work, preset="minc2500", classes=23)
            jpeg = write_files(work / "resnet", jpegs(args.resnet_images, (256, 256)), ".jpg")
            found["resnet50_224"] = speed("resnet", model, jpeg, "image/jpeg", 1, work)
        if args.only in (None, "parity"):
            found["parity"] = parity(SHIPPED, work, 200 if args.quick else args.parity_images)
        if args.only in (None, "faults"):
            found["faults"] = faults(SHIPPED, work, 2_000 if args.quick else 5_000)
    rows, fits = [], []
    for name in ("fashion_mnist", "resnet50_224"):
        if name not in found:
            continue
        result = found[name]
        medians = {
            variant: statistics.median(run["images_per_s"] for run in runs)
            for variant, runs in result["rounds"].items()
        }
        runs = result["rounds"]
        walls = {
            variant: statistics.median(run["wall_images_per_s"] for run in runs[variant])
            for variant in ("smso-embed", "smso-embed, running Ray")
        }
        ratios = result["ratios"]
        rows.append(
            [
                name,
                f"{result['images']:,}",
                f"{medians['smso-embed']:,.0f}",
                f"{walls['smso-embed']:,.0f}",
                f"{walls['smso-embed, running Ray']:,.0f}",
                f"{medians['loop']:,.0f}",
                f"{medians['service']:,.0f}",
                report.format_ratio(ratios["embed/loop"]),
                report.format_ratio(ratios["command/loop"]),
                report.format_ratio(ratios["command_on_running_ray/loop"]),
                report.format_ratio(ratios["embed/service"]),
            ]
        )
        for over, fit in result["fit"].items():
            fits.append(
                [
                    name,
                    over,
                    f"{fit['fixed_s']:.1f}",
                    f"{fit['rate']:,.0f}",
                    report.format_ratio(fit["rate/loop"]),
                    f"{fit['images_for_0.9x_loop']:,.0f}",
                ]
            )
    if rows:
        header = [
            "model",
            "images",
            "job /s",
            "command /s",
            "command, running Ray /s",
            "loop /s",
            "service /s",
            "job / loop",
            "command / loop",
            "command, running Ray / loop",
            "job / service",
        ]
        print(report.markdown_table(header, rows))
        print()
        header = ["model", "over", "fixed s", "images/s beyond", "that / loop", "0.9x loop from"]
        print(report.markdown_table(header, fits))
    report.save(args.out, found)
    ok = all(result["exactly_once"] for result in found.get("faults", {}).values())
    if "parity" in found:
        same = found["parity"]
        ok = ok and not same["missing_either_side"] and same["top1_agree"] == same["compared"]
        ok = ok and same["max_abs_difference"] is not None and same["max_abs_difference"] <= 1e-5
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
