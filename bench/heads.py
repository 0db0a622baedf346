"""Benchmark every registered pooling head at the paper's settings.

For each head in ``training.heads.HEADS`` (batch 8, float32) at ``n = 196`` (14x14) and
``n = 784`` (28x28) positions, with ``c = HEADS[name].paper_channels`` input channels (256 where
the registry gives None, i.e. for ``gap``), this measures:

* forward time: eval mode under ``torch.no_grad()``, median wall time of one call;
* forward+backward time: train mode, input with ``requires_grad``, ``output.sum().backward()``
  (parameter and input gradients cleared before each call), median wall time;
* peak memory of one forward+backward: the peak of live tensor bytes above what was resident
  before the call (the input and the head's parameters and buffers). On CPU it is read from the
  allocator events that ``torch.profiler.profile(profile_memory=True)`` records (allocations and
  frees, summed in time order); on CUDA it is ``torch.cuda.max_memory_allocated`` minus
  ``torch.cuda.memory_allocated`` before the call. Library-internal workspaces that bypass
  PyTorch's allocator (oneDNN/MKL scratch, FFT plans) are not counted on CPU;
* the output dimension (``head.output_dim``) and the number of trainable parameters.

SMSO is measured for ``p = 64`` and ``p = 2048`` in both of its forms (``"conv"``: 1x1 conv + l2
pool, and ``"covariance"``); LRBP gets ``num_classes = 67`` (MIT-Indoor). Each timing starts with
one or two warm-up calls; the number of timed calls adapts to the cost of one call (up to
``--repeats``, about ``--budget`` seconds per measurement, 1-3 calls when one call takes over 1 s).

After the markdown table the script evaluates, from the measured numbers, two claims: (1) SMSO
p=64 is at least 5x faster than MPN and than BP; (2) the conv form is cheaper than the
covariance form exactly where ``p (n - c) < n c`` (the cost model of ``docs/smso.md``).
Everything, with the machine and the settings, is written as JSON to
``bench/results/heads.json``.

Run from the repository root::

    python -m bench.heads                  # full run, CPU (a few minutes on 2 cores)
    python -m bench.heads --quick          # smoke test: n = 196 only, few repeats
    python -m bench.heads --device cuda    # on a GPU
    python -m bench.heads --heads smso mpn bp --sides 28 --threads 2 --json /tmp/heads.json
"""

from __future__ import annotations

import argparse
import gc
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# torch_device must come before torch: it sets KINETO_LOG_LEVEL, which torch reads when it is
# loaded, to keep the profiler quiet
from bench.lib import torch_device

# isort: split
import torch
from torch import Tensor, nn

from bench.lib import RESULTS, report
from bench.lib.timing import TimingPolicy, measure_time
from training.heads import HEADS, create_head

log = logging.getLogger("bench.heads")

BATCH = 8
DEFAULT_CHANNELS = 256  # c for heads the registry leaves at the backbone's width (gap)
SIDES = (14, 28)  # n = 196 and n = 784
#: Sizes (option ``dim``) measured per head; a head not listed runs at its default size.
DIMS: dict[str, tuple[int, ...]] = {"smso": (64, 2048)}
NUM_CLASSES = 67  # K for heads that score the classes themselves (LRBP): MIT-Indoor's
SPEEDUP_CLAIM = 5.0  # check 1: SMSO p=64 at least this much faster than MPN and BP
REFERENCE = ("smso", "conv", 64)  # the row the ratio column divides by
MEMORY_OF = "one fwd+bwd"  # what the memory column measures, for torch_device.memory_note


@dataclass(frozen=True)
class Config:
    """One head at one setting."""

    head: str
    channels: int  # c
    side: int  # h = w
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def positions(self) -> int:
        """``n = h * w``."""
        return self.side * self.side

    @property
    def form(self) -> str:
        """SMSO's form, ``"-"`` for the other heads."""
        return str(self.options.get("form", "-"))

    @property
    def dim(self) -> int | None:
        """The size option ``dim`` where it was set (SMSO's ``p``), else None."""
        return self.options.get("dim")

    def label(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.head}({extra}) c={self.channels} n={self.positions}"


