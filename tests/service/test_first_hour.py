"""What a new user meets first: the address is printed once the port takes connections and a
line once the service is ready, ``GET /`` leads to the docs, the docs work offline, a raw-body
image can name itself, and ``make serve`` stops quietly on Ctrl-C and SIGTERM."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path

import httpx
import pytest

from .conftest import free_port, grey, wait_http_ready

ROOT = Path(__file__).resolve().parents[2]
CONTENT_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png"}


class _Lines:
    """A process's output, line by line, as it comes (read by a thread: no read blocks)."""

    def __init__(self, stream: typing.IO[str]) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.stream = stream
        self.reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.reader.start()

    def close(self) -> None:
        """Once the process has exited: its output read to the end, the pipe closed."""
        self.reader.join(timeout=30)
        self.stream.close()

    def _read(self, stream: typing.IO[str]) -> None:
        for line in stream:
            self.lines.put(line)
        self.lines.put(None)

    def until(self, text: str, timeout_s: float = 120) -> str:
        """The first line from now on that holds ``text``."""
        deadline = time.monotonic() + timeout_s
        while True:
            line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            assert line is not None, f"the server exited before saying {text!r}: {self.seen}"
            self.seen.append(line)
            if text in line:
                return line


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_address_is_printed_once_the_port_takes_connections(shipped_model, workers):
    """The start-up line says where to go only once a connection to the port succeeds (with
    ``--workers``, the supervisor listens before the workers have loaded their models: the
    connections wait for them instead of being refused), and a second line says when the
    service is ready: /readyz answers 200 from then on."""
    port = free_port()
    args = ["--model-path", shipped_model, "--port", str(port), "--grpc-port", "0"]
    server = subprocess.Popen(
        [sys.executable, "-m", "service.cli", *args, "--workers", workers],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stderr is not None  # stderr=PIPE
    output = _Lines(server.stderr)
    try:
        said = output.until("SMSO service listening on")
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the port takes connections once the line is out
        assert f"http://127.0.0.1:{port}, no gRPC - API docs at" in said
        ready = output.until("SMSO service ready:")
        assert f"http://127.0.0.1:{port}/readyz answers 200" in ready
        readyz = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=30)
        assert readyz.status_code == 200
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        output.close()


def _local_urls(html: str) -> list[str]:
    """Every URL the page loads: src and href attributes, and Swagger UI's or ReDoc's schema."""
    urls = re.findall(r'(?:src|href)="([^"]*)"', html)
    urls += re.findall(r"url: '([^']*)'", html) + re.findall(r'spec-url="([^"]*)"', html)
    return urls


@pytest.mark.parametrize("settings", [{}, {"api_key": "s3cret", "docs_public": True}])
@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_load_only_local_files_that_the_server_has(make_client, settings, page):
    client = make_client(**settings)
    html = client.get(page).text
    assert "://" not in html, "the page loads something from another host"
    urls = _local_urls(html)
    assert "/openapi.json" in urls
    assert len(urls) >= 3  # the schema, the script and the favicon (and Swagger UI's style)
    for url in urls:
        assert url.startswith("/"), url
        response = client.get(url)
        assert response.status_code == 200, url
        if url != "/openapi.json":
            kind = CONTENT_TYPES[Path(url).suffix]
            assert kind in response.headers["content-type"], (url, response.headers)
            assert len(response.content) > 1000 or kind == "image/png", url


@pytest.mark.parametrize("settings", [{}, {"api_key": "s3cret", "docs_public": True}])
def test_the_root_redirects_to_the_docs_where_they_are_served(make_client, settings):
    client = make_client(**settings)
    response = client.get("/", follow_redirects=False)
    assert response.status_code in (302, 307)
    assert response.headers["location"] == "/docs"
    assert client.get("/", follow_redirects=True).status_code == 200


def test_with_an_api_key_the_root_and_the_docs_files_are_unknown_paths(make_client):
    client = make_client(api_key="s3cret")
    key = {"X-API-Key": "s3cret"}  # the docs stay closed to key holders too, as before
    for path in ["/", "/docs", "/redoc", "/docs-assets/swagger-ui-bundle.js", "/openapi.json"]:
        for headers in ({}, key):
            response = client.get(path, headers=headers, follow_redirects=False)
            assert response.status_code == 404, path
            assert response.json()["error"]["code"] == "not_found", path


