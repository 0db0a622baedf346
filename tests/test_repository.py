"""The repository's promises: layout, packaging groups, the service's import rule, CI."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_IN_SERVICE = ("torch", "torchvision", "training", "export")


@pytest.mark.parametrize(
    "path",
    [
        "training",
        "export",
        "service",
        "modelcard",
        "batch",
        "docker",
        "tests",
        "docker-compose.yml",
        "pyproject.toml",
        "README.md",
        "Makefile",
        ".ci/run",
    ],
)
def test_layout(path: str) -> None:
    assert (ROOT / path).exists()


def test_packages_import() -> None:
    import export
    import modelcard
    import service
    import training

    assert all(m.__doc__ for m in (export, modelcard, service, training))


def test_service_never_imports_torch_or_training_at_run_time() -> None:
    """sys.modules after importing every module of the service: a dependency that pulls torch in
    is caught here (the service's own imports are import-linter's contracts, `make lint`)."""
    code = (
        "import pkgutil, sys, service\n"
        "for m in pkgutil.walk_packages(service.__path__, 'service.'):\n"
        "    __import__(m.name)\n"
        f"print(sorted(m for m in {FORBIDDEN_IN_SERVICE!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _names(group: str) -> set[str]:
    """The distributions an extra pulls, with ``smso[...]`` self-references resolved."""
    found: set[str] = set()
    for line in _extras()[group]:
        requirement = Requirement(line)
        if requirement.name == "smso":
            for inner in requirement.extras:
                found |= _names(inner)
        else:
            found.add(requirement.name)
    return found


def test_dependency_groups() -> None:
    groups = _extras()
    assert {"onnxruntime-gpu", "fastapi", "uvicorn", "pydantic", "pillow", "numpy"} <= _names(
        "serving"
    )
    assert not {"torch", "torchvision"} & _names("serving")
    assert "torch==2.14.1" in groups["training"]
    assert "torchvision==0.29.1" in groups["training"]
    assert {"pytest", "ruff"} <= _names("dev")


ONNXRUNTIMES = {"onnxruntime", "onnxruntime-gpu"}  # two builds of one module: never both


def test_the_cpu_serving_install_swaps_only_onnxruntime_and_keeps_its_version() -> None:
    gpu, cpu = _names("serving"), _names("serving-cpu")
    assert gpu - cpu == {"onnxruntime-gpu"}
    assert cpu - gpu == {"onnxruntime"}
    common = [line for line in _extras()["serving-common"] if Requirement(line).name != "smso"]
    assert not ONNXRUNTIMES & {Requirement(line).name for line in common}
    specifiers = {
        Requirement(line).name: Requirement(line).specifier
        for group in ("serving", "serving-cpu")
        for line in _extras()[group]
    }
    assert specifiers["onnxruntime"] == specifiers["onnxruntime-gpu"]


@pytest.mark.parametrize("group", ["serving", "serving-cpu", "export", "dev"])
def test_no_extra_installs_both_onnxruntime_builds(group: str) -> None:
    assert len(_names(group) & ONNXRUNTIMES) == 1, _names(group) & ONNXRUNTIMES


def _readme_settings() -> set[str]:
    """The ``SMSO_`` names in the README's Service section (up to the first table)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Service\n", 1)[1].split("\n|", 1)[0]
    return set(re.findall(r"`(SMSO_[A-Z0-9_]+)`", section))


def test_the_readme_lists_every_setting_and_no_other() -> None:
    from service.core.settings import Settings

    prefix = Settings.model_config["env_prefix"]
    fields = {prefix + name.upper() for name in Settings.model_fields}
    listed = _readme_settings()
    assert not fields - listed, f"settings missing from the README: {sorted(fields - listed)}"
    assert not listed - fields, (
        f"the README lists settings that do not exist: {sorted(listed - fields)}"
    )


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme.split("\n## ")[0]  # in the README's opening lines
    assert "make test" in ci
    assert "set -e" in ci  # a failing step fails CI


@pytest.mark.parametrize("package", ["service", "training", "export", "batch"])
def test_each_package_docstring_names_every_module(package: str) -> None:
    """The package docstrings are the map a newcomer reads first: a new module must be on it,
    and a module that is gone must leave it."""
    tree = ast.parse((ROOT / package / "__init__.py").read_text())
    named = set(re.findall(rf":mod:`{package}\.(\w+)`", ast.get_docstring(tree) or ""))
    folder = ROOT / package
    modules = {path.stem for path in folder.glob("*.py") if path.stem != "__init__"}
    modules |= {path.parent.name for path in folder.glob("*/__init__.py")}
    assert not modules - named, f"modules missing from {package}/__init__.py: {modules - named}"
    assert not named - modules, f"{package}/__init__.py names no such modules: {named - modules}"