@dataclass(frozen=True)
class Result:
    """The measurements of one configuration (one table row)."""

    head: str
    form: str
    channels: int
    positions: int
    setting: str  # "p=64", "d=8192", "K=67" or "-"
    options: dict[str, Any]
    output_dim: int
    trainable_params: int
    forward_ms: float
    forward_repeats: int
    train_ms: float
    train_repeats: int
    memory_mib: float


def configs(head_names: Sequence[str], sides: Sequence[int]) -> list[Config]:
    """Every head at every side, in registry order: each size of ``DIMS`` in each of its forms."""
    out: list[Config] = []
    for side in sides:
        for name in head_names:
            spec = HEADS[name]
            channels = spec.paper_channels or DEFAULT_CHANNELS
            base = {"num_classes": NUM_CLASSES} if spec.needs_num_classes else {}
            sizes = [{"dim": dim} for dim in DIMS.get(name, ())] or [{}]
            forms = [{"form": form} for form in spec.forms] or [{}]
            out += [
                Config(name, channels, side, {**base, **size, **form})
                for size in sizes
                for form in forms
            ]
    return out


def setting_label(config: Config, head: nn.Module) -> str:
    """The head's size knob for the table: SMSO's p, CBP's d, the classes a classifier scores."""
    spec = HEADS[config.head]
    if spec.scores_classes:
        return f"K={head.output_dim}"
    if spec.size_symbol is not None:
        return f"{spec.size_symbol}={head.output_dim}"
    return "-"


def trainable_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def clear_grads(head: nn.Module, x: Tensor) -> None:
    head.zero_grad(set_to_none=True)
    x.grad = None


def measure(config: Config, device: torch.device, policy: TimingPolicy) -> Result:
    """Build the head for ``config`` and take all its measurements."""
    torch.manual_seed(0)
    head = create_head(config.head, config.channels, **config.options).to(device)
    shape = (BATCH, config.channels, config.side, config.side)
    x_eval = torch.randn(shape, device=device)
    x_train = x_eval.clone().requires_grad_(True)

    def forward() -> None:
        with torch.no_grad():
            head(x_eval)

    def forward_backward() -> None:
        head(x_train).sum().backward()

    def train_step() -> None:
        clear_grads(head, x_train)
        forward_backward()

    sync = torch_device.synchronizer(device)
    head.eval()
    fwd = measure_time(forward, policy, sync)
    head.train()
    train = measure_time(train_step, policy, sync)

    clear_grads(head, x_train)
    gc.collect()
    peak = torch_device.peak_bytes(forward_backward, device)

    return Result(
        head=config.head,
        form=config.form,
        channels=config.channels,
        positions=config.positions,
        setting=setting_label(config, head),
        options=dict(config.options),
        output_dim=int(head.output_dim),
        trainable_params=trainable_parameters(head),
        forward_ms=fwd.median_ms,
        forward_repeats=fwd.repeats,
        train_ms=train.median_ms,
        train_repeats=train.repeats,
        memory_mib=peak / torch_device.MIB,
    )


def reference_row(results: Sequence[Result], positions: int) -> Result | None:
    """The SMSO p=64 conv-form row at ``positions``, the ratio column's denominator."""
    head, form, dim = REFERENCE
    return find(results, head, positions, form=form, dim=dim)


def find(
    results: Sequence[Result], head: str, positions: int, form: str = "-", dim: int | None = None
) -> Result | None:
    for r in results:
        if (r.head, r.positions, r.form) == (head, positions, form) and (
            dim is None or r.options.get("dim") == dim
        ):
            return r
    return None


