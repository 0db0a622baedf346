"""``smso-train``: train a model with the paper's recipe; checkpoints, resume, metrics.

A run folder holds ``config.json`` (the resolved settings), ``splits.json`` (the classes, the size
of each split and how the validation split was made), ``metrics.jsonl`` (a line per epoch),
``last.pt`` (written every epoch, for ``--resume``), ``best.pt`` (best validation accuracy) and, at
the end, ``test.json`` (the best checkpoint's test accuracy and confusion matrix).

The run logs what it trains on at the start and one line per epoch. A training loss several
times its best draws a warning; a NaN or infinite one stops the run (``DivergenceError``, which
``smso-train`` prints as one error line naming the learning rate).

Heads that set state from statistics of their input over the training images get it before the
first epoch (LRBP's projection) or, when the run has finished, in ``best.pt`` before the test
(SMSO's ``Sigma``, ``training.recalibrate``; ``--no-recalibrate`` skips it). ``--init-from`` starts
the backbone from another run's checkpoint. ``--ema D`` keeps an exponential moving average of the
weights and buffers (``torch.optim.swa_utils.AveragedModel``), updated after every step: the
average is what is validated, saved as ``best.pt`` and tested (``last.pt`` holds both).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Sampler, Subset

from training.checkpoint import (
    CheckpointError,
    held_val_accuracy,
    load_backbone,
    load_checkpoint,
    resave_checkpoint,
    save_checkpoint,
)
from training.cli import run_cli
from training.config import ConfigError, TrainConfig, parse_train_config
from training.datasets import (
    PRESETS,
    LabelledImages,
    Preset,
    Splits,
    check_readable,
    load_splits,
)
from training.divergence import LossWatch
from training.engine import EvalResult, evaluate, make_criterion, train_one_epoch
from training.head_statistics import fit_input_statistics
from training.heads import head_spec
from training.model import SecondOrderNet, build_model
from training.outputs import check_writable, file_above
from training.recalibrate import recalibrate
from training.runtime import Runtime, setup_runtime, teardown_runtime

__all__ = ["RunResult", "fit", "main"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """What a finished (or stopped) run reports."""

    out: Path
    epochs_run: int  # by this call (a resumed run ran the others before)
    best_val_accuracy: float  # the best epoch's, which chose best.pt
    test: EvalResult | None
    # best.pt's weights when the run finished and best.pt was recalibrated or tested, else the
    # weights of the last epoch run
    model: SecondOrderNet
    epochs_done: int = 0  # of the run's epochs, by this call and any before it
    epochs: int = 0  # the run's epochs (cfg.epochs)
    # SMSO's re-estimated Sigma in best.pt (training.recalibrate's report), when it was done
    recalibration: dict[str, Any] | None = None

    def summary(self) -> str:
        """One line: the folder, epochs, and best.pt's validation accuracy (also after Sigma's
        re-estimation, when that is what best.pt holds)."""
        epochs = f"{self.epochs_done} of {self.epochs}"
        if self.epochs_run != self.epochs_done:
            epochs += f" ({self.epochs_run} by this call)"
        val = f"{self.best_val_accuracy:.4f}"
        if self.recalibration is not None and self.recalibration["kept"]:
            val += f" ({self.recalibration['val_accuracy_after']:.4f} after Sigma's re-estimation)"
        return f"run: {self.out}  epochs: {epochs}  best val: {val}"


#: What a head's own check (SMSO: "at least 2 spatial positions") and torch's convolutions and
#: poolings say of an input too small for them.
_TOO_SMALL = re.compile(
    r"spatial positions|input size|output size|too small|kernel size", re.IGNORECASE
)


def _check_input_size(model: SecondOrderNet, preset: Preset, runtime: Runtime) -> None:
    """``ConfigError`` before the run folder is made when the model cannot run on the preset's
    crops (e.g. ``image_size`` 4 leaves SMSO one spatial position): one forward pass of two
    blank images in eval mode, which changes no weight or statistic."""
    side = preset.image_size
    blank = torch.zeros(2, preset.channels, side, side, device=runtime.device)
    model.eval()
    try:
        with torch.no_grad():
            model(blank)
    except (ValueError, RuntimeError) as error:
        if not _TOO_SMALL.search(str(error)):  # a device, library or programming error
            raise
        raise ConfigError(
            f"image_size {side}: the model cannot run on {side} x {side} crops ({error}); give "
            "a larger image_size"
        ) from None
    finally:
        model.train()


def _param_groups(model: SecondOrderNet, cfg: TrainConfig) -> list[dict[str, Any]]:
    """Backbone at ``lr``, new layers at ``lr * new_layer_lr_mult``; no decay on 1-d tensors."""
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            key = (not name.startswith("backbone."), param.ndim > 1)
            groups.setdefault(key, []).append(param)
    return [
        {
            "params": params,
            "lr": cfg.learning_rate * (cfg.new_layer_lr_mult if new else 1.0),
            "weight_decay": cfg.weight_decay if decay else 0.0,
        }
        for (new, decay), params in sorted(groups.items())
    ]


def _rng_state() -> dict[str, Any]:
    legacy = np.random.get_state()  # legacy=True: the tuple form
    assert isinstance(legacy, tuple)
    name, keys, pos, has_gauss, cached = legacy
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (name, torch.from_numpy(keys.copy()), pos, has_gauss, cached),  # weights_only-safe
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy(), pos, has_gauss, cached))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _train_loader(
    dataset: LabelledImages, cfg: TrainConfig, runtime: Runtime, epoch: int
) -> DataLoader:
    """A loader whose order depends only on (seed, epoch), so a resumed run sees the same data."""
    generator = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
    sampler: Sampler[int]
    if runtime.distributed:
        distributed: DistributedSampler[int] = DistributedSampler(
            dataset, runtime.world_size, runtime.rank, seed=cfg.seed
        )
        distributed.set_epoch(epoch)
        sampler = distributed
    else:
        sampler = RandomSampler(dataset, generator=generator)
    return DataLoader(
        dataset,
        cfg.batch_size,
        sampler=sampler,
        num_workers=cfg.workers,
        generator=generator,
        pin_memory=runtime.device.type == "cuda",
        drop_last=len(dataset) > cfg.batch_size,
    )


def _eval_loader(dataset: LabelledImages, cfg: TrainConfig, runtime: Runtime) -> DataLoader:
    if runtime.distributed:  # every image exactly once over all ranks
        part = Subset(dataset, range(runtime.rank, len(dataset), runtime.world_size))
        return DataLoader(part, cfg.batch_size * 2, num_workers=cfg.workers)
    return DataLoader(dataset, cfg.batch_size * 2, num_workers=cfg.workers)


def _metrics_lines(path: Path, upto_epoch: int) -> list[str]:
    """Existing metrics lines up to ``upto_epoch`` (a resumed run drops the lines after it).

    A last line cut short (no newline, not JSON) is an epoch interrupted before its ``last.pt``
    was written: dropped. Any other line that is not an epoch's record is a ``ConfigError``
    naming it."""
    if not path.exists():
        return []
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    kept: list[str] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines) and not text.endswith("\n"):
                log.warning("%s:%d: dropped a line cut short by an interruption", path, number)
                continue
            raise ConfigError(
                f"{path}:{number}: not JSON ({error.msg}); remove that line to --resume"
            ) from None
        epoch = record.get("epoch") if isinstance(record, dict) else None
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise ConfigError(
                f"{path}:{number}: not an epoch's record (a JSON object with an integer "
                '"epoch"); remove that line to --resume'
            )
        if epoch <= upto_epoch:
            kept.append(line)
    return kept


#: Files whose presence in ``--out`` means it holds a run (or a shipped model's evidence) that a
#: new run would overwrite. Not ``metrics.jsonl`` alone: a run stopped after writing its first
#: epoch's line but before its ``last.pt`` has nothing to resume and starts again (the line goes).
_RUN_FILES = ("last.pt", "best.pt", "test.json", "model.pt")


def _check_run_folder(cfg: TrainConfig) -> None:
    """Raise a user error, before any data is read, when ``--out`` cannot hold this run: it is
    a file (or under one), or a new run would overwrite another run's results there."""
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file: give a folder for the run")
    blocking = file_above(out)
    if blocking is not None:
        raise ConfigError(f"--out {out} cannot be made: {blocking} is a file, not a folder")
    check_writable(out, f"the run folder --out {out}")
    if cfg.resume:
        return
    found = [name for name in _RUN_FILES if (out / name).exists()]
    if found:
        raise ConfigError(
            f"{out} already holds a run; pass --resume or choose another --out (it has "
            f"{', '.join(found)})"
        )


