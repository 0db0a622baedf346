"""Profiles: py-spy sampling a running server, and onnxruntime's own profiler on a session."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np


def py_spy(pid: int, seconds: float, out: Path, name: str) -> dict[str, Any]:
    """A sampling profile of process ``pid`` for ``seconds`` (``out/NAME.speedscope.json``, every
    thread, idle ones too) and three dumps of its threads a second apart (``out/NAME.dump.txt``);
    skipped where py-spy is not installed."""
    exe = shutil.which("py-spy")
    if exe is None:
        return {"skipped": "py-spy is not installed"}
    record = subprocess.run(
        [
            *(exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200"),
            *("--format", "speedscope", "--output", str(out / f"{name}.speedscope.json")),
            *("--threads", "--idle", "--nonblocking"),
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    dumps = []
    for _ in range(3):
        dump = subprocess.run(
            [exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60
        )
        dumps.append(dump.stdout + dump.stderr)
        time.sleep(1.0)
    (out / f"{name}.dump.txt").write_text("\n\n".join(dumps))
    return {"record_status": record.returncode, "record_stderr": record.stderr[-500:]}


def ort_profile(path: str, providers: str, batch: int, runs: int, out: Path) -> dict[str, Any]:
    """onnxruntime's profiler on ``runs`` runs of a batch of ``batch`` random images: the
    median run and the milliseconds per run of the 15 costliest operator types (by provider,
    host-device copies included)."""
    import onnxruntime as ort

    from service.core.card import parse_card
    from service.runtime.providers import Accelerator, provider_options

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(out / "ort_profile")
    options.log_severity_level = 3
    names = [p.strip() for p in providers.split(",")]
    session = ort.InferenceSession(
        path,
        options,
        providers=[
            (n, provider_options(n, Accelerator(input_shape=(3, 224, 224), max_batch=batch)))
            for n in names
        ],
    )
    spec = parse_card(session.get_modelmeta().custom_metadata_map)[0].input
    shape = (batch, spec.channels, spec.height, spec.width)
    images = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for _ in range(runs + 2):
        session.run(None, {"image": images})
    trace_file = Path(session.end_profiling())
    trace = json.loads(trace_file.read_text())
    trace_file.unlink()  # tens of MB; the summary below is what is kept
    by_op: dict[str, float] = {}
    run_us = []
    for event in trace:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            op = event.get("args", {}).get("op_name", "?")
            provider = event.get("args", {}).get("provider", "")
            key = f"{op} ({provider.replace('ExecutionProvider', '')})"
            by_op[key] = by_op.get(key, 0.0) + event["dur"]
        elif event.get("cat") == "Session" and event.get("name") == "model_run":
            run_us.append(event["dur"])
    total_runs = max(len(run_us), 1)
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:15]
    return {
        "batch": batch,
        "run_ms_median": statistics.median(run_us) / 1e3 if run_us else None,
        "ms_per_run_by_op": {k: v / 1e3 / total_runs for k, v in top},
        "providers": session.get_providers(),
    }
