"""smso-embed's two engines against the loop a user would write, and what a batch job must hold.

**Speed**, in ``--rounds`` interleaved rounds (this machine may be shared and noisy: ratios are
taken within each round and the median reported), on ``--images`` Fashion-MNIST test images
written as PNG files, with the shipped model:

* ``embedded``: ``smso-embed MODEL DIR -o OUT`` as a user runs it (the embedded engine, the
  default), in a process of its own: images/s over the whole command (Python's start, imports,
  the sessions' load included) and over the job (the summary's);
* ``ray``: the same command with ``--engine ray``: a local Ray started by the command;
* ``loop``: the single-process loop (:mod:`bench.lib.embed_loop`): read, the same decoder, the
  same onnxruntime session on every core, in batches of 64, in turn; over the loop alone, and
  as a script of its own (``loop, whole script``: start-up included, as for the command);
* both engines also on a fifth of the files: the line through the two sizes gives each one's
  fixed cost (seconds of a job of no images) and its marginal rate (images/s beyond);
* ``first job``: the embedded command on the first 1,000 images, the wall time.

Targets: the embedded command >= 1.1x the loop (start-up included on both sides, and against
the loop alone); the first job of 1,000 images under 3 s; Ray's marginal rate >= 0.8x the
loop, its fixed cost reported. ResNet-50 SMSO at 224 px (random weights) is measured the same
way on ``--resnet-images`` JPEGs (256 x 256): embedded >= 1.0x the loop.

**Parity** (``--only parity``): ``--parity-images`` Fashion-MNIST test images as PNGs; each
embedding both engines write, and the embedded engine with ``--dtype float16``, against
``/embed``'s for the same file (within 1e-5; float16 within its rounding, 2^-11 relative), and
the top-1 against ``/classify``'s (every image).

**Faults** (``--only faults``), each on its own folder, on both engines: the driver killed with
SIGKILL at a random moment after its first part and resumed, three times in a row, then resumed
to the end (every image exactly once); a Ray worker (the inference actor) killed mid-run (every
image once); 1 % corrupt files (in the errors table, the rest embedded); a second job started on
the same OUT while the first runs (refused, exit 2, and the first finishes with every image
once).

**Incremental** (``--only incremental``): a collection of ``--images`` embedded, then 100
images added, 100 changed (rewritten with other pictures) and 100 deleted; ``--resume`` must
embed only the 200 new and changed, take the 100 deleted out, and leave OUT with exactly one
row per current image (the changed ones with their new embedding).

    python -m bench.embed                  # 10,000 images, 3 rounds, ResNet-50, all checks
    python -m bench.embed --quick          # 2,000 images, 1 round, no ResNet-50
    python -m bench.embed --only speed     # or: resnet, parity, faults, incremental

Results: tables on stdout and ``bench/results/embed.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import random
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
from PIL import Image, ImageOps

from bench.lib import RESULTS, SHIPPED, launch, report
from bench.lib.embed_loop import loop_rate
from bench.lib.payloads import jpegs, pngs

BATCH = 64  # images per request to the service (parity)
ENGINES = ("embedded", "ray")
ENGINE_FLAGS = {"embedded": (), "ray": ("--engine", "ray")}
#: the embedded engine on one core and small batches in the faults: slow enough (about 10 s for
#: 5,000 images) for a kill to land mid-job
FAULT_FLAGS = {
    "embedded": ("--sessions", "1", "--threads", "1", "--decoders", "1", "--batch-size", "16"),
    "ray": ("--engine", "ray"),
}


def write_files(folder: Path, files: Sequence[bytes], suffix: str, start: int = 0) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, data in enumerate(files, start):
        path = folder / f"{i:06d}{suffix}"
        path.write_bytes(data)
        paths.append(path)
    return paths


#: the interpreter that runs smso-embed and the loop script (--python: another install of this
#: project, e.g. one with only the `embed` and `serving-cpu` extras)
PYTHON = [sys.executable]


def embed_command(model: Path, source: Path, out: Path, *flags: str) -> list[str]:
    return [PYTHON[0], "-m", "batch.cli", str(model), str(source), "-o", str(out), *flags]


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


def loop_script(model: Path, folder: Path) -> dict[str, Any]:
    """The loop as a script of its own (:mod:`bench.lib.embed_loop`): its wall time."""
    start = time.perf_counter()
    done = subprocess.run(
        [PYTHON[0], "-m", "bench.lib.embed_loop", str(model), str(folder)],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    inner = json.loads(done.stdout)
    return inner | {"wall_s": wall, "wall_images_per_s": inner["images"] / wall}


def fixed_and_rate(small: tuple[int, float], large: tuple[int, float]) -> dict[str, float]:
    """The line ``seconds = fixed + images / rate`` through two runs ``(images, seconds)``:
    the cost of a job of no images (starting the engine, its workers and sessions) and the rate
    of every image beyond."""
    (n, t), (big_n, big_t) = small, large
    rate = (big_n - n) / (big_t - t) if big_t > t else float("inf")
    return {"fixed_s": big_t - big_n / rate, "rate": rate}


def crossover(fixed_s: float, rate: float, target: float) -> float:
    """The fewest images for which ``images / (fixed_s + images / rate)`` reaches ``target``
    images/s (infinite where ``rate`` does not exceed it)."""
    return target * fixed_s / (1 - target / rate) if rate > target else float("inf")


def linked(files: Sequence[Path], folder: Path) -> Path:
    """``files`` hard-linked into ``folder`` (the same bytes, another collection)."""
    folder.mkdir(exist_ok=True)
    for path in files:
        if not (folder / path.name).exists():
            os.link(path, folder / path.name)
    return folder


def speed(
    name: str,
    model: Path,
    files: list[Path],
    rounds: int,
    work: Path,
    engines: Sequence[str] = ENGINES,
    first_job: int = 1_000,
) -> dict[str, Any]:
    """The ways, interleaved, on ``files``; each round's figures and the median ratios."""
    folder = files[0].parent
    fifth = linked(files[: max(1, len(files) // 5)], work / f"{name}-fifth")
    first = linked(files[:first_job], work / f"{name}-first") if first_job else None
    small = len(list(fifth.iterdir()))
    results: dict[str, list[dict[str, Any]]] = {"loop": [], "loop, whole script": []}
    for engine in engines:
        results[engine] = []
        results[f"{engine}, a fifth"] = []
    if first:
        results["first job"] = []
    for r in range(rounds):
        order: list[tuple[str, Callable[[], dict[str, Any]]]] = []
        for engine in engines:
            flags = ENGINE_FLAGS[engine]
            order.append(
                (
                    engine,
                    functools.partial(
                        run_embed, model, folder, work / f"{name}-{engine}-{r}", *flags
                    ),
                )
            )
            order.append(
                (
                    f"{engine}, a fifth",
                    functools.partial(
                        run_embed, model, fifth, work / f"{name}-{engine}-fifth-{r}", *flags
                    ),
                )
            )
        order.append(("loop", functools.partial(loop_rate, model, files)))
        order.append(("loop, whole script", functools.partial(loop_script, model, folder)))
        if first:
            order.append(
                ("first job", functools.partial(run_embed, model, first, work / f"{name}-1k-{r}"))
            )
        for variant, measure in order if r % 2 == 0 else order[::-1]:
            results[variant].append(measure())
            last = results[variant][-1]
            rate = last.get("wall_images_per_s", last["images_per_s"])
            print(f"  {name} round {r + 1}: {variant} {rate:,.0f} images/s", flush=True)

    def ratio(variant: str, key: str, against: str, against_key: str) -> float:
        pairs = zip(results[variant], results[against], strict=True)
        return statistics.median(v[key] / a[against_key] for v, a in pairs)

    ratios: dict[str, float] = {}
    fits: dict[str, dict[str, float]] = {}
    loop = statistics.median(run["images_per_s"] for run in results["loop"])
    for engine in engines:
        ratios[f"{engine} command / loop script"] = ratio(
            engine, "wall_images_per_s", "loop, whole script", "wall_images_per_s"
        )
        ratios[f"{engine} command / loop"] = ratio(
            engine, "wall_images_per_s", "loop", "images_per_s"
        )
        ratios[f"{engine} job / loop"] = ratio(engine, "images_per_s", "loop", "images_per_s")
        for over, key in (("job", "seconds"), ("command", "wall_s")):
            fit = fixed_and_rate(
                (small, statistics.median(run[key] for run in results[f"{engine}, a fifth"])),
                (len(files), statistics.median(run[key] for run in results[engine])),
            )
            fits[f"{engine}, {over}"] = fit | {
                "rate/loop": fit["rate"] / loop,
                "images_for_1x_loop": crossover(fit["fixed_s"], fit["rate"], loop),
            }
    found: dict[str, Any] = {
        "images": len(files),
        "fifth": small,
        "rounds": results,
        "ratios": ratios,
        "fit": fits,
    }
    if first:
        found["first_job"] = {
            "images": first_job,
            "wall_s": statistics.median(run["wall_s"] for run in results["first job"]),
        }
    return found


# --- parity -------------------------------------------------------------------------------


def served_answers(model: Path, files: Sequence[Path]) -> dict[str, tuple[np.ndarray, str]]:
    """``/embed``'s embedding and ``/classify``'s top-1 for each file, by file name."""
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
    return served


def written(out: Path) -> dict[str, tuple[np.ndarray, str]]:
    """OUT's embeddings and top-1 labels, by file name."""
    rows = pads.dataset(out / "embeddings", format="parquet").to_table().to_pydict()
    return {
        Path(path).name: (np.asarray(vector, np.float64), top[0])
        for path, vector, top in zip(
            rows["path"], rows["embedding"], rows["top_k_labels"], strict=True
        )
    }


def parity(model: Path, work: Path, count: int) -> dict[str, Any]:
    """Each engine's OUT (and float16's) against the service's answers for the same files."""
    files = write_files(work / "parity-in", pngs(count), ".png")
    served = served_answers(model, files)
    ways = {
        "embedded": ("float32", ()),
        "ray": ("float32", ("--engine", "ray")),
        "embedded, float16": ("float16", ("--dtype", "float16")),
    }
    found: dict[str, Any] = {"images": count}
    for way, (dtype, flags) in ways.items():
        out = work / f"parity-out-{way.replace(', ', '-')}"
        run_embed(model, files[0].parent, out, *flags)
        mine = written(out)
        names = sorted(served)
        missing = sorted(set(names) ^ set(mine))
        both = [n for n in names if n in mine]
        absolute = [float(np.abs(mine[n][0] - served[n][0]).max()) for n in both]
        relative = [
            float(
                (np.abs(mine[n][0] - served[n][0]) / np.maximum(np.abs(served[n][0]), 1e-3)).max()
            )
            for n in both
        ]
        top1 = sum(mine[n][1] == served[n][1] for n in both)
        bound = 1e-5 if dtype == "float32" else 2.0**-11
        worst = max(absolute if dtype == "float32" else relative) if both else None
        found[way] = {
            "dtype": dtype,
            "compared": len(both),
            "missing_either_side": missing[:20],
            "max_abs_difference": max(absolute) if absolute else None,
            "max_rel_difference": max(relative) if relative else None,
            "bound": bound,
            "within_bound": worst is not None and worst <= bound,
            "top1_agree": top1,
        }
        print(f"  parity {way}: {json.dumps(found[way])}", flush=True)
    return found


def parity_ok(found: dict[str, Any]) -> bool:
    return all(
        not way["missing_either_side"]
        and way["within_bound"]
        and way["top1_agree"] == way["compared"] == found["images"]
        for key, way in found.items()
        if key != "images"
    )


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
        time.sleep(0.05)
    return False


def exactly_once(out: Path, files: Sequence[Path]) -> dict[str, Any]:
    """Whether every file is in OUT's two tables exactly once, and nothing else is."""
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
        "extra": len(set(paths) - expected),
        "exactly_once": len(paths) == len(expected) and set(paths) == expected,
    }


def start_job(
    model: Path, folder: Path, out: Path, *flags: str, new_session: bool = True
) -> subprocess.Popen[str]:
    """smso-embed over ``folder`` in small parts (64 rows), for a fault to interrupt; in a
    process group of its own (where its Ray's processes are too)."""
    small = ("--no-progress", "--rows-per-file", "64", "--decode-batch", "32")
    return subprocess.Popen(
        embed_command(model, folder, out, *small, *flags),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=new_session,
    )


def _end_group(job: subprocess.Popen[str]) -> None:
    """Whatever the killed driver left (a local Ray's processes) ended too."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(job.pid, signal.SIGKILL)
    job.communicate(timeout=60)


def _progressed(job: subprocess.Popen[str], out: Path, files: Sequence[Path], before: int) -> bool:
    """The job has written a part since ``before`` rows, or ended."""
    return exactly_once(out, files)["rows"] > before or job.poll() is not None


def fault_kill_driver(
    model: Path, files: Sequence[Path], out: Path, flags: Sequence[str], rng: random.Random
) -> dict[str, Any]:
    """SIGKILL to the driver at a random moment after its first part, three times in a row
    (each time resumed), then a resume to the end."""
    kills = []
    for attempt in range(3):
        resume = ("--resume",) if attempt else ()
        before = exactly_once(out, files)["rows"] if attempt else 0
        job = start_job(model, files[0].parent, out, *resume, *flags)
        wait_for(functools.partial(_progressed, job, out, files, before), 300)
        time.sleep(rng.uniform(0.0, 0.5))
        ended_first = job.poll() is not None
        if not ended_first:
            os.kill(job.pid, signal.SIGKILL)
        _end_group(job)
        kills.append({"killed": not ended_first, "rows_after": exactly_once(out, files)["rows"]})
    resumed = run_embed(model, files[0].parent, out, "--resume", *flags)
    once = exactly_once(out, files)
    interrupted = all(kill["killed"] for kill in kills)
    return (
        {"kills": kills, "final": {k: resumed[k] for k in ("skipped", "todo", "embedded")}}
        | once
        | {"exactly_once": once["exactly_once"] and interrupted}
    )


def fault_kill_worker(model: Path, files: Sequence[Path], out: Path) -> dict[str, Any]:
    """SIGKILL to the Ray engine's inference actor once the first part is written."""
    job = start_job(model, files[0].parent, out, "--engine", "ray")
    killed = None
    if wait_for(lambda: parts_written(out) > 0 or job.poll() is not None, 300):
        actors = [pid for pid, cmd in descendants(job.pid) if "MapWorker" in cmd]
        if actors and job.poll() is None:
            os.kill(actors[0], signal.SIGKILL)
            killed = actors[0]
    _, err = job.communicate(timeout=600)
    once = exactly_once(out, files)
    return (
        {"killed_pid": killed, "exit": job.returncode, "stderr": err[-500:]}
        | once
        | {"exactly_once": once["exactly_once"] and killed is not None and job.returncode == 0}
    )


def fault_corrupt(
    model: Path, folder: Path, out: Path, count: int, flags: Sequence[str]
) -> dict[str, Any]:
    """1 % of the files truncated to a third of their bytes."""
    files = write_files(folder, pngs(count), ".png")
    corrupt = files[:: max(1, count // (count // 100 or 1))][: max(1, count // 100)]
    for path in corrupt:
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 3])
    summary = run_embed(model, folder, out, *flags)
    errors = pads.dataset(out / "errors", format="parquet").to_table().column("path").to_pylist()
    once = exactly_once(out, files)
    same = sorted(errors) == sorted(str(p) for p in corrupt)
    return (
        {
            "corrupt": len(corrupt),
            "refused": summary["refused"],
            "embedded": summary["embedded"],
            "errors_are_the_corrupt_files": same,
        }
        | once
        | {"exactly_once": once["exactly_once"] and same}
    )


def fault_two_jobs(
    model: Path, files: Sequence[Path], out: Path, flags: Sequence[str]
) -> dict[str, Any]:
    """A second job on the same OUT while the first runs: refused (exit 2, saying why), and the
    first finishes with every image once."""
    first = start_job(model, files[0].parent, out, *flags)
    wait_for(lambda: (out / "_smso_embed.json").exists() or first.poll() is not None, 120)
    second = subprocess.run(
        embed_command(model, files[0].parent, out, "--resume", "--no-progress", *flags),
        capture_output=True,
        text=True,
        check=False,
    )
    still_running = first.poll() is None
    first.communicate(timeout=600)
    once = exactly_once(out, files)
    refused = second.returncode == 2 and "in use" in second.stderr
    return (
        {
            "second_exit": second.returncode,
            "second_said": second.stderr.strip()[-300:],
            "first_exit": first.returncode,
            "first_was_running": still_running,
        }
        | once
        | {"exactly_once": once["exactly_once"] and refused and first.returncode == 0}
    )


def faults(model: Path, work: Path, count: int, seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    files = write_files(work / "faults-in", pngs(count), ".png")
    found: dict[str, Any] = {}
    for engine in ENGINES:
        flags = FAULT_FLAGS[engine]
        found[f"{engine}: driver killed 3 times"] = fault_kill_driver(
            model, files, work / f"faults-kill-{engine}", flags, rng
        )
        found[f"{engine}: 1 % corrupt"] = fault_corrupt(
            model, work / f"faults-corrupt-{engine}", work / f"c-out-{engine}", count, flags
        )
        found[f"{engine}: two jobs on one OUT"] = fault_two_jobs(
            model, files, work / f"faults-two-{engine}", flags
        )
    found["ray: worker killed"] = fault_kill_worker(model, files, work / "faults-worker")
    for name, result in found.items():
        shown = {k: v for k, v in result.items() if k not in ("stderr", "second_said")}
        print(f"  fault {name}: {json.dumps(shown, default=str)}", flush=True)
    return found


# --- incremental --------------------------------------------------------------------------


def flipped(png: bytes) -> bytes:
    """A PNG's picture mirrored left to right: a new image, whatever the dataset's size."""
    buffer = io.BytesIO()
    ImageOps.mirror(Image.open(io.BytesIO(png))).save(buffer, "PNG")
    return buffer.getvalue()


def incremental(model: Path, work: Path, count: int, touched: int = 100) -> dict[str, Any]:
    """``count`` images embedded; ``touched`` added, changed and deleted; ``--resume``."""
    folder = work / "incremental-in"
    files = write_files(folder, pngs(count), ".png")
    out = work / "incremental-out"
    first = run_embed(model, folder, out)
    before = written(out)
    rng = random.Random(1)
    chosen = rng.sample(files, 2 * touched)
    changed, deleted = chosen[:touched], chosen[touched:]
    pictures = pngs(count)
    for i, path in enumerate(changed):  # another picture, so another embedding
        path.write_bytes(flipped(pictures[(i + 1) % count]))
    for path in deleted:
        path.unlink()
    news = [flipped(pictures[-1 - i]) for i in range(touched)]
    added = write_files(folder, news, ".png", start=count)
    resumed = run_embed(model, folder, out, "--resume")
    after = written(out)
    current = sorted(path for path in folder.iterdir())
    once = exactly_once(out, current)
    changed_names = {path.name for path in changed}
    kept = [name for name in before if name in after and name not in changed_names]
    moved = [name for name in changed_names if np.array_equal(before[name][0], after[name][0])]
    unchanged_same = all(np.array_equal(before[n][0], after[n][0]) for n in kept)
    counts = {k: resumed[k] for k in ("new", "changed", "deleted", "todo", "skipped", "embedded")}
    ok = (
        once["exactly_once"]
        and counts["new"] == len(added)
        and counts["changed"] == touched
        and counts["deleted"] == touched
        and counts["todo"] == 2 * touched
        and not moved
        and unchanged_same
    )
    found = {
        "images": count,
        "first_run_s": first["wall_s"],
        "resumed_wall_s": resumed["wall_s"],
        "resumed": counts,
        "changed_rows_with_their_old_embedding": len(moved),
        "unchanged_rows_identical": unchanged_same,
        "ok": ok,
    } | once
    print(f"  incremental: {json.dumps(found)}", flush=True)
    return found


# --- the report ---------------------------------------------------------------------------


def speed_rows(name: str, result: dict[str, Any]) -> list[list[str]]:
    runs = result["rounds"]

    def median(variant: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[variant])

    rows = [
        [
            name,
            "loop",
            f"{median('loop', 'images_per_s'):,.0f}",
            "",
            f"{median('loop, whole script', 'wall_images_per_s'):,.0f}",
            "1.00x",
            "",
        ]
    ]
    for engine in ENGINES:
        if engine not in runs:
            continue
        ratios = result["ratios"]
        rows.append(
            [
                name,
                engine,
                f"{median(engine, 'images_per_s'):,.0f}",
                report.format_ratio(ratios[f"{engine} job / loop"]),
                f"{median(engine, 'wall_images_per_s'):,.0f}",
                report.format_ratio(ratios[f"{engine} command / loop script"]),
                report.format_ratio(ratios[f"{engine} command / loop"]),
            ]
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 images, 1 round, no ResNet")
    parser.add_argument("--images", type=int, help="Fashion-MNIST images (10,000)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (3)")
    parser.add_argument("--resnet-images", type=int, default=500)
    parser.add_argument("--only", choices=["speed", "resnet", "faults", "parity", "incremental"])
    parser.add_argument("--parity-images", type=int, default=1_000)
    parser.add_argument(
        "--engines", nargs="+", choices=ENGINES, default=list(ENGINES), help="speed: the engines"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "embed.json")
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter of the install that runs smso-embed and the loop script "
        "(default: this one; the Ray engine needs the batch extra there)",
    )
    args = parser.parse_args(argv)
    PYTHON[0] = args.python
    images = args.images or (2_000 if args.quick else 10_000)
    rounds = args.rounds or (1 if args.quick else 3)
    found: dict[str, Any] = {
        "machine": report.machine(),
        "images": images,
        "rounds": rounds,
        "python": args.python,
    }
    every = args.only is None
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
        work = Path(tmp)
        if every or args.only == "speed":
            files = write_files(work / "fmnist", pngs(images), ".png")
            found["fashion_mnist"] = speed(
                "fmnist", SHIPPED, files, rounds, work, engines=args.engines
            )
        if args.only == "resnet" or (every and not args.quick):
            from bench.lib.resnet import resnet_model  # torch: only here

            model = resnet_model(work, preset="minc2500", classes=23)
            jpeg = write_files(work / "resnet", jpegs(args.resnet_images, (256, 256)), ".jpg")
            found["resnet50_224"] = speed(
                "resnet", model, jpeg, 1, work, engines=("embedded",), first_job=0
            )
        if every or args.only == "parity":
            found["parity"] = parity(SHIPPED, work, 200 if args.quick else args.parity_images)
        if every or args.only == "faults":
            found["faults"] = faults(SHIPPED, work, 1_000 if args.quick else 5_000)
        if every or args.only == "incremental":
            found["incremental"] = incremental(SHIPPED, work, images)
    rows, fits = [], []
    for name in ("fashion_mnist", "resnet50_224"):
        if name not in found:
            continue
        rows += speed_rows(name, found[name])
        for way, fit in found[name]["fit"].items():
            fits.append(
                [
                    name,
                    way,
                    f"{fit['fixed_s']:.1f}",
                    f"{fit['rate']:,.0f}",
                    report.format_ratio(fit["rate/loop"]),
                    f"{fit['images_for_1x_loop']:,.0f}",
                ]
            )
    if rows:
        header = [
            "model",
            "way",
            "job /s",
            "job / loop",
            "command /s",
            "command / loop script",
            "command / loop",
        ]
        print(report.markdown_table(header, rows))
        print()
        header = [
            "model",
            "engine, over",
            "fixed s",
            "images/s beyond",
            "that / loop",
            "1x loop from",
        ]
        print(report.markdown_table(header, fits))
        first = found.get("fashion_mnist", {}).get("first_job")
        if first:
            print(f"\nfirst job of {first['images']:,} images: {first['wall_s']:.2f} s")
    report.save(args.out, found)
    ok = all(result["exactly_once"] for result in found.get("faults", {}).values())
    if "parity" in found:
        ok = ok and parity_ok(found["parity"])
    if "incremental" in found:
        ok = ok and found["incremental"]["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
