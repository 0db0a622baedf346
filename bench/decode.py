"""Decoding and preprocessing images in parallel: threads, a process pool, or several servers?

The service decodes and preprocesses each uploaded image with
``service.imaging.images.Preprocessor`` in a thread pool. Threads help only as far as that work runs
outside the GIL (Pillow releases it while it decodes, converts and resizes; numpy while it loops
over large arrays). On 640x480
JPEGs (Fashion-MNIST test images scaled up, ``bench.lib.payloads.jpegs``) and for two
preprocessings, the shipped model's (its model card: grey, 28 px) and an ImageNet-style one
(RGB, resize 256, centre crop 224, ImageNet mean and std), this script measures:

* **steps**: the single-thread time per image of each step, in the order ``Preprocessor`` runs
  them: open + header (with the JPEG draft request), decode, colour (EXIF orientation and the
  model's mode), resize, crop + normalise to float32 (:class:`Steps`; their composition is
  checked to give ``Preprocessor``'s output exactly).
* **the fraction of the time the GIL is held**, while one thread preprocesses images in a loop,
  three ways:

  1. *probe*: a second thread calls ``time.sleep(0)`` over and over and records the gaps
     between its calls. ``sleep(0)`` gives the GIL up and takes it back, so a gap longer than
     on an idle interpreter (its median, measured just before) is time the probe waited for the
     GIL; the waits summed over the wall time estimate the fraction the worker held it. The
     probe is cheap and needs nothing, but it is coarse: it wakes every 50-100 us (the kernel's
     timer slack), each hand-over of the GIL adds a thread wake-up to its wait, and on a busy
     machine a wait for a CPU looks like a wait for the GIL. Its reading on a synthetic
     workload of known GIL fraction (a pure-Python loop, then ``hashlib`` on a buffer, which
     releases the GIL) is reported beside it as a calibration.
  2. *scaling*: the throughput of 2 threads against 1 (below). By Amdahl's law on 2 cores,
     ``speedup = 1 / (s + (1 - s) / 2)``, so the serial fraction is ``s = 2 / speedup - 1``.
     It folds in everything that does not scale (memory bandwidth, the submitting thread, the
     neighbours' load on a shared machine) and is the noisiest of the three.
  3. *py-spy* (when the ``py-spy`` sampler is installed, ``pip install py-spy``): it samples
     the process from outside at 1 kHz, once recording every sample and once only those in
     which a thread holds the GIL (``--gil``, read from the interpreter's own GIL state), so
     the ratio is the GIL-held fraction without disturbing the GIL; the stacks give it per step.
     On the synthetic workload it reads the known fraction within a few percentage points.

* **throughput**: a ``ThreadPoolExecutor`` of 1 and 2 workers and a ``ProcessPoolExecutor``
  (spawned workers, warmed up) of 1 and 2 workers, each given the JPEG bytes one task per
  image (as the service submits them) and returning the float32 ``(C, S, S)`` array to the
  caller: for processes that includes pickling the bytes there and the array back. The four
  run in interleaved rounds (this machine is shared and noisy); each round gives ratios against
  1 thread and the median is reported. Also this process's CPU time per image: for a process
  pool that is the parent's own work (sending, receiving, unpickling, bookkeeping), which its
  GIL serialises as it does the threads' Python code.
* **a model, not a measurement**: Amdahl's extrapolation to 16 cores,
  ``speedup(16) = 1 / (s + (1 - s) / 16)``, for threads with each estimate of ``s``, and for a
  process pool with ``s`` = the parent's GIL time (py-spy; else its CPU time) per image over a
  worker's time per image.

    python -m bench.decode                  # both preprocessings (about a minute on 2 cores)
    python -m bench.decode --quick          # fewer images, rounds and samples (a smoke test)

Prints markdown tables and writes ``bench/results/decode.json`` (``--json PATH``).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import PIL
from PIL import Image, ImageOps

from bench.lib import RESULTS, SHIPPED, report
from bench.lib.decoding import Pools
from bench.lib.payloads import jpegs
from service.core.card import Preprocessing
from service.imaging.images import Preprocessor, resized_size, to_mode
from service.runtime.backend import read_card

MAX_PIXELS = 50_000_000  # the service's default
IMAGENET = Preprocessing(
    colour="RGB", resize=256, crop=224, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]
)
CORES = 16  # the extrapolation's target machine
WORKER = "bench-worker"  # the measured thread's name, for py-spy's stacks
POOLS = ("threads x1", "threads x2", "processes x1", "processes x2")


def shipped_preprocessing() -> Preprocessing:
    """The shipped model's preprocessing, from the card in its ONNX metadata."""
    return read_card(SHIPPED).preprocessing


