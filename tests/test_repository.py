"""The repository's promises: layout, packaging groups, the service's import rule, the service
reference (docs/service.md) against the code, CI."""

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


SERVICE_DOCS = ROOT / "docs" / "service.md"


def _section(title: str) -> str:
    """The text of docs/service.md's ``## title`` section, up to the next ``## ``."""
    text = SERVICE_DOCS.read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _table_rows(section: str) -> list[list[str]]:
    """The cells of each body row of the markdown tables in ``section`` (header and rule left
    out)."""
    rows = []
    for line in section.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[-|: ]+\|", line):
            rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return [row for row in rows if row[0] not in ("setting", "route", "status")]


def _documented_settings() -> dict[str, str]:
    """docs/service.md's settings tables: ``{SMSO_NAME: its default cell}``."""
    found = {}
    for row in _table_rows(_section("Settings")):
        name = re.fullmatch(r"`(SMSO_[A-Z0-9_]+)`", row[0])
        assert name is not None, f"a settings row that names no SMSO_ variable: {row}"
        found[name.group(1)] = row[1]
    return found


def _same_default(cell: str, default: object) -> bool:
    """Whether a default cell says ``default``: ``unset`` for None, else its first backticked
    value as the environment would give it (a path relative to the repository root)."""
    if default is None:
        return cell.startswith("unset")
    value = re.match(r"`([^`]+)`", cell)
    if value is None:
        return False
    text = value.group(1)
    if isinstance(default, bool):
        return text == str(default).lower()
    if isinstance(default, int | float):
        return float(text) == default
    if isinstance(default, Path):
        return ROOT / text == default
    return text == default


def test_the_service_reference_lists_every_setting_and_no_other() -> None:
    from service.core.settings import Settings

    prefix = Settings.model_config["env_prefix"]
    fields = {prefix + name.upper(): field for name, field in Settings.model_fields.items()}
    listed = _documented_settings()
    assert not fields.keys() - listed, (
        f"settings missing from docs/service.md: {sorted(fields.keys() - listed)}"
    )
    assert not listed.keys() - fields, (
        f"docs/service.md lists settings that do not exist: {sorted(listed.keys() - fields)}"
    )
    wrong = {
        name: (cell, fields[name].default)
        for name, cell in listed.items()
        if not _same_default(cell, fields[name].default)
    }
    assert not wrong, f"docs/service.md's defaults (cell, the setting's default): {wrong}"


ROUTE = re.compile(r"`(GET|HEAD|POST|PUT|PATCH|DELETE) (/[^`]*)`")


def _served_routes(tmp_path: Path) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """``(method, path)`` of every route the app serves, built as tests/service build it: with
    one model file, and with a model repository (whose API adds routes); the second set holds
    the routes only a repository adds."""
    from starlette.routing import Mount, Route

    from service.app import create_app
    from service.core.settings import DEFAULT_MODEL, Settings

    def routes(settings: Settings) -> set[tuple[str, str]]:
        found = set()
        for route in create_app(settings).routes:
            if isinstance(route, Mount):  # static files under a prefix
                found.add(("GET", f"{route.path}/{{path}}"))
            elif isinstance(route, Route):
                found |= {(method, route.path) for method in route.methods or ()}
        return found

    single = routes(Settings(model_path=DEFAULT_MODEL))
    repository = routes(Settings(model_repository=tmp_path))
    return single | repository, repository - single


def test_the_service_reference_lists_every_route_and_no_other(tmp_path: Path) -> None:
    served, repository_only = _served_routes(tmp_path)
    rows = _table_rows(_section("Routes"))
    listed = {route for row in rows for route in ROUTE.findall(row[0])}
    assert not served - listed, f"routes missing from docs/service.md: {sorted(served - listed)}"
    assert not listed - served, (
        f"docs/service.md lists routes the app does not serve: {sorted(listed - served)}"
    )
    for row in rows:
        for route in set(ROUTE.findall(row[0])) & repository_only:
            assert "with a repository" in row[1], f"{route}: say it needs a repository"


def _raised_errors() -> set[tuple[int, str]]:
    """``(status, code)`` of every ``ServiceError(status, "code", ...)`` in service/ whose
    status and code are written out."""
    found: set[tuple[int, str]] = set()
    for path in (ROOT / "service").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            status, code = (getattr(arg, "value", None) for arg in node.args[:2])
            if name == "ServiceError" and isinstance(status, int) and isinstance(code, str):
                found.add((status, code))
    return found


def test_the_service_reference_names_every_error_code() -> None:
    listed = set()
    for row in _table_rows(_section("Errors")):
        listed |= {(int(row[0]), code) for code in re.findall(r"`([a-z_]+)`", row[1])}
    raised = _raised_errors()
    assert len(raised) > 20  # the scan still finds the service's errors
    assert not raised - listed, (
        f"error codes missing from docs/service.md: {sorted(raised - listed)}"
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
