"""Execution providers and their options, without a GPU: what a TensorRT or CUDA session would
be created with (engine cache, optimisation profile, CUDA graphs), and the CPU fallback."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import onnxruntime as ort
import pytest

from service.core.settings import Settings
from service.runtime import providers
from service.runtime.backend import BackendOptions, OnnxBackend
from service.runtime.providers import (
    CPU,
    CUDA,
    TENSORRT,
    Accelerator,
    choose_providers,
    provider_options,
)

ACCELERATOR = Accelerator(
    input_shape=(3, 224, 224),
    max_batch=64,
    engine_cache_dir=Path("/cache/trt"),
    trt_fp16=True,
    cuda_graphs=True,
)


def test_tensorrt_gets_one_profile_for_every_batch_and_a_persistent_engine_cache():
    options = provider_options(TENSORRT, ACCELERATOR)
    assert options["trt_profile_min_shapes"] == "image:1x3x224x224"
    assert options["trt_profile_opt_shapes"] == "image:64x3x224x224"
    assert options["trt_profile_max_shapes"] == "image:64x3x224x224"
    assert options["trt_engine_cache_enable"] == "1"
    assert options["trt_engine_cache_path"] == "/cache/trt"
    assert options["trt_timing_cache_enable"] == "1"
    assert options["trt_timing_cache_path"] == "/cache/trt"
    assert options["trt_fp16_enable"] == "1"
    plain = provider_options(TENSORRT, Accelerator(input_shape=(1, 28, 28), max_batch=16))
    assert "trt_engine_cache_enable" not in plain
    assert plain["trt_fp16_enable"] == "0"


def test_cuda_gets_graphs_only_when_asked():
    assert provider_options(CUDA, ACCELERATOR)["enable_cuda_graph"] == "1"
    assert "enable_cuda_graph" not in provider_options(
        CUDA, Accelerator(input_shape=(1, 28, 28), max_batch=16)
    )
    assert provider_options(CPU, ACCELERATOR) == {}
    assert provider_options(CUDA, None) == {}


def test_option_names_are_ones_this_onnxruntime_knows():
    """A misspelt option is refused by onnxruntime only on a GPU machine: check the names
    against the provider libraries' own strings here."""
    capi = Path(ort.__file__).parent / "capi"
    for provider, library in ((TENSORRT, "tensorrt"), (CUDA, "cuda")):
        path = capi / f"libonnxruntime_providers_{library}.so"
        if not path.is_file():
            pytest.skip(f"{path.name} is not part of this onnxruntime")
        text = path.read_bytes()
        for name in provider_options(provider, ACCELERATOR):
            assert name.encode() + b"\0" in text, f"{provider} has no option {name!r}"


@pytest.fixture
def accelerator(tmp_path):
    """ACCELERATOR with its engine cache in a fresh folder (choose_providers creates it)."""
    return dataclasses.replace(ACCELERATOR, engine_cache_dir=tmp_path / "cache" / "trt")


