"""The embedded engine's defaults for the machine and the model (docs/batch.md's measurements)."""

from __future__ import annotations

import pytest

from batch.engine import LARGE_MODEL_BYTES
from batch.local_engine import LocalOptions, default_local_options


@pytest.mark.parametrize("cpus", [1, 2, 4, 16])
def test_a_small_model_gets_a_one_thread_session_per_core(cpus):
    assert default_local_options("cpu", cpus) == LocalOptions(
        decoders=max(1, cpus // 2), sessions=cpus, threads=1
    )


@pytest.mark.parametrize("cpus", [1, 2, 4, 16])
def test_a_large_model_gets_one_session_on_every_core_and_a_decode_thread(cpus):
    options = default_local_options("cpu", cpus, model_bytes=LARGE_MODEL_BYTES)
    assert options == LocalOptions(decoders=1, sessions=1, threads=0)


def test_on_a_gpu_every_core_decodes_for_one_session(monkeypatch):
    monkeypatch.setattr("batch.local_engine.runs_on_gpu", lambda providers: True)
    assert default_local_options("cuda", 8) == LocalOptions(decoders=8, sessions=1, threads=0)
