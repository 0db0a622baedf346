"""What a second-order head costs in a training step: SMSO against the first-order head.

Trains ResNet-50 (random weights, synthetic images and labels) for ``--steps`` steps with the
production settings (SGD with momentum, mixed precision on a GPU with the head in float32,
channels-last) once with the SMSO head (p = 2,048, the paper's 1x1 conv to c = 256 + BatchNorm)
and once with the first-order head (global average pooling, 2,048-d), and reports images per
second and the SMSO step's extra cost, ``1 - ips(SMSO) / ips(first-order)``. The expectation
to check on a GPU: under 5 %.

    python bench/train_step.py                         # GPU: 448 px, batch 32, 200 steps, AMP
    python bench/train_step.py --device cpu --size 64 --batch 4 --steps 3   # a smoke run
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__:
    from . import benchlib
else:  # run as a script: bench/ is on sys.path
    import benchlib

import torch
import torch.nn.functional as F

from training.model import ModelConfig, build_model

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "bench" / "results" / "train_step.json"
log = logging.getLogger("bench.train_step")

HEADS = {
    "smso p=2048": {"head": "smso", "head_options": {"dim": 2048}, "reduce_dim": 256},
    "first-order": {"head": "gap", "reduce_dim": None},
}


def measure(
    name: str, device: torch.device, args: argparse.Namespace, amp: torch.dtype | None
) -> dict[str, Any]:
    """Images per second of ``args.steps`` timed training steps after ``args.warmup`` steps."""
    torch.manual_seed(0)
    config = ModelConfig(num_classes=args.classes, backbone=args.backbone, **HEADS[name])
    model = build_model(config).to(device).to(memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
    images = torch.randn(args.batch, 3, args.size, args.size, device=device)
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(args.classes, (args.batch,), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            logits, _ = model(images)
        loss = F.cross_entropy(logits.float(), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    for _ in range(args.warmup):
        step()
    benchlib.synchronize(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    benchlib.synchronize(device)
    seconds = time.perf_counter() - start
    return {
        "head": name, "images_per_second": args.batch * args.steps / seconds,
        "step_ms": 1000 * seconds / args.steps, "embedding_dim": model.embedding_dim,
    }  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ...")
    parser.add_argument("--backbone", default="resnet50")
    parser.add_argument("--size", type=int, default=448, help="input side in pixels")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--classes", type=int, default=47)
    parser.add_argument("--amp", choices=("auto", "bf16", "fp16", "off"), default="auto")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    device = benchlib.resolve_device(args.device)
    if args.amp == "off" or (args.amp == "auto" and device.type != "cuda"):
        amp = None
    elif args.amp == "auto":
        amp = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    else:
        amp = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.amp]
    results = []
    for name in HEADS:
        log.info("measuring %s", name)
        results.append(measure(name, device, args, amp))
    smso, first = results
    overhead = 1 - smso["images_per_second"] / first["images_per_second"]
    rows = [
        [r["head"], f"{r['embedding_dim']:,}", f"{r['images_per_second']:.1f}",
         benchlib.format_ms(r["step_ms"])]
        for r in results
    ]  # fmt: skip
    print(benchlib.markdown_table(["head", "embedding", "images/s", "step ms"], rows))
    print(f"\n{args.backbone} at {args.size} px, batch {args.batch}, {args.steps} steps, "
          f"AMP {amp}: the SMSO head costs {100 * overhead:.1f} % of the step "
          f"(expectation on a GPU: under 5 %)")  # fmt: skip
    payload = {
        "machine": benchlib.machine_info(device), "settings": vars(args) | {"json": str(args.json)},
        "amp": str(amp), "results": results, "smso_overhead": overhead,
    }  # fmt: skip
    benchlib.write_json(args.json, payload)
    print(f"Results written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