def results_table(results: Sequence[Result], device: torch.device) -> str:
    header = [
        "head",
        "form",
        "c",
        "n",
        "p/d",
        "output dim",
        "trainable params",
        "forward ms",
        "fwd+bwd ms",
        "memory MiB",
        "fwd+bwd / SMSO p=64 conv",
    ]
    rows = []
    for r in results:
        ref = reference_row(results, r.positions)
        ratio = None if ref is None else r.train_ms / ref.train_ms
        rows.append(
            [
                r.head,
                r.form,
                str(r.channels),
                str(r.positions),
                r.setting,
                f"{r.output_dim:,}",
                f"{r.trainable_params:,}",
                report.format_ms(r.forward_ms),
                report.format_ms(r.train_ms),
                f"{r.memory_mib:,.1f}",
                report.format_ratio(ratio),
            ]
        )
    note = (
        f"memory MiB: {torch_device.memory_note(device, MEMORY_OF)}; "
        f"times: median wall time of one call, batch {BATCH}"
    )
    return f"{report.markdown_table(header, rows)}\n\n{note}"


def speedup_check(results: Sequence[Result]) -> dict[str, Any]:
    """Check 1: SMSO p=64 (conv form) at least 5x faster than MPN and than BP, per n."""
    per_n: list[dict[str, Any]] = []
    for positions in sorted({r.positions for r in results}):
        smso = reference_row(results, positions)
        if smso is None:
            continue
        for name in ("mpn", "bp"):
            other = find(results, name, positions)
            if other is None:
                continue
            fwd = other.forward_ms / smso.forward_ms
            train = other.train_ms / smso.train_ms
            per_n.append(
                {
                    "n": positions,
                    "baseline": name,
                    "forward_ratio": fwd,
                    "fwd_bwd_ratio": train,
                    "holds": fwd >= SPEEDUP_CLAIM and train >= SPEEDUP_CLAIM,
                }
            )
    verdict = None if not per_n else all(row["holds"] for row in per_n)
    return {
        "claim": f"SMSO p=64 at least {SPEEDUP_CLAIM:g}x faster than MPN and than BP",
        "rows": per_n,
        "confirmed": verdict,
    }


def form_check(results: Sequence[Result]) -> dict[str, Any]:
    """Check 2: the conv form is cheaper than the covariance form exactly where p(n-c) < nc."""
    rows: list[dict[str, Any]] = []
    for r in results:
        if r.form != "conv":
            continue
        p, n, c = r.options["dim"], r.positions, r.channels
        cov = find(results, r.head, n, form="covariance", dim=p)
        if cov is None:
            continue
        predicted = "conv" if p * (n - c) < n * c else "covariance"
        measured = "conv" if r.forward_ms < cov.forward_ms else "covariance"
        measured_train = "conv" if r.train_ms < cov.train_ms else "covariance"
        rows.append(
            {
                "n": n,
                "p": p,
                "c": c,
                "p(n-c)": p * (n - c),
                "nc": n * c,
                "predicted": predicted,
                "conv_forward_ms": r.forward_ms,
                "covariance_forward_ms": cov.forward_ms,
                "measured_forward": measured,
                "conv_fwd_bwd_ms": r.train_ms,
                "covariance_fwd_bwd_ms": cov.train_ms,
                "measured_fwd_bwd": measured_train,
                "agree": predicted == measured,
            }
        )
    verdict = None if not rows else all(row["agree"] for row in rows)
    return {
        "claim": "conv form cheaper than covariance form exactly where p(n-c) < nc",
        "rows": rows,
        "confirmed": verdict,
    }


def verdict_word(verdict: bool | None) -> str:
    return {True: "confirmed", False: "refuted", None: "not measured"}[verdict]


def speedup_report(check: dict[str, Any]) -> str:
    lines = [f"Check 1: {check['claim']}"]
    for row in check["rows"]:
        lines.append(
            f"- n={row['n']}: {row['baseline'].upper()} / SMSO p=64: "
            f"forward {row['forward_ratio']:.1f}x, fwd+bwd {row['fwd_bwd_ratio']:.1f}x"
            f" -> {'holds' if row['holds'] else 'fails'}"
        )
    lines.append(f"=> {verdict_word(check['confirmed'])}")
    return "\n".join(lines)