class Started:
    """What a session that started on ``names`` says of its providers."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def get_providers(self) -> list[str]:
        return self.names


def test_an_explicit_list_passes_each_provider_its_options(monkeypatch, shipped_model, accelerator):
    calls = []

    def fake_session(path, specs, *, threads, spinning):
        calls.append(specs)
        return Started([name for name, _ in specs])

    monkeypatch.setattr(providers, "_session", fake_session)
    monkeypatch.setattr(providers, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(ort, "get_available_providers", lambda: [TENSORRT, CUDA, CPU])
    choose_providers(f"{TENSORRT},{CUDA},{CPU}", Path(shipped_model), accelerator=accelerator)
    choose_providers(f"{CUDA},{CPU}", Path(shipped_model), accelerator=accelerator)
    behind_tensorrt, cuda_first = calls
    assert [name for name, _ in behind_tensorrt] == [TENSORRT, CUDA, CPU]
    assert behind_tensorrt[0][1] == provider_options(TENSORRT, accelerator)
    # CUDA graphs need every compute node on CUDA: behind TensorRT, onnxruntime would refuse
    # the session (after building TensorRT's engines)
    assert "enable_cuda_graph" not in behind_tensorrt[1][1]
    assert behind_tensorrt[2][1] == {}
    assert cuda_first[0] == (CUDA, provider_options(CUDA, accelerator))
    assert cuda_first[0][1]["enable_cuda_graph"] == "1"


def test_an_accelerator_asked_for_by_name_is_never_replaced_by_the_cpu(monkeypatch, shipped_model):
    """Without a GPU, CUDA or TensorRT by name is refused before any session (onnxruntime-gpu
    lists them everywhere); on a GPU machine whose CUDA libraries do not load, onnxruntime's
    silent fall-back to the CPU is refused."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: [TENSORRT, CUDA, CPU])
    monkeypatch.setattr(providers, "has_nvidia_gpu", lambda: False)
    with pytest.raises(ValueError, match="need an NVIDIA GPU") as error:
        choose_providers(f"{CUDA},{CPU}", Path(shipped_model))
    assert str(error.value) == (
        f"execution providers [{CUDA!r}] need an NVIDIA GPU and this machine has none (no NVIDIA "
        f"driver): give providers 'auto', which runs on the CPU here, or {CPU!r}"
    )
    monkeypatch.setattr(providers, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(providers, "_session", lambda *args, **kwargs: Started([CPU]))
    with pytest.raises(ValueError, match=rf"{CUDA} was asked for and onnxruntime could not start"):
        choose_providers(f"{CUDA},{CPU}", Path(shipped_model))
    _, used = choose_providers(CPU, Path(shipped_model))  # the CPU by name is fine
    assert used == [CPU]


def test_auto_tries_tensorrt_then_cuda_on_a_gpu_machine(monkeypatch, shipped_model, accelerator):
    """With a GPU present, 'auto' offers TensorRT (with CUDA and the CPU behind it), then CUDA;
    a session that does not start on the accelerator is not kept."""
    calls = []

    def fake_session(path, specs, *, threads, spinning):
        calls.append(specs)
        if specs[0][0] == TENSORRT:
            raise RuntimeError("libnvinfer.so.10: cannot open shared object file")
        return ort.InferenceSession(str(path), providers=[CPU])  # CUDA "did not load"

    monkeypatch.setattr(providers, "_session", fake_session)
    monkeypatch.setattr(providers, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(ort, "get_available_providers", lambda: [TENSORRT, CUDA, CPU])
    _, used = choose_providers("auto", Path(shipped_model), accelerator=accelerator)
    assert [[name for name, _ in specs] for specs in calls] == [
        [TENSORRT, CUDA, CPU],
        [CUDA, CPU],
        [CPU],
    ]
    assert used == [CPU]
    # CUDA captures graphs only where it leads (see the explicit list's test)
    assert "enable_cuda_graph" not in calls[0][1][1]
    assert calls[1][0][1]["enable_cuda_graph"] == "1"


def gpu_machine(monkeypatch) -> list[list[str]]:
    """A machine with TensorRT and CUDA whose sessions start on the CPU; the providers of each
    session started, in order."""
    calls: list[list[str]] = []

    def fake_session(path, specs, *, threads, spinning):
        calls.append([name for name, _ in specs])
        return ort.InferenceSession(str(path), providers=[CPU])

    monkeypatch.setattr(providers, "_session", fake_session)
    monkeypatch.setattr(providers, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(ort, "get_available_providers", lambda: [TENSORRT, CUDA, CPU])
    return calls


def test_the_engine_cache_folder_is_made_with_its_parents_before_tensorrt_starts(
    monkeypatch, shipped_model, tmp_path
):
    """onnxruntime's TensorRT provider creates only the last folder of its cache path and fails
    the session where the parent is missing (the default, ~/.cache/smso/tensorrt, on a fresh
    machine)."""
    cache = tmp_path / "home" / ".cache" / "smso" / "tensorrt"
    made: list[bool] = []
    gpu_machine(monkeypatch)

    def fake_session(*args: object, **kwargs: object) -> Started:
        made.append(cache.is_dir())
        return Started([TENSORRT, CPU])

    monkeypatch.setattr(providers, "_session", fake_session)
    accelerator = dataclasses.replace(ACCELERATOR, engine_cache_dir=cache)
    choose_providers(f"{TENSORRT},{CUDA},{CPU}", Path(shipped_model), accelerator=accelerator)
    assert made == [True]


def test_an_engine_cache_folder_that_cannot_be_made_is_named(
    monkeypatch, shipped_model, tmp_path, caplog
):
    """Asked for by name, TensorRT with an unusable cache folder is an error that says which
    setting to change; under 'auto' TensorRT is passed over with a warning saying the same."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    accelerator = dataclasses.replace(ACCELERATOR, engine_cache_dir=blocker / "trt")
    calls = gpu_machine(monkeypatch)
    with pytest.raises(ValueError, match=r"a-file/trt.*engine_cache_dir"):
        choose_providers(f"{TENSORRT},{CPU}", Path(shipped_model), accelerator=accelerator)
    assert calls == []
    with caplog.at_level(logging.WARNING, logger="service.providers"):
        choose_providers("auto", Path(shipped_model), accelerator=accelerator)
    assert calls == [[CUDA, CPU], [CPU]]
    assert "engine_cache_dir" in caplog.text


def test_settings_give_the_backend_its_options(shipped_model, tmp_path):
    settings = Settings(
        model_path=shipped_model,
        max_batch_size=32,
        engine_cache_dir=tmp_path,
        trt_fp16=True,
        cuda_graphs=True,
    )
    options = BackendOptions.from_settings(settings)
    assert options == BackendOptions(
        providers="auto",
        threads=0,
        spinning=False,
        max_batch=32,
        engine_cache_dir=tmp_path,
        trt_fp16=True,
        io_binding=False,
        cuda_graphs=True,
    )
    default = BackendOptions.from_settings(Settings(model_path=shipped_model))
    assert default.engine_cache_dir is not None
    assert default.engine_cache_dir.parts[-2:] == ("smso", "tensorrt")


def test_the_default_engine_cache_follows_xdg_and_survives_a_user_without_home(
    shipped_model, monkeypatch, tmp_path
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    options = BackendOptions.from_settings(Settings(model_path=shipped_model))
    assert options.engine_cache_dir == tmp_path / "smso" / "tensorrt"
    monkeypatch.delenv("XDG_CACHE_HOME")

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    options = BackendOptions.from_settings(Settings(model_path=shipped_model))
    assert options.engine_cache_dir is not None
    assert options.engine_cache_dir.parts[-2:] == ("smso", "tensorrt")


def test_gpu_options_are_harmless_on_the_cpu(shipped_model):
    backend = OnnxBackend(shipped_model, BackendOptions(cuda_graphs=True, io_binding=True))
    if backend.providers[0] == CPU:
        assert backend.mode == "plain"


def test_which_providers_run_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.runtime import providers

    assert providers.runs_on_gpu("CUDAExecutionProvider,CPUExecutionProvider")
    assert providers.runs_on_gpu("TensorrtExecutionProvider")
    assert not providers.runs_on_gpu("CPUExecutionProvider")
    monkeypatch.setattr(providers, "has_nvidia_gpu", lambda: False)
    assert not providers.runs_on_gpu("auto")  # no GPU here
    monkeypatch.setattr(providers, "has_nvidia_gpu", lambda: True)
    available = providers.ort.get_available_providers()
    accelerated_build = any(name in available for name in providers.ACCELERATED)
    assert providers.runs_on_gpu("auto") == accelerated_build