@pytest.mark.parametrize(
    ("params", "headers", "name"),
    [
        ({}, {}, "body"),
        ({"filename": "boot.png"}, {}, "boot.png"),
        ({}, {"Content-Disposition": 'inline; filename="shirt.png"'}, "shirt.png"),
        ({}, {"Content-Disposition": "attachment; filename=coat.png"}, "coat.png"),
        ({}, {"Content-Disposition": "inline; filename*=UTF-8''na%C3%AFve.png"}, "naïve.png"),
        ({}, {"Content-Disposition": "inline"}, "body"),
        (
            {"filename": "query.png"},
            {"Content-Disposition": 'inline; filename="h.png"'},
            "query.png",
        ),
    ],
)
def test_a_raw_body_can_name_itself(make_client, params, headers, name):
    client = make_client()
    for route in ("/classify", "/embed"):
        response = client.post(
            route,
            content=grey(100),
            params=params,
            headers={"Content-Type": "image/png", **headers},
        )
        assert response.status_code == 200, response.text
        assert response.json()["results"][0]["filename"] == name


@pytest.mark.parametrize(
    ("params", "headers", "problem"),
    [
        ({"filename": ""}, {}, "is empty"),
        ({"filename": "x" * 256}, {}, "at most 255"),
        ({"filename": "a\x00b.png"}, {}, "control characters"),
        ({"filename": "a\nb.png"}, {}, "control characters"),
        ({}, {"Content-Disposition": 'inline; filename=""'}, "is empty"),
        ({}, {"Content-Disposition": "inline; filename*=UTF-8''a%07b.png"}, "control characters"),
        ({}, {"Content-Disposition": f'inline; filename="{"y" * 300}"'}, "at most 255"),
    ],
)
def test_a_bad_name_is_422_and_says_what_is_wrong(make_client, params, headers, problem):
    response = make_client().post(
        "/classify",
        content=grey(100),
        params=params,
        headers={"Content-Type": "image/png", **headers},
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_filename"
    assert problem in error["message"]
    where = "?filename=" if params else "Content-Disposition"
    assert where in error["message"]


def test_a_name_of_the_longest_length_is_kept(make_client):
    name = "é" * 251 + ".png"
    response = make_client().post(
        "/classify",
        content=grey(100),
        params={"filename": name},
        headers={"Content-Type": "image/png"},
    )
    assert response.json()["results"][0]["filename"] == name


def test_the_filename_parameter_is_documented(make_client):
    operation = make_client().get("/openapi.json").json()["paths"]["/classify"]["post"]
    names = [p["name"] for p in operation["parameters"]]
    assert names == ["top_k", "filename"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_make_serve_says_where_to_go_and_stops_quietly(tmp_path, shipped_model, sig):
    """``make serve`` in its own process group, signalled as a terminal's Ctrl-C (SIGINT to the
    group) or as ``docker stop``/systemd do (SIGTERM): smso-serve drains and exits 0, so make
    prints no "Interrupt" or "Error" line. make itself then ends by the signal it got, as any
    program a terminal interrupts (a shell prints nothing for it)."""
    venv = tmp_path / "venv"  # the development venv's smso-serve, as `make serve` would install
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "smso-serve").symlink_to(Path(sys.executable).parent / "smso-serve")
    (venv / ".installed-serving-cpu").touch()  # newer than pyproject.toml: no install
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    env |= {"SMSO_PORT": str(port), "SMSO_MODEL_PATH": shipped_model}  # `make test` runs this
    make = subprocess.Popen(
        ["make", "--no-print-directory", "serve", f"SERVE_VENV={venv}", "SERVE_EXTRA=serving-cpu"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    errors = make.stderr
    assert errors is not None  # stderr=PIPE
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http_ready(base, lambda: None if make.poll() is None else errors.read())
        assert httpx.get(f"{base}/").headers["location"] == "/docs"  # httpx does not follow
        time.sleep(0.2)
        os.killpg(make.pid, sig)
        _, stderr = make.communicate(timeout=60)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
    # both doors named: the HTTP address and the gRPC port (open by default)
    said = rf"SMSO service listening on {re.escape(base)}, (gRPC on 127\.0\.0\.1:\d+|no gRPC)"
    said += " - API docs at "
    assert re.search(said + re.escape(f"{base}/docs"), stderr), stderr
    assert "make:" not in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert "Finished server process" in stderr
    assert make.returncode in (0, -sig), make.returncode


def test_the_start_up_line_names_the_grpc_port_or_says_there_is_none():
    import socket

    from service.core.settings import Settings
    from service.http.listeners import where_to_go

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        assert where_to_go(Settings(grpc_port=9001), listener).startswith(
            f"http://127.0.0.1:{port}, gRPC on 127.0.0.1:9001 - API docs at"
        )
        assert ", no gRPC - " in where_to_go(Settings(grpc_port=0), listener)