def form_report(check: dict[str, Any]) -> str:
    header = [
        "n",
        "p",
        "p(n-c)",
        "nc",
        "predicted",
        "conv fwd ms",
        "cov fwd ms",
        "measured (fwd)",
        "agree",
        "measured (fwd+bwd)",
    ]
    rows = [
        [
            str(row["n"]),
            str(row["p"]),
            f"{row['p(n-c)']:,}",
            f"{row['nc']:,}",
            row["predicted"],
            report.format_ms(row["conv_forward_ms"]),
            report.format_ms(row["covariance_forward_ms"]),
            row["measured_forward"],
            "yes" if row["agree"] else "NO",
            row["measured_fwd_bwd"],
        ]
        for row in check["rows"]
    ]
    table = report.markdown_table(header, rows) if rows else "(SMSO not measured)"
    return (
        f"Check 2: {check['claim']} (cheaper = faster forward, eval mode)\n\n{table}\n\n"
        f"=> {verdict_word(check['confirmed'])}"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time and size every registered pooling head at the paper's settings.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    parser.add_argument(
        "--heads", nargs="+", choices=list(HEADS), default=list(HEADS), help="heads to measure"
    )
    parser.add_argument(
        "--sides", nargs="+", type=int, default=None, help="feature-map sides h = w (n = side^2)"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="most timed calls per measurement (15; quick: 2)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="target seconds of timed calls per measurement (1.5; quick: 0.2)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: n = 196 only, few repeats"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument(
        "--json", type=Path, default=RESULTS / "heads.json", help="where to write results"
    )
    args = parser.parse_args(argv)
    args.sides = args.sides or ([SIDES[0]] if args.quick else list(SIDES))
    args.repeats = args.repeats or (2 if args.quick else 15)
    args.budget = args.budget if args.budget is not None else (0.2 if args.quick else 1.5)
    if args.repeats < 1 or args.budget < 0 or min(args.sides) < 2:
        parser.error("--repeats must be >= 1, --budget >= 0, --sides >= 2")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    device = torch_device.resolve_device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    policy = TimingPolicy(
        max_repeats=args.repeats, budget_s=args.budget, warmups=1 if args.quick else 2
    )

    start = time.perf_counter()
    results: list[Result] = []
    todo = configs(args.heads, args.sides)
    for i, config in enumerate(todo, 1):
        log.info("[%d/%d] %s", i, len(todo), config.label())
        results.append(measure(config, device, policy))
        gc.collect()
    total_s = time.perf_counter() - start

    speedup = speedup_check(results)
    forms = form_check(results)
    print(results_table(results, device))
    print()
    print(speedup_report(speedup))
    print()
    print(form_report(forms))
    print()
    print(f"Total measurement time: {total_s:.0f} s ({device}, {torch.get_num_threads()} threads)")

    result = {
        "machine": torch_device.machine_info(device),
        "settings": {
            "batch": BATCH,
            "dtype": "float32",
            "sides": args.sides,
            "positions": [s * s for s in args.sides],
            "heads": args.heads,
            "smso_dims": list(DIMS["smso"]),
            "smso_forms": list(HEADS["smso"].forms),
            "lrbp_num_classes": NUM_CLASSES,
            "max_repeats": args.repeats,
            "budget_s": args.budget,
            "quick": args.quick,
            "timing": "median wall time of one call after warm-up (time.perf_counter)",
            "forward": "eval mode, torch.no_grad()",
            "fwd_bwd": "train mode, input requires grad, output.sum().backward()",
            "memory": torch_device.memory_note(device, MEMORY_OF),
        },
        "results": [asdict(r) for r in results],
        "checks": {"speedup": speedup, "forms": forms},
        "total_seconds": total_s,
    }
    report.save(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