class _Run:
    """The state of one training run, between ``fit``'s steps."""

    def __init__(self, cfg: TrainConfig, runtime: Runtime) -> None:
        self.runtime = runtime
        preset = PRESETS.get(cfg.dataset)
        if preset is not None and cfg.image_size is not None:
            preset = preset.with_size(cfg.image_size)
        if preset is not None and cfg.random_erasing:
            preset = dataclasses.replace(preset, erase=cfg.random_erasing)
        if cfg.val_size is not None and cfg.dataset != "fashion_mnist":
            log.warning(
                "val_size is read by fashion_mnist only; %s's validation split is below",
                cfg.dataset,
            )
        self.cfg = cfg.resolve()
        self.splits: Splits
        self.splits, self.preset = load_splits(
            cfg.dataset,
            cfg.data_root,
            preset,
            cfg.partition,
            self.cfg.val_size,
            cfg.seed,
            cfg.classes,
        )
        # a broken test image found now, not after training
        check_readable(self.splits, test=cfg.eval_test)
        torch.manual_seed(cfg.seed)
        model_config = self.cfg.model_config(len(self.splits.classes), self.preset.channels)
        self.model = build_model(model_config).to(runtime.device)
        if self.cfg.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        _check_input_size(self.model, self.preset, runtime)
        self.criterion = make_criterion(self.cfg.loss, self.cfg.label_smoothing)
        self.optimizer = torch.optim.SGD(
            _param_groups(self.model, self.cfg),
            lr=self.cfg.learning_rate,
            momentum=self.cfg.momentum,
        )
        self.scaler = torch.amp.GradScaler(
            runtime.device.type, enabled=runtime.amp_dtype == torch.float16
        )
        steps = len(_train_loader(self.splits.train, self.cfg, runtime, 1))  # per epoch
        if self.cfg.schedule == "cosine":
            self.scheduler: Any = torch.optim.lr_scheduler.CosineAnnealingLR(
                self.optimizer, T_max=self.cfg.epochs * steps
            )
        else:
            self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
                self.optimizer,
                factor=self.cfg.plateau_factor,
                patience=self.cfg.plateau_patience,
            )
        #: the weights' exponential moving average (cfg.ema), or None: what is validated,
        #: saved as best.pt and tested when there is one
        self.averaged: AveragedModel | None = None
        if self.cfg.ema is not None:
            self.averaged = AveragedModel(
                self.model, multi_avg_fn=get_ema_multi_avg_fn(self.cfg.ema), use_buffers=True
            )
        self.trained: nn.Module = self.model
        if runtime.distributed:
            ids = [runtime.device.index] if runtime.device.type == "cuda" else None
            self.trained = DistributedDataParallel(self.model, device_ids=ids)
        self.out = Path(self.cfg.out)
        self.start_epoch = 1
        self.best_accuracy = -1.0

    def describe(self) -> None:
        """Log what this run trains, on what, where: the first lines a person reads."""
        cfg, splits, runtime = self.cfg, self.splits, self.runtime
        names = (
            ", ".join(splits.classes)
            if len(splits.classes) <= 12
            else "first: " + ", ".join(splits.classes[:5])
        )
        precision = "fp32" if runtime.amp_dtype is None else f"AMP {str(runtime.amp_dtype)[6:]}"
        params = sum(p.numel() for p in self.model.parameters())
        processes = f" x {runtime.world_size} processes" if runtime.distributed else ""
        log.info(
            "dataset: %s (%s), %d classes (%s)",
            cfg.dataset,
            cfg.data_root or "default",
            len(splits.classes),
            names,
        )
        log.info(
            "images: %d train, %d val (%s), %d test; input %d px, %s",
            len(splits.train),
            len(splits.val),
            splits.validation,
            len(splits.test),
            self.preset.image_size,
            "grey" if self.preset.channels == 1 else "RGB",
        )
        log.info(
            "model: %s + %s, %s parameters; lr %g, batch %d, %d epochs",
            cfg.backbone,
            cfg.head,
            f"{params:,}",
            cfg.lr,
            cfg.batch_size,
            cfg.epochs,
        )
        log.info("device: %s%s, %s; output: %s", runtime.device, processes, precision, self.out)

    def splits_record(self) -> dict[str, Any]:
        """``splits.json``: what the run trained and validated on."""
        splits = self.splits
        return {
            "dataset": self.cfg.dataset,
            "data_root": self.cfg.data_root,
            "classes": splits.classes,
            "train": len(splits.train),
            "val": len(splits.val),
            "test": len(splits.test),
            "validation": splits.validation,
        }

    def start(self) -> None:
        """What a new run does before its first epoch: its backbone from ``init_from`` (the
        paper's warm start of LRBP from BP), then the head statistics its spec sets before
        training (LRBP's projection from the Gram matrix of the training features)."""
        if self.cfg.init_from is not None:
            load_backbone(self.model, self.cfg.init_from)
            log.info("backbone weights from %s", self.cfg.init_from)
        if head_spec(self.cfg.head).input_statistics == "before_training":
            loader = _eval_loader(self.splits.train_eval, self.cfg, self.runtime)
            images = fit_input_statistics(self.model, loader, self.runtime)
            log.info("head statistics from %d training images", images)

    def resume(self) -> None:
        payload = load_checkpoint(self.out / "last.pt", map_location=str(self.runtime.device))
        if payload.get("model_config") != self.model.config.to_dict():
            raise CheckpointError(
                f"{self.out / 'last.pt'} was written for another model: "
                f"{payload.get('model_config')} vs {self.model.config.to_dict()}"
            )
        needed = ["model_state", "optimizer", "scheduler", "scaler", "rng", "epoch"]
        needed += ["best_val_accuracy"] + ["ema_state"] * (self.averaged is not None)
        missing = [key for key in needed if key not in payload]
        if missing:
            raise CheckpointError(
                f"{self.out / 'last.pt'} cannot be resumed: it has no {', '.join(missing)} (a "
                "run's last.pt, written at the end of each epoch, has them all)"
            )
        try:
            self.model.load_state_dict(payload["model_state"])
            self.optimizer.load_state_dict(payload["optimizer"])
            self.scheduler.load_state_dict(payload["scheduler"])
            self.scaler.load_state_dict(payload["scaler"])
            if self.averaged is not None:
                self.averaged.load_state_dict(payload["ema_state"])
        except (KeyError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{self.out / 'last.pt'} cannot be resumed: {exc}") from exc
        _set_rng_state(payload["rng"])
        self.start_epoch = int(payload["epoch"]) + 1
        self.best_accuracy = float(payload["best_val_accuracy"])

    @property
    def evaluated(self) -> SecondOrderNet:
        """The weights validation, best.pt and the test see: the average, else the model."""
        if self.averaged is None:
            return self.model
        averaged = self.averaged.module
        assert isinstance(averaged, SecondOrderNet)  # AveragedModel's deep copy of self.model
        return averaged

    def after_step(self, scheduler_step: Callable[[], None] | None) -> Callable[[], None] | None:
        """What runs after every optimiser step: the cosine schedule's step and the average's
        update."""
        if self.averaged is None:
            return scheduler_step
        averaged, model = self.averaged, self.model

        def step() -> None:
            if scheduler_step is not None:
                scheduler_step()
            averaged.update_parameters(model)

        return step

    def sync_buffers(self) -> None:
        """Give every rank rank 0's running statistics (BatchNorm, SMSO's Sigma), the
        average's too."""
        if self.runtime.distributed:
            averaged = [] if self.averaged is None else list(self.averaged.module.buffers())
            for buffer in [*self.model.buffers(), *averaged]:
                dist.broadcast(buffer, 0)

    def save(self, epoch: int, val: EvalResult, is_best: bool) -> None:
        extra = {
            "train_config": self.cfg.to_dict(),
            "classes": self.splits.classes,
            "preset": self.preset.to_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": epoch,
            "val_accuracy": val.accuracy,
            "best_val_accuracy": self.best_accuracy,
            "rng": _rng_state(),
        }
        if self.averaged is not None:
            extra["ema_state"] = self.averaged.state_dict()
        save_checkpoint(self.out / "last.pt", self.model, **extra)
        if is_best:
            save_checkpoint(self.out / "best.pt", self.evaluated, **extra)


def fit(cfg: TrainConfig) -> RunResult:
    """Train or resume the run ``cfg`` describes; returns its best validation and test accuracy."""
    runtime = setup_runtime(cfg.device, cfg.amp)
    try:
        return _fit(cfg, runtime)
    finally:
        teardown_runtime(runtime)


def _fit(cfg: TrainConfig, runtime: Runtime) -> RunResult:
    _check_run_folder(cfg)
    run = _Run(cfg, runtime)
    cfg, out = run.cfg, run.out
    if cfg.resume:
        run.resume()
    else:
        run.start()
    metrics_path = out / "metrics.jsonl"
    if runtime.is_main:
        kept = _metrics_lines(metrics_path, run.start_epoch - 1)
        run.describe()
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        (out / "splits.json").write_text(json.dumps(run.splits_record(), indent=2) + "\n")
        metrics_path.write_text("".join(line + "\n" for line in kept))
    val_loader = _eval_loader(run.splits.val, cfg, runtime)
    step = run.after_step(run.scheduler.step if cfg.schedule == "cosine" else None)
    last = cfg.epochs if cfg.stop_after is None else min(cfg.epochs, cfg.stop_after)
    watch = LossWatch(cfg.learning_rate)
    started = time.perf_counter()
    for epoch in range(run.start_epoch, last + 1):
        lr = run.optimizer.param_groups[0]["lr"]
        train = train_one_epoch(
            run.trained,
            _train_loader(run.splits.train, cfg, runtime, epoch),
            run.criterion,
            run.optimizer,
            runtime,
            run.scaler,
            step,
            cfg.channels_last,
            f"epoch {epoch}",
        )
        warning = watch.check(epoch, train.loss)  # raises on NaN: no checkpoint of this epoch
        if warning is not None and runtime.is_main:
            log.warning("warning: %s", warning)
        run.sync_buffers()
        val = evaluate(
            run.evaluated,
            val_loader,
            run.criterion,
            len(run.splits.classes),
            runtime,
            cfg.channels_last,
            "val",
        )
        if cfg.schedule == "plateau":
            run.scheduler.step(val.loss)
        is_best = val.accuracy > run.best_accuracy
        run.best_accuracy = max(run.best_accuracy, val.accuracy)
        if runtime.is_main:
            record = {
                "epoch": epoch,
                "train_loss": train.loss,
                "train_accuracy": train.accuracy,
                "val_loss": val.loss,
                "val_accuracy": val.accuracy,
                "lr": lr,
                "images_per_second": train.images_per_second,
                "seconds": train.seconds,
                "time": time.time(),
            }
            with metrics_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            run.save(epoch, val, is_best)
            done = epoch - run.start_epoch + 1
            left = (time.perf_counter() - started) / done * (last - epoch)
            log.info(
                "epoch %d/%d  train loss %.4f acc %.4f  val loss %.4f acc %.4f%s  lr %.3g  "
                "%.0f images/s  %s left",
                epoch,
                cfg.epochs,
                train.loss,
                train.accuracy,
                val.loss,
                val.accuracy,
                " (best)" if is_best else "",
                lr,
                train.images_per_second,
                _duration(left),
            )
    finished = last == cfg.epochs
    recalibration = None
    if finished and cfg.recalibrate and head_spec(cfg.head).input_statistics == "after_training":
        recalibration = _recalibrate_best(run, runtime, val_loader)
    test = None
    if cfg.eval_test and finished:
        test = _test_best(run, runtime)
    return RunResult(
        out,
        last - run.start_epoch + 1,
        run.best_accuracy,
        test,
        run.model,
        epochs_done=max(last, run.start_epoch - 1),
        epochs=cfg.epochs,
        recalibration=recalibration,
    )


def _duration(seconds: float) -> str:
    """``h:mm:ss`` (``m:ss`` under an hour)."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _recalibrate_best(run: _Run, runtime: Runtime, val_loader: DataLoader) -> dict[str, Any]:
    """Re-estimate the head's statistics in ``best.pt`` over the training images: every rank
    computes on its share and receives the estimate over all of them, rank 0 writes the file.
    Returns the report (``training.recalibrate.recalibrate``)."""
    if runtime.distributed:
        dist.barrier()  # rank 0 has written best.pt
    path = run.out / "best.pt"
    payload = load_checkpoint(path, map_location=str(runtime.device))
    run.model.load_state_dict(payload["model_state"])
    report = recalibrate(
        run.model,
        _eval_loader(run.splits.train_eval, run.cfg, runtime),
        val_loader,
        run.criterion,
        len(run.splits.classes),
        runtime,
    )
    if runtime.is_main:
        resave_checkpoint(path, run.model, payload, recalibration=report)
    return report


def _test_best(run: _Run, runtime: Runtime) -> EvalResult:
    """Evaluate ``best.pt`` on the test split and write ``test.json``."""
    if runtime.distributed:
        dist.barrier()  # rank 0 has written best.pt
    payload = load_checkpoint(run.out / "best.pt", map_location=str(runtime.device))
    run.model.load_state_dict(payload["model_state"])
    result = evaluate(
        run.model,
        _eval_loader(run.splits.test, run.cfg, runtime),
        run.criterion,
        len(run.splits.classes),
        runtime,
        run.cfg.channels_last,
        "test",
    )
    if runtime.is_main:
        report = {
            "checkpoint": str(run.out / "best.pt"),
            "epoch": payload["epoch"],
            "recalibration": payload.get("recalibration"),
            "val_accuracy": held_val_accuracy(payload),
            "test_accuracy": result.accuracy,
            "test_loss": result.loss,
            "test_images": result.count,
            "classes": run.splits.classes,
            "confusion": result.confusion.tolist(),
        }
        (run.out / "test.json").write_text(json.dumps(report, indent=2) + "\n")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``smso-train``; a user's mistake prints one error line and exits 2."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    def body() -> int:
        result = fit(parse_train_config(argv))
        print(result.summary())
        if result.test is not None:
            print(f"test accuracy: {result.test.accuracy:.4f} on {result.test.count} images")
        return 0

    return run_cli("smso-train", body)


if __name__ == "__main__":
    sys.exit(main())