# --- the steps of Preprocessor, one by one ------------------------------------------------


@dataclass(frozen=True)
class Steps:
    """``Preprocessor.__call__`` cut into its steps (without its error handling); each step
    takes the previous one's result, the first the encoded bytes."""

    pre: Preprocessor

    NAMES = ("open + header", "decode", "colour", "resize", "crop + normalise")

    def header(self, data: bytes) -> Image.Image:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > self.pre.max_pixels:
            raise ValueError(f"{width}x{height} is over the pixel limit")
        self.pre._draft(image)
        return image

    def decode(self, image: Image.Image) -> Image.Image:
        image.seek(0)
        image.load()
        return image

    def colour(self, image: Image.Image) -> Image.Image:
        ImageOps.exif_transpose(image, in_place=True)
        return to_mode(image, self.pre.mode)

    def resize(self, image: Image.Image) -> Image.Image:
        if self.pre.spec.resize is None:
            return image
        size = resized_size(*image.size, self.pre.spec.resize)
        return image if size == image.size else image.resize(size, Image.Resampling.BILINEAR)

    def crop_normalise(self, image: Image.Image) -> np.ndarray:
        return self.pre.tensor(self.pre.geometry(image))  # geometry only crops after resize()

    def functions(self) -> list[Callable[[Any], Any]]:
        return [self.header, self.decode, self.colour, self.resize, self.crop_normalise]

    def __call__(self, data: bytes) -> np.ndarray:
        value: Any = data
        for step in self.functions():
            value = step(value)
        return value


def step_times(pre: Preprocessor, files: Sequence[bytes], repeats: int) -> dict[str, Any]:
    """Median single-thread milliseconds of each step, and of the whole ``Preprocessor``."""
    steps = Steps(pre)
    for data in files:
        if not np.array_equal(steps(data), pre(data)):
            raise RuntimeError("Steps no longer reproduces Preprocessor: bring it up to date")
    samples: list[list[float]] = [[] for _ in Steps.NAMES]
    whole = []
    for _ in range(repeats):
        for data in files:
            value: Any = data
            for k, step in enumerate(steps.functions()):
                start = time.perf_counter()
                value = step(value)
                samples[k].append(time.perf_counter() - start)
            start = time.perf_counter()
            pre(data)
            whole.append(time.perf_counter() - start)
    ms = {name: 1e3 * statistics.median(s) for name, s in zip(Steps.NAMES, samples, strict=True)}
    return {"step_ms": ms, "sum_ms": sum(ms.values()), "whole_ms": 1e3 * statistics.median(whole)}


# --- measuring the GIL ----------------------------------------------------------------------


def in_background(work: Callable[[], int], measure: Callable[[], Any]) -> tuple[Any, float, int]:
    """``work()`` (returning the images it did) in a loop in a thread named :data:`WORKER`,
    warmed up, while ``measure()`` runs in this one: its result, the wall seconds and the
    images done meanwhile."""
    done = 0
    stop = threading.Event()
    started = threading.Event()

    def loop() -> None:
        nonlocal done
        work()
        started.set()
        while not stop.is_set():
            done += work()

    worker = threading.Thread(target=loop, name=WORKER)
    worker.start()
    started.wait()
    first, start = done, time.perf_counter()
    try:
        result = measure()
    finally:
        wall, images = time.perf_counter() - start, done - first
        stop.set()
        worker.join()
    return result, wall, max(images, 1)


