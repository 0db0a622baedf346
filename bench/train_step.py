"""What a second-order head costs in a training step: SMSO against the first-order head.

Trains ResNet-50 (random weights, synthetic images and labels) for ``--steps`` steps with the
production settings (SGD with momentum, mixed precision on a GPU with the head in float32,
channels-last) once with the SMSO head (p = 2,048, the paper's 1x1 conv to c = 256 + BatchNorm)
and once with the first-order head (global average pooling, 2,048-d), and reports images per
second and the SMSO step's extra cost, ``1 - ips(SMSO) / ips(first-order)``. The expectation
to check on a GPU: under 5 %.

    python -m bench.train_step                         # GPU: 448 px, batch 32, 5 x 100 steps, AMP
    python -m bench.train_step --device cpu --size 64 --batch 4 --steps 3 --rounds 1  # smoke
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.lib import torch_device  # before torch (see bench/heads.py)

# isort: split
import torch
import torch.nn.functional as F

from bench.lib import RESULTS, report
from bench.lib.load import interleave
from training.model import ModelConfig, build_model

log = logging.getLogger("bench.train_step")

HEADS: dict[str, dict[str, Any]] = {
    "smso p=2048": {"head": "smso", "head_options": {"dim": 2048}, "reduce_dim": 256},
    "first-order": {"head": "gap", "reduce_dim": None},
}


class Trainer:
    """One model, its optimiser and a fixed synthetic batch; ``time(steps)`` -> seconds."""

    def __init__(
        self, name: str, device: torch.device, args: argparse.Namespace, amp: torch.dtype | None
    ) -> None:
        torch.manual_seed(0)
        config = ModelConfig(num_classes=args.classes, backbone=args.backbone, **HEADS[name])
        self.name = name
        self.model = build_model(config).to(device).to(memory_format=torch.channels_last).train()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
        images = torch.randn(args.batch, 3, args.size, args.size, device=device)
        self.images = images.contiguous(memory_format=torch.channels_last)
        self.labels = torch.randint(args.classes, (args.batch,), device=device)
        self.device, self.amp = device, amp

    def step(self) -> None:
        amp = self.amp
        with torch.autocast(self.device.type, dtype=amp or torch.float32, enabled=amp is not None):
            logits, _ = self.model(self.images)
        loss = F.cross_entropy(logits.float(), self.labels)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def time(self, steps: int) -> float:
        torch_device.synchronize(self.device)
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        torch_device.synchronize(self.device)
        return time.perf_counter() - start


def measure(
    device: torch.device, args: argparse.Namespace, amp: torch.dtype | None
) -> list[dict[str, Any]]:
    """Images per second of each head: the median of ``args.rounds`` rounds of ``args.steps``
    steps, the heads taking turns within each round (so warm-up, clocks and neighbours' load
    fall on both alike), after ``args.warmup`` steps each."""
    trainers = [Trainer(name, device, args, amp) for name in HEADS]
    for trainer in trainers:
        log.info("warming up %s", trainer.name)
        trainer.time(args.warmup)
    log.info("%d rounds", args.rounds)
    turns = {t.name: functools.partial(t.time, args.steps) for t in trainers}
    seconds = interleave(turns, args.rounds, alternate=True)
    results = []
    for trainer in trainers:
        median = statistics.median(seconds[trainer.name])
        results.append(
            {
                "head": trainer.name,
                "images_per_second": args.batch * args.steps / median,
                "step_ms": 1000 * median / args.steps,
                "embedding_dim": trainer.model.embedding_dim,
                "round_seconds": seconds[trainer.name],
            }
        )
    return results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ...")
    parser.add_argument("--backbone", default="resnet50")
    parser.add_argument("--size", type=int, default=448, help="input side in pixels")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=100, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--classes", type=int, default=47)
    parser.add_argument("--amp", choices=("auto", "bf16", "fp16", "off"), default="auto")
    parser.add_argument("--json", type=Path, default=RESULTS / "train_step.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    device = torch_device.resolve_device(args.device)
    if args.amp == "off" or (args.amp == "auto" and device.type != "cuda"):
        amp = None
    elif args.amp == "auto":
        amp = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    else:
        amp = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.amp]
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input size: let cuDNN pick its kernels
    results = measure(device, args, amp)
    smso, first = results
    overhead = 1 - smso["images_per_second"] / first["images_per_second"]
    rows = [
        [
            r["head"],
            f"{r['embedding_dim']:,}",
            f"{r['images_per_second']:.1f}",
            report.format_ms(r["step_ms"]),
        ]
        for r in results
    ]
    print(report.markdown_table(["head", "embedding", "images/s", "step ms"], rows))
    print(
        f"\n{args.backbone} at {args.size} px, batch {args.batch}, median of {args.rounds} "
        f"rounds of {args.steps} steps, "
        f"AMP {amp}: the SMSO head costs {100 * overhead:.1f} % of the step "
        f"(expectation on a GPU: under 5 %)"
    )
    payload = {
        "machine": torch_device.machine_info(device),
        "settings": vars(args),
        "amp": str(amp),
        "results": results,
        "smso_overhead": overhead,
    }
    report.save(args.json, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
