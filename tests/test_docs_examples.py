"""Every ``curl`` command and every Python example that talks to the server, in README.md and
docs/, runs as printed from the repository root against a real server on the shipped model, and
answers what its example image is; the Python examples of the pages that need no server
(:data:`STANDALONE`) run as printed too.

The examples say http://127.0.0.1:8000 (``make serve``) or http://localhost:8000 (compose); the
test rewrites that to its own server's port and changes nothing else. Examples that send
``$SMSO_API_KEY`` go to a second server started with a key, with the key in their environment.
curl gets ``--fail-with-body``'s strictness here, not in the docs: a wrapper adds
``-sS -w '%{http_code}'`` and the test asserts a 2xx status.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.core.settings import DEFAULT_MODEL
from tests.service.test_server import real_server

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LOCAL_SERVER = re.compile(r"(?:127\.0\.0\.1|localhost):8000\b")
FENCE = re.compile(r"^```(\w*)\s*$")
# what each example image is (examples/README.md): its top-1 label through the shipped model
LABELS = {"boot.png": "Ankle boot", "shirt.jpg": "Shirt", "bag.webp": "Bag"}
MODEL_NAME = "fashion_mnist-small_cnn-smso"
# curl examples addressed elsewhere than the shipped model's server, and why this test skips them
ELSEWHERE = {
    "127.0.0.1:8003": "docs/training.md's own-images server on a model trained there: "
    "tests/test_own_images_readme.py runs that section as printed",
    "127.0.0.1:8002": "docs/model-repository.md's server on a folder of models: "
    "tests/test_repository_readme.py runs that page as printed",
}
#: pages whose Python examples need neither a server nor a dataset: each runs as printed
STANDALONE = [ROOT / "docs" / "training.md"]
API_KEY = "docs-example-key"
# curl as the docs call it, plus: errors shown, the status on a last line of its own
CURL_WRAPPER = "curl() { command curl -sS -w '\\n%{http_code}\\n' \"$@\"; }\n"
# nothing may leave the machine: a proxy that refuses everything but loopback
OFFLINE = {
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "no_proxy": "127.0.0.1,localhost",
    "NO_PROXY": "127.0.0.1,localhost",
}


@dataclass(frozen=True)
class Example:
    """One runnable example: where it is printed, its language and its text as printed."""

    where: str  # "docs/oip.md:88", the line where it starts
    language: str  # "bash" or "python"
    code: str

    @property
    def skip_reason(self) -> str | None:
        return next((why for where, why in ELSEWHERE.items() if where in self.code), None)

    @property
    def needs_key(self) -> bool:
        return "$SMSO_API_KEY" in self.code

    @property
    def images(self) -> list[str]:
        """The example images it sends, in order (``@examples/boot.png``, ``open("...")``,
        ``base64 -w0 examples/...``)."""
        return re.findall(r"examples/([\w.-]+\.(?:png|jpg|webp))", self.code)


def _blocks(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """Each fenced block of a markdown file: (line of its first code line, language, lines)."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        yield i + 2, opening.group(1), lines[i + 1 : end]
        i = end + 1


def _complete(command: str) -> bool:
    """Whether a shell command is whole: no trailing backslash, no quote left open."""
    if command.endswith("\\"):
        return False
    try:
        shlex.split(command, comments=True)
    except ValueError:  # "No closing quotation"
        return False
    return True


def _shell_commands(first: int, lines: list[str]) -> Iterator[tuple[int, str]]:
    """The block's commands with their continuation lines (a backslash or an open quote)."""
    i = 0
    while i < len(lines):
        start, command = i, lines[i]
        while not _complete(command) and i + 1 < len(lines):
            i += 1
            command += "\n" + lines[i]
        i += 1
        yield first + start, command


def collect() -> list[Example]:
    examples = []
    for path in DOCUMENTS:
        name = path.relative_to(ROOT).as_posix()
        for first, language, lines in _blocks(path):
            if language in ("bash", "sh"):
                for line, command in _shell_commands(first, lines):
                    if command.lstrip().startswith("curl "):
                        examples.append(Example(f"{name}:{line}", "bash", command))
            elif language == "python" and LOCAL_SERVER.search("\n".join(lines)):
                examples.append(Example(f"{name}:{first}", "python", "\n".join(lines) + "\n"))
    return examples


EXAMPLES = collect()


def test_the_docs_hold_the_examples_this_test_runs():
    """A change in the docs' layout (a fence this test does not read) must not leave it running
    nothing: the README's quick start, the API key's and the protocol's examples are all found."""
    where = [e.where.split(":")[0] for e in EXAMPLES]
    assert where.count("README.md") >= 7  # six curl lines and the tritonclient example
    assert where.count("docs/deployment.md") >= 3
    assert where.count("docs/oip.md") >= 3
    assert any(e.needs_key for e in EXAMPLES)
    for example in EXAMPLES:
        addressed = LOCAL_SERVER.search(example.code) or example.skip_reason
        assert example.language == "python" or addressed, f"{example.where}: which server?"
        for image in example.images:
            assert image in LABELS, f"{example.where}: examples/{image} is not an example image"
            assert (ROOT / "examples" / image).is_file(), f"{example.where}: {image} missing"