def probe_gaps(duration_s: float) -> list[float]:
    """Gaps between successive ``time.sleep(0)`` calls of this thread over ``duration_s``."""
    gaps = []
    end = time.perf_counter() + duration_s
    last = time.perf_counter()
    while last < end:
        time.sleep(0)  # gives the GIL up and takes it back
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    return gaps


def probe(work: Callable[[], int], duration_s: float) -> dict[str, float]:
    """The probe's GIL-held fraction while ``work`` runs, and the worker's time per image."""
    base = statistics.median(probe_gaps(0.2))
    gaps, wall, images = in_background(work, lambda: probe_gaps(duration_s))
    held = sum(max(gap - base, 0.0) for gap in gaps) / wall
    return {"held_fraction": held, "idle_gap_us": 1e6 * base, "ms_per_image": 1e3 * wall / images}


@dataclass(frozen=True)
class PySpy:
    """py-spy sampling this process: every sample, and the samples in which a thread holds the
    GIL, over the same seconds."""

    executable: str
    rate: int = 1000

    @classmethod
    def find(cls) -> PySpy | None:
        """py-spy from the PATH or beside this Python, if it may read this process."""
        found = shutil.which("py-spy") or shutil.which(
            "py-spy", path=str(Path(sys.executable).parent)
        )
        if found is None:
            log("py-spy not found (pip install py-spy): the GIL measured by probe and scaling")
            return None
        check = subprocess.run(
            [found, "dump", "--nonblocking", "-p", str(os.getpid())],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check.returncode != 0:  # e.g. no ptrace permission in a container
            log(f"py-spy cannot read this process ({check.stderr.strip()[-200:]}): not used")
            return None
        return cls(found)

    def sample(self, seconds: float) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """(stacks of every sample, stacks of the GIL holder's samples): ``(stack, count)``,
        a stack beginning with its thread's name."""
        with tempfile.TemporaryDirectory() as tmp:
            runs = []
            for gil in (False, True):
                out = Path(tmp) / f"{'gil' if gil else 'all'}.txt"
                command = [
                    self.executable,
                    "record",
                    "-p",
                    str(os.getpid()),
                    "-r",
                    str(self.rate),
                    "-d",
                    str(max(1, round(seconds))),
                    "-f",
                    "raw",
                    "--nonblocking",
                    "--idle",
                    "--threads",
                    "-o",
                    str(out),
                ]
                process = subprocess.Popen(
                    command + (["--gil"] if gil else []),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                runs.append((process, out))
            stacks = []
            for process, out in runs:
                _, stderr = process.communicate(timeout=seconds + 60)
                if process.returncode != 0 or not out.exists():
                    raise RuntimeError(f"py-spy failed: {stderr.strip()[-500:]}")
                stacks.append([_split(line) for line in out.read_text().splitlines() if line])
        return stacks[0], stacks[1]


def _split(line: str) -> tuple[str, int]:
    """A raw py-spy line, ``thread (TID): NAME;frame;...;frame COUNT``, as ``(NAME;..., COUNT)``."""
    stack, count = line.rsplit(" ", 1)
    return stack.split(": ", 1)[-1], int(count)


def spied(
    spy: PySpy, work: Callable[[], int], seconds: float, parts: Sequence[tuple[str, str]] = ()
) -> dict[str, Any]:
    """py-spy while ``work`` runs: the fraction of the sampling instants at which a thread of
    this process held the GIL, that time per image, and for each ``(name, frame)`` of ``parts``
    the fraction of the worker's samples inside that frame in which it held the GIL (two
    sample sets over the same seconds: capped at 1)."""
    (every, gil), wall, images = in_background(work, lambda: spy.sample(seconds))
    instants = sum(n for stack, n in every if stack.startswith(WORKER + ";"))
    held = sum(n for _, n in gil) / max(instants, 1)
    result: dict[str, Any] = {
        "held_fraction": held,
        "samples": instants,
        "held_ms_per_image": 1e3 * held * wall / images,
        "ms_per_image": 1e3 * wall / images,
    }
    if parts:
        by_step = {}
        for name, frame in parts:
            inside = sum(n for s, n in every if s.startswith(WORKER + ";") and f";{frame} (" in s)
            holding = sum(n for s, n in gil if s.startswith(WORKER + ";") and f";{frame} (" in s)
            by_step[name] = min(holding / inside, 1.0) if inside else None
        result["held_fraction_by_step"] = by_step
    return result


def synthetic(hold_us: float, free_us: float) -> tuple[Callable[[], int], float]:
    """A workload of known GIL fraction: ``hold_us`` of a pure-Python loop, then ``hashlib``
    on a buffer for about ``free_us`` (it releases the GIL); and that fraction, timed."""
    buffer = bytes(1 << 20)
    start = time.perf_counter()
    for _ in range(5):
        hashlib.sha256(buffer).digest()
    per_byte = (time.perf_counter() - start) / 5 / len(buffer)
    chunk = buffer[: min(len(buffer), max(4096, int(free_us * 1e-6 / per_byte)))]

    def hold() -> None:
        end = time.perf_counter() + hold_us * 1e-6
        while time.perf_counter() < end:
            pass

    def free() -> None:
        hashlib.sha256(chunk).digest()

    def median_s(function: Callable[[], None]) -> float:
        times = []
        for _ in range(200):
            start = time.perf_counter()
            function()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    held, released = median_s(hold), median_s(free)

    def work() -> int:
        hold()
        free()
        return 1

    return work, held / (held + released)


def calibration(spy: PySpy | None, seconds: float) -> dict[str, Any]:
    """The probe's and py-spy's readings on :func:`synthetic` workloads."""
    rows = []
    for hold_us, free_us in ((20, 180), (100, 400)):
        work, truth = synthetic(hold_us, free_us)
        row = {
            "workload": f"{hold_us} us Python + {free_us} us hashlib",
            "true_fraction": truth,
            "probe": probe(work, seconds)["held_fraction"],
        }
        row["py_spy"] = spied(spy, work, seconds)["held_fraction"] if spy else None
        rows.append(row)
    return {"rows": rows}


# --- pools ----------------------------------------------------------------------------------


def throughput(pools: Pools, files: Sequence[bytes], rounds: int) -> dict[str, Any]:
    """Images per second of each pool and this process's CPU ms per image (for a process pool,
    the parent's share only), in interleaved rounds; each round's ratio against 1 thread."""
    rates: dict[str, list[float]] = {name: [] for name in POOLS}
    cpu: dict[str, list[float]] = {name: [] for name in POOLS}
    for _ in range(rounds):
        for name in POOLS:
            start, start_cpu = time.perf_counter(), time.process_time()
            pools.run(name, files)
            rates[name].append(len(files) / (time.perf_counter() - start))
            cpu[name].append(1e3 * (time.process_time() - start_cpu) / len(files))
    rows = {}
    for name in POOLS:
        ratios = [v / one for v, one in zip(rates[name], rates["threads x1"], strict=True)]
        rows[name] = {
            "images_per_second": statistics.median(rates[name]),
            "by_round": rates[name],
            "ratio_to_one_thread": statistics.median(ratios),
            "ratio_by_round": ratios,
            "process_cpu_ms_per_image": statistics.median(cpu[name]),
        }
    return rows


# --- one preprocessing, and the model -------------------------------------------------------


def amdahl(serial: float, cores: int = CORES) -> float:
    """``1 / (s + (1 - s) / n)``: the speedup on ``n`` cores of work whose fraction s is
    serial."""
    serial = min(max(serial, 0.0), 1.0)
    return 1.0 / (serial + (1.0 - serial) / cores)


def case(
    name: str,
    spec: Preprocessing,
    files: Sequence[bytes],
    spy: PySpy | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    pre = Preprocessor(spec, MAX_PIXELS)
    steps = Steps(pre)
    log(f"{name}: steps")
    times = step_times(pre, files, args.repeats)
    index = 0

    def one_image(function: Callable[[bytes], Any]) -> Callable[[], int]:
        def work() -> int:
            nonlocal index
            index += 1
            function(files[index % len(files)])
            return 1

        return work

    log(f"{name}: GIL probe")
    probed = probe(one_image(pre), args.sample_s)
    spy_threads = None
    if spy is not None:
        log(f"{name}: py-spy on the steps")
        parts = list(
            zip(Steps.NAMES, [f"Steps.{f.__name__}" for f in steps.functions()], strict=True)
        )
        spy_threads = spied(spy, one_image(steps), args.sample_s, parts)
    log(f"{name}: pools, {args.rounds} interleaved rounds")
    pools = Pools.start(pre, POOLS, files)
    try:
        batch = list(files) * max(1, args.images // len(files))
        pools_rows = throughput(pools, batch, args.rounds)
        spy_parent = None
        if spy is not None:
            log(f"{name}: py-spy on the process pool's parent")

            def through_one_process() -> int:
                return len(pools.run("processes x1", files))

            spy_parent = spied(spy, through_one_process, args.sample_s)
    finally:
        pools.close()

    one_thread = pools_rows["threads x1"]["images_per_second"]
    one_process = pools_rows["processes x1"]["images_per_second"]
    scaling = min(max(2.0 / pools_rows["threads x2"]["ratio_to_one_thread"] - 1.0, 0.0), 1.0)
    estimates = {"probe": probed["held_fraction"], "2-thread scaling": scaling}
    if spy_threads is not None:
        estimates["py-spy"] = spy_threads["held_fraction"]
    if spy_parent is not None:
        parent_ms, parent_how = spy_parent["held_ms_per_image"], "parent's GIL time (py-spy)"
    else:
        parent_ms = pools_rows["processes x1"]["process_cpu_ms_per_image"]
        parent_how = "parent's CPU time"
    model = {
        f"threads, s from {how}": {
            "serial": s,
            "speedup": amdahl(s),
            "images_per_second": one_thread * amdahl(s),
        }
        for how, s in estimates.items()
    }
    # a fraction, as the model reads it: on a busy machine the parent's time per image can
    # exceed the image's own measured time (both are samples), which amdahl() would clamp
    # while the record kept the unclamped value
    process_serial = min(parent_ms / times["whole_ms"], 1.0)
    model[f"process pool, s = {parent_how} / image time"] = {
        "serial": process_serial,
        "speedup": amdahl(process_serial),
        "images_per_second": one_process * amdahl(process_serial),
    }
    return {
        "name": name,
        "preprocessing": spec.model_dump(),
        "steps": times,
        "probe": probed,
        "py_spy": spy_threads,
        "py_spy_process_parent": spy_parent,
        "pools": pools_rows,
        "gil_held_fraction": estimates,
        "model": model,
    }


# --- output ---------------------------------------------------------------------------------


def print_case(result: dict[str, Any]) -> None:
    times, spy = result["steps"], result["py_spy"]
    fractions = spy["held_fraction_by_step"] if spy else dict.fromkeys(Steps.NAMES)
    print(f"\n### {result['name']}\n")
    rows = []
    for name in Steps.NAMES:
        ms, fraction = times["step_ms"][name], fractions[name]
        rows.append(
            [
                name,
                f"{ms:.3f}",
                report.percent(fraction),
                "-" if fraction is None else f"{1e3 * fraction * ms:.0f}",
            ]
        )
    if spy:
        held = sum(f * times["step_ms"][n] for n, f in fractions.items() if f is not None)
        total = [report.percent(held / times["sum_ms"]), f"{1e3 * held:.0f}"]
    rows.append(["all steps", f"{times['sum_ms']:.3f}", *(total if spy else ["-", "-"])])
    rows.append(["Preprocessor", f"{times['whole_ms']:.3f}", "-", "-"])
    print(
        report.markdown_table(
            ["step (1 thread)", "ms per image", "GIL held (py-spy)", "GIL held us"], rows
        )
    )
    rows = [[how, f"{100 * s:.1f} %"] for how, s in result["gil_held_fraction"].items()]
    print(
        "\n"
        + report.markdown_table(["GIL held, measured by", "fraction of one thread's time"], rows)
        + "\n"
    )
    rows = []
    for name, row in result["pools"].items():
        by_round = ", ".join(f"{r:.2f}" for r in row["ratio_by_round"])
        rows.append(
            [
                name,
                f"{row['images_per_second']:.0f}",
                f"{row['ratio_to_one_thread']:.2f}",
                by_round,
                f"{row['process_cpu_ms_per_image']:.3f}",
            ]
        )
    print(
        report.markdown_table(
            ["pool", "img/s", "/ 1 thread", "/ 1 thread by round", "this process's CPU ms/img"],
            rows,
        )
    )
    rows = [
        [how, f"{m['serial']:.3f}", f"{m['speedup']:.1f}", f"{m['images_per_second']:,.0f}"]
        for how, m in result["model"].items()
    ]
    print(f"\nA model, not a measurement: Amdahl's law on {CORES} cores\n")
    print(
        report.markdown_table(["model", "serial fraction s", f"speedup on {CORES}", "img/s"], rows)
    )


def print_calibration(result: dict[str, Any]) -> None:
    rows = [
        [
            r["workload"],
            report.percent(r["true_fraction"]),
            report.percent(r["probe"]),
            report.percent(r["py_spy"]),
        ]
        for r in result["rows"]
    ]
    print("\n### Calibration: workloads of known GIL fraction\n")
    print(report.markdown_table(["workload", "GIL held (timed)", "probe", "py-spy"], rows))


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200, help="images per pool and round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--repeats", type=int, default=5, help="passes over the images (steps)")
    parser.add_argument(
        "--sample-s", type=float, default=3.0, help="seconds of each GIL measurement"
    )
    parser.add_argument("--no-py-spy", action="store_true", help="even when it is installed")
    parser.add_argument("--quick", action="store_true", help="fewer images, rounds and samples")
    parser.add_argument("--json", type=Path, default=RESULTS / "decode.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.rounds, args.repeats, args.sample_s = 20, 1, 1, 0.5
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    load = os.getloadavg()[0]
    spy = None if args.no_py_spy else PySpy.find()
    files = jpegs(20)
    cases = [
        ("shipped model (L, resize 28, crop 28)", shipped_preprocessing()),
        ("ImageNet-style (RGB, resize 256, crop 224)", IMAGENET),
    ]
    log("calibration")
    result: dict[str, Any] = {
        "machine": report.machine(pillow=PIL.__version__, numpy=np.__version__),
        "images": "640x480 JPEG, Fashion-MNIST test images scaled up",
        "jpeg_bytes_mean": statistics.mean(map(len, files)),
        "py_spy": spy.executable if spy else None,
        "calibration": calibration(spy, args.sample_s),
        "cases": [case(name, spec, files, spy, args) for name, spec in cases],
    }
    print_calibration(result["calibration"])
    for measured in result["cases"]:
        print_case(measured)
    result["load_average_before_after"] = [load, os.getloadavg()[0]]  # neighbours' CPU use
    report.save(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
