"""Every GPU measurement in one command, on any CUDA machine with the development environment.

``make bench-gpu`` installs that environment (``make install``: torch, the ``serving`` extra's
onnxruntime-gpu and nvImageCodec) and runs this; the results go under ``--out``
(``bench/results/gpu/`` unless told), each step's output also to ``OUT/STEP.log``. The steps,
each a process of its own (one that fails is reported, and the next one runs):

* ``train-step``: ``bench.train_step`` with ``--amp bf16`` and ``--amp fp16`` (ResNet-50 at
  448 px, SMSO p = 2,048 against the first-order head): ``OUT/train_step_{bf16,fp16}.json``;
* ``cuda-tests``: the CUDA tests, ``pytest -m cuda`` (autocast keeps the head in float32, AMP
  steps, the CUDA runners and the service's GPU JPEG decoding);
* ``decode``: ``bench.decode_gpu --device cuda`` (JPEG decoding on the GPU against Pillow, and
  the service's own path): ``OUT/decode_gpu.json``;
* ``serve``: ``bench.serve_gpu`` (the raw session, the profile, the server under load; about 6
  minutes): ``OUT/serve/``;
* ``embed``: ``bench.embed`` on the GPU (the embedded engine's one CUDA session and its decode
  threads against the loop on the same session, the shipped model on 10,000 PNGs and ResNet-50
  SMSO on 2,000 JPEGs; each stage's time in the summaries): ``OUT/embed.json``;
* ``fmnist-table``, only when named: the Fashion-MNIST head comparison (``smso-experiment run
  fmnist``, every row, seeds 0-2) on the GPU, ``--jobs`` runs at a time with one CPU thread
  each, in float32; resumable (the runs stay in ``--runs``), the table in
  ``OUT/fmnist-table.md``. 40 to 60 minutes on 16 cores, estimated.

    python -m bench.gpu                                 # train-step ... serve, embed
    python -m bench.gpu serve decode --out /tmp/gpu     # some steps
    python -m bench.gpu fmnist-table                    # the head table (Fashion-MNIST's files)
    python -m bench.gpu --dry-run                       # the commands, run nothing
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.lib import RESULTS, ROOT

#: Debian's Fashion-MNIST (``make data``)
FMNIST = Path("/usr/share/datasets/fashion-mnist")


@dataclass(frozen=True)
class Step:
    """One step: the commands it runs in turn, from the repository's root."""

    name: str
    commands: list[list[str]]
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment


def python(*args: str) -> list[str]:
    """``python -m ARGS`` with this interpreter."""
    return [sys.executable, "-m", *args]


#: every step; those of :data:`DEFAULT` run when none is named, in this order
STEPS = ("train-step", "cuda-tests", "decode", "serve", "embed", "fmnist-table")
DEFAULT = STEPS[:-1]
#: the head table's runs on the GPU: float32, one CPU thread each (their share of the cores)
FMNIST_RUN = "--seeds 0 1 2 --resume --device cuda --amp off --no-channels-last --workers 0"


def steps(args: argparse.Namespace) -> dict[str, Step]:
    """Every step, by name, for ``args``' folders and settings."""
    out: Path = args.out
    runs = str(args.runs)
    experiment = python("training.experiment_cli")
    table = [*experiment, "run", "fmnist", *FMNIST_RUN.split(), "--out", runs]
    table += ["--data-root", str(args.data_root), "--jobs", str(args.jobs)]
    return {
        "train-step": Step(
            "train-step",
            [
                python("bench.train_step", "--amp", amp, "--json", f"{out}/train_step_{amp}.json")
                for amp in ("bf16", "fp16")
            ],
        ),
        "cuda-tests": Step(
            "cuda-tests", [python("pytest", "-m", "cuda", "-p", "no:cacheprovider")]
        ),
        "decode": Step(
            "decode",
            [python("bench.decode_gpu", "--device", "cuda", "--json", f"{out}/decode_gpu.json")],
        ),
        "serve": Step("serve", [python("bench.serve_gpu", "--out", f"{out}/serve")]),
        "embed": Step(
            "embed",
            [
                python(
                    "bench.embed",
                    *("--only", "speed", "--rounds", "1"),
                    *("--engines", "embedded", "--out", f"{out}/embed.json"),
                ),
                python(
                    "bench.embed",
                    *("--only", "resnet", "--resnet-images", "2000"),
                    *("--out", f"{out}/embed_resnet.json"),
                ),
            ],
        ),
        "fmnist-table": Step(
            "fmnist-table",
            [table, [*experiment, "report", "fmnist", "--out", runs]],
            # a small CNN's step at 28 px is bound by its process: a progress line every 30 s
            env={"TQDM_MININTERVAL": "30"},
        ),
    }


def run_step(step: Step, out: Path) -> int:
    """Run ``step``'s commands in turn (stopping at the first that fails), their output on the
    terminal and in ``OUT/STEP.log`` (the report's table, for ``fmnist-table``, in
    ``OUT/fmnist-table.md``); the last exit status."""
    env = os.environ | {"PYTHONUNBUFFERED": "1"} | step.env
    log = out / f"{step.name}.log"
    code, lines = 0, list[str]()
    with log.open("w") as sink:
        for command in step.commands:
            print(f"$ {' '.join(command)}", flush=True)
            lines = []
            with subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            ) as process:
                for line in process.stdout or []:
                    print(line, end="", flush=True)
                    sink.write(line)
                    lines.append(line)
            code = process.returncode
            if code != 0:
                return code
    if step.name == "fmnist-table":
        (out / "fmnist-table.md").write_text("".join(lines))
    return code


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="*", metavar="STEP", help=f"of {', '.join(STEPS)}")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu", help="the results' folder")
    parser.add_argument(
        "--data-root", type=Path, default=FMNIST, help="fmnist-table: Fashion-MNIST's folder"
    )
    parser.add_argument(
        "--runs", type=Path, default=ROOT / "runs" / "fmnist-table-gpu", help="fmnist-table: runs"
    )
    cores = os.cpu_count() or 1
    parser.add_argument(
        "--jobs",
        type=int,
        default=max(1, cores - 2),
        help="fmnist-table: runs at a time (default: the cores but two)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    unknown = [name for name in args.steps if name not in STEPS]
    if unknown:
        parser.error(f"no step {', '.join(unknown)}; the steps: {', '.join(STEPS)}")
    args.steps = args.steps or list(DEFAULT)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the steps asked for, in the order named; 1 if any failed, 2 without an NVIDIA driver
    (or, for ``fmnist-table``, without Fashion-MNIST's files)."""
    args = parse_args(argv)
    chosen = [steps(args)[name] for name in dict.fromkeys(args.steps)]
    if args.dry_run:
        for step in chosen:
            for command in step.commands:
                print(f"{step.name}: {' '.join(command)}")
        return 0
    if shutil.which("nvidia-smi") is None:
        print("bench.gpu needs a CUDA machine: no nvidia-smi on PATH", file=sys.stderr)
        return 2
    if "fmnist-table" in args.steps and not args.data_root.is_dir():
        print(f"no Fashion-MNIST in {args.data_root}: `make data`, or --data-root", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["nvidia-smi", "-L"], check=False)
    ended, failed = [], []
    for step in chosen:
        start = time.monotonic()
        code = run_step(step, args.out)
        how = "ok" if code == 0 else f"exit status {code}"
        ended.append(f"{step.name}: {how}, {time.monotonic() - start:.0f} s")
        failed += [step.name] if code else []
    print("\n" + "\n".join(ended) + f"\nResults in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