def examples_gallery(folder: Path) -> Path:
    """A gallery of examples/ through the shipped model, as README.md's commands build one."""
    from batch.cli import main as embed
    from batch.index_cli import main as index

    out, gallery = folder / "embedded", folder / "gallery"
    assert embed([str(DEFAULT_MODEL), str(ROOT / "examples"), "-o", str(out), "--no-progress"]) == 0
    assert index([str(out), "-o", str(gallery)]) == 0
    return gallery


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[bool, str]]:
    """{False: the shipped model's server, True: the same with SMSO_API_KEY set}, both real,
    with a gallery of examples/ for /search."""
    if not DEFAULT_MODEL.is_file():
        pytest.fail(f"{DEFAULT_MODEL} is missing: the repository ships it (make onnx)")
    gallery = ("--gallery", str(examples_gallery(tmp_path_factory.mktemp("search"))))
    env = os.environ | OFFLINE
    keyed = env | {"SMSO_API_KEY": API_KEY}
    with (
        real_server(str(DEFAULT_MODEL), *gallery, env=env) as (open_base, _),
        real_server(str(DEFAULT_MODEL), *gallery, env=keyed) as (keyed_base, _),
    ):
        yield {False: open_base, True: keyed_base}


def _run(example: Example, base: str) -> subprocess.CompletedProcess[str]:
    code = LOCAL_SERVER.sub(base.removeprefix("http://"), example.code)
    env = os.environ | OFFLINE | ({"SMSO_API_KEY": API_KEY} if example.needs_key else {})
    if example.language == "python":
        command, script = [sys.executable, "-"], code
    else:
        command, script = ["bash", "-e", "-o", "pipefail", "-s"], CURL_WRAPPER + code
    return subprocess.run(
        command, input=script, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def _check_json(example: Example, body: object) -> None:
    """What a JSON answer must hold: the example images' labels, the model's name."""
    expected = [LABELS[image] for image in example.images]
    assert isinstance(body, dict), body
    if "results" in body:  # /classify, /embed, /search
        assert len(body["results"]) == len(expected), body
        for result, label in zip(body["results"], expected, strict=True):
            if "neighbours" in result:  # the image is in the gallery: itself first
                assert result["prediction"]["label"] == label, result
                first = result["neighbours"][0]
                assert first["label"] == label, result
                assert first["similarity"] >= 0.999, result
            elif "predictions" in result:
                assert result["predictions"][0]["label"] == label, result
            else:
                assert len(result["embedding"]) == body["dim"] == 64, body
    elif "outputs" in body:  # the protocol's infer, the classification extension
        (logits,) = [o for o in body["outputs"] if o["name"] == "logits"]
        n, k = logits["shape"]
        top1 = [logits["data"][i * k].split(":", 2)[2] for i in range(n)]
        assert top1 == expected, logits
    elif "card" in body:  # /metadata
        assert body["model"]["name"] == MODEL_NAME
        assert "Ankle boot" in body["card"]["classes"]
    else:  # the protocol's model metadata
        assert body["name"] == MODEL_NAME, body


def _check_curl(example: Example, stdout: str) -> None:
    body, _, status = stdout.rstrip("\n").rpartition("\n")
    assert status.isdigit(), stdout
    assert 200 <= int(status) < 300, f"HTTP {status}: {body}"
    path = LOCAL_SERVER.split(example.code, maxsplit=1)[1].split()[0].strip("'\"")
    if path.startswith("/metrics"):
        assert "smso_http_requests_total" in body
    elif path.startswith("/readyz") or path.startswith("/healthz"):
        pass  # the status says it
    else:
        _check_json(example, json.loads(body))


def _check_python(example: Example, stdout: str) -> None:
    """The tritonclient examples print the classification strings "score:index:label", best
    first, k per image: the first of each image's k is its label. The OpenAI client's example
    prints the embedding's length."""
    if "from openai import OpenAI" in example.code:
        assert stdout.split() == ["64"], stdout
        return
    expected = [LABELS[image] for image in example.images]
    found = re.findall(r"b'[-+.\deE]+:\d+:([^']*)'", stdout)
    assert expected, f"{example.where} sends no example image"
    assert found, stdout
    assert len(found) % len(expected) == 0, stdout
    k = len(found) // len(expected)
    assert found[::k] == expected, stdout


PARAMS = [
    pytest.param(
        e, id=e.where, marks=[pytest.mark.skip(reason=e.skip_reason or "")] * bool(e.skip_reason)
    )
    for e in EXAMPLES
]


@pytest.mark.slow  # two real servers start (a few seconds on 2 cores)
@pytest.mark.parametrize("example", PARAMS)
def test_the_example_runs_as_printed_and_answers_what_its_image_is(example, servers):
    done = _run(example, servers[example.needs_key])
    assert done.returncode == 0, f"{example.where} failed:\n{done.stdout}\n{done.stderr}"
    if example.language == "python":
        _check_python(example, done.stdout)
    else:
        _check_curl(example, done.stdout)


def standalone_examples() -> list[Example]:
    """The Python blocks of the :data:`STANDALONE` pages."""
    return [
        Example(f"{path.relative_to(ROOT).as_posix()}:{first}", language, "\n".join(lines) + "\n")
        for path in STANDALONE
        for first, language, lines in _blocks(path)
        if language == "python"
    ]


def test_the_training_page_holds_its_two_python_examples():
    assert [e.where.split(":")[0] for e in standalone_examples()] == ["docs/training.md"] * 2


@pytest.mark.slow  # a ResNet-50 forward pass at 448 px: seconds on 2 cores
@pytest.mark.parametrize("example", standalone_examples(), ids=lambda e: e.where)
def test_the_python_example_runs_as_printed(example, tmp_path):
    """In a temporary folder (the examples write ``runs/demo/``), offline."""
    done = subprocess.run(
        [sys.executable, "-"],
        input=example.code,
        cwd=tmp_path,
        env=os.environ | OFFLINE,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{example.where} failed:\n{done.stdout}\n{done.stderr}"
