"""The real server (smso-serve, uvicorn, the shipped ONNX model): answers, drains on SIGTERM,
refuses bad settings in one line."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.cli import main
from service.core.settings import Settings

from .conftest import FASHION_MNIST as DEFAULT_ROOT
from .conftest import free_port, png, process_running, read_idx, wait_http_ready, wait_ready

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def real_server(
    model: str, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``smso-serve`` on a free port, ready: ``(base URL, process)``; killed if still running."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "--model-path", model, "--port", str(port), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = server.stdout
    assert output is not None  # stdout=PIPE
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(base, lambda: None if server.poll() is None else output.read())
        yield base, server
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if server.stdout is not None:
            server.stdout.close()


def test_the_shipped_model_classifies_real_fashion_mnist_images(shipped_model):
    images = read_idx(DEFAULT_ROOT / "t10k-images-idx3-ubyte.gz")[:64]
    labels = read_idx(DEFAULT_ROOT / "t10k-labels-idx1-ubyte.gz")[:64]
    files = [("file", (f"{i}.png", png(image), "image/png")) for i, image in enumerate(images)]
    with TestClient(create_app(Settings(model_path=shipped_model, max_batch_size=8))) as client:
        wait_ready(client)
        body = client.post("/classify", files=files, params={"top_k": 1}).json()
        card = client.get("/metadata").json()["card"]
    predicted = [r["predictions"][0]["index"] for r in body["results"]]
    accuracy = float(np.mean(np.asarray(predicted) == labels))
    assert accuracy >= 0.85  # the model's test accuracy is about 0.93
    assert card["metrics"]["test_accuracy"] >= 0.9
    assert body["results"][0]["predictions"][0]["label"] == card["classes"][predicted[0]]


@pytest.mark.slow
def test_sigterm_finishes_the_requests_in_flight_and_exits(shipped_model):
    env = os.environ | {"SMSO_MAX_WAIT_MS": "1000", "SMSO_MAX_BATCH_SIZE": "8"}
    with real_server(shipped_model, env=env) as (base, server):
        image = png(np.full((28, 28), 128, np.uint8))

        def post(i: int) -> int:
            files = [("file", (f"{i}.png", image, "image/png"))]
            return httpx.post(f"{base}/classify", files=files, timeout=30).status_code

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(post, i) for i in range(6)]
            # signal only once the server holds all six requests (decoded, waiting in the
            # batcher for up to a second): a loaded machine may take a while to deliver them
            deadline = time.monotonic() + 30
            while "smso_decode_seconds_count 6.0" not in httpx.get(f"{base}/metrics").text:
                assert time.monotonic() < deadline, "the requests never reached the server"
                time.sleep(0.01)
            server.send_signal(signal.SIGTERM)
            statuses = [f.result() for f in futures]
        assert statuses == [200] * 6  # none lost
        # a clean stop: status 0, not killed by the signal uvicorn raises again once it is done
        assert server.wait(timeout=60) == 0


def _smso_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``smso-serve ARGS`` run to its end (a refusal: it never serves), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SMSO_MAX_BATCH_SIZE", "abc", "'abc': Input should be a valid integer, unable to parse"),
        # a blank key holds no secret: shown as given, without pydantic's "Value error, "
        ("SMSO_API_KEY", "  ", "'  ': api_key is empty; unset it to run without"),
        ("SMSO_REQUEST_TIMEOUT_S", "inf", "'inf': Input should be a finite number"),
        ("SMSO_HEADER_TIMEOUT_S", "nan", "'nan': Input should be a finite number"),
        ("SMSO_REQUEST_TIMEOUT_S", "1e12", "'1e12': Input should be less than or equal to 86400"),
    ],
)
def test_a_bad_environment_setting_is_named_as_the_variable_with_its_value(
    variable, value, message, shipped_model
):
    proc = _smso_serve("--model-path", shipped_model, env={**os.environ, variable: value})
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"smso-serve: error: {variable}={message}")
    assert proc.stderr.count("\n") == 1


def test_a_real_api_key_is_never_repeated_in_a_message(shipped_model):
    """A key that is refused for another setting's sake is still not shown."""
    secret = {"SMSO_API_KEY": "s3cret-value", "SMSO_MAX_BATCH_SIZE": "x"}
    proc = _smso_serve("--model-path", shipped_model, env={**os.environ, **secret})
    assert proc.returncode == 2
    assert "s3cret-value" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model-path", "/nonexistent/model.onnx"], "does not exist"),
        (
            ["--max-batch-size", "0"],
            "--max-batch-size '0': Input should be greater than or equal to 1",
        ),
        (["--port", "http"], "--port 'http': Input should be a valid integer"),
        (["--gallery", "/nonexistent/gallery"], "gallery /nonexistent/gallery does not exist"),
        (["--providers", "NoSuchExecutionProvider"], "not available"),
        (["--workers", "2", "--providers", "NoSuchExecutionProvider"], "not available"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(args, message, shipped_model):
    if args[0] != "--model-path":
        args = ["--model-path", shipped_model, *args]
    proc = _smso_serve(*args)
    assert proc.returncode == 2
    assert proc.stderr.startswith("smso-serve: error:")
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_file_that_is_not_an_exported_model_is_refused(tmp_path):
    bogus = tmp_path / "model.onnx"
    bogus.write_bytes(b"not onnx")
    proc = _smso_serve("--model-path", str(bogus))
    assert proc.returncode == 2
    assert "not a loadable ONNX model" in proc.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_model_whose_first_run_never_ends_is_one_line_and_exit_2(tmp_path, workers):
    """smso-serve runs the model once before it serves: one that never ends (an ONNX ``Loop``
    of 2**62 iterations) is stopped at the load deadline and refused, rather than a server
    that never starts (it hung until killed)."""
    from tests.service.models.graphs import ENDLESS, model_file

    endless = model_file(tmp_path / "model.onnx", loop=ENDLESS)
    flags = ["--load-timeout-s", "2", "--workers", workers, "--grpc-port", "0"]
    proc = _smso_serve("--model-path", str(endless), *flags)
    assert proc.returncode == 2
    assert "did not finish its first run within 2 s (SMSO_LOAD_TIMEOUT_S" in proc.stderr
    assert "Traceback" not in proc.stderr


def _workers_ready(base: str) -> None:
    """Ten fresh connections in a row find a ready worker: new connections are spread over
    the workers by the kernel, and each worker warms up on its own."""
    deadline, streak = time.monotonic() + 60, 0
    while streak < 10:
        assert time.monotonic() < deadline, "a worker never became ready"
        ok = httpx.get(f"{base}/readyz", headers={"Connection": "close"}).status_code == 200
        streak = streak + 1 if ok else 0
        time.sleep(0.02)


def _post_once_loaded(base: str, name: str, image: bytes) -> httpx.Response:
    """POST one image to /classify on a fresh connection (spread over the workers), again
    while the worker that takes it is still loading (503 ``not_ready``): a worker that
    started after the others were ready may still be warming up."""
    deadline = time.monotonic() + 60
    while True:
        answer = httpx.post(
            f"{base}/classify",
            files=[("file", (name, image, "image/png"))],
            headers={"Connection": "close"},
            timeout=30,
        )
        loading = answer.status_code == 503 and answer.json()["error"]["code"] == "not_ready"
        if not loading or time.monotonic() > deadline:
            return answer
        time.sleep(0.1)


@pytest.mark.slow
def test_several_workers_share_the_port_and_their_metrics(shipped_model):
    """--workers 2: two processes answer on one port, /metrics counts the requests of both,
    SIGTERM stops them all."""
    with real_server(shipped_model, "--workers", "2", "--log-level", "warning") as (base, server):
        image = png(np.full((28, 28), 128, np.uint8))
        _workers_ready(base)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(
                pool.map(lambda i: _post_once_loaded(base, f"{i}.png", image), range(20))
            )
        assert [answer.status_code for answer in answers] == [200] * 20
        metrics = httpx.get(f"{base}/metrics").text
        assert re.search(
            r'smso_images_total\{model="[^"]+",route="/classify",version="[^"]+"\} 20.0', metrics
        )
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0


def _children(pid: int) -> dict[int, str]:
    """The processes whose parent is ``pid``: their names (``/proc/<pid>/comm``)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            name, rest = stat.read_text().rsplit(")", 1)
            if int(rest.split()[1]) == pid:
                found[int(stat.parent.name)] = name.split("(", 1)[1]
    return found


def test_workers_stop_when_their_parent_is_killed(shipped_model):
    """SIGKILL to the supervising process (the OOM killer, a test's kill()): its workers see
    it gone, drain and exit, instead of serving its port with nobody to stop them."""
    with real_server(shipped_model, "--workers", "2", "--log-level", "warning") as (base, server):
        _workers_ready(base)
        workers = list(_children(server.pid))  # the two workers, and the resource tracker
        assert len(workers) >= 2
        server.kill()
        server.wait()
        deadline = time.monotonic() + 30
        while any(process_running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(process_running(pid) for pid in workers)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{base}/healthz", timeout=5)


@pytest.mark.slow
def test_several_workers_can_share_one_session_host(shipped_model):
    """--workers 2 --shared-session true: a host process (named smso-host) runs both workers'
    batches (the stages show its share), the answers are the model's, and SIGTERM stops the
    workers, then the host."""
    args = ("--workers", "2", "--shared-session", "true", "--log-level", "warning")
    with real_server(shipped_model, *args) as (base, server):
        _workers_ready(base)
        hosts = [pid for pid, name in _children(server.pid).items() if name == "smso-host"]
        assert len(hosts) == 1
        images = read_idx(DEFAULT_ROOT / "t10k-images-idx3-ubyte.gz")[:8]
        labels = read_idx(DEFAULT_ROOT / "t10k-labels-idx1-ubyte.gz")[:8]

        def classify(i: int) -> httpx.Response:
            return _post_once_loaded(base, f"{i}.png", png(images[i % 8]))

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(classify, range(24)))
        assert [a.status_code for a in answers] == [200] * 24
        top = [a.json()["results"][0]["predictions"][0]["index"] for a in answers]
        assert sum(t == labels[i % 8] for i, t in enumerate(top)) >= 18  # the model's answers
        metrics = httpx.get(f"{base}/metrics").text
        for stage in ("handoff", "share", "run"):
            series = rf'smso_inference_stage_seconds_count\{{[^}}]*stage="{stage}"'
            assert re.search(series, metrics), stage
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    assert not process_running(hosts[0])


@pytest.mark.slow
def test_a_session_host_that_dies_stops_the_server_with_status_1(shipped_model):
    """The host killed while serving: the workers are stopped (their batches could only fail)
    and the server exits with status 1, for a supervisor to restart it."""
    args = ("--workers", "2", "--shared-session", "true", "--log-level", "error")
    with real_server(shipped_model, *args) as (base, server):
        _workers_ready(base)
        (host,) = [pid for pid, name in _children(server.pid).items() if name == "smso-host"]
        os.kill(host, signal.SIGKILL)
        assert server.wait(timeout=60) == 1
        assert server.stdout is not None  # stdout=PIPE
        assert "the session host exited while serving" in server.stdout.read()


def serve_on_a_taken_port(
    model: str, flag: str, *args: str, env: dict[str, str] | None = None
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """``smso-serve`` with ``flag`` (``--port`` or ``--grpc-port``) naming a port another socket
    listens on (the other port free): ``(that port, the finished process)``."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        ports = [flag, port] if flag == "--port" else ["--port", str(free_port()), flag, port]
        proc = _smso_serve("--model-path", model, *ports, *args, env=env)
    return port, proc


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_busy_port_is_one_line_and_exit_2(workers, shipped_model):
    """uvicorn would log the error and exit with status 3 itself; smso-serve binds first."""
    port, proc = serve_on_a_taken_port(shipped_model, "--port", "--workers", workers)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"smso-serve: error: cannot listen on 127.0.0.1:{port} (HTTP)")
    assert "another smso-serve may already be running" in lines[0]
    assert re.search(r"SMSO_PORT=\d+ .*make serve, or smso-serve --port \d+", lines[0])
    assert proc.stdout == ""


def test_a_misspelt_setting_is_named_with_the_setting_meant(shipped_model):
    """Unknown SMSO_ variables are ignored by the settings: smso-serve says so at start-up."""
    env = os.environ | {"SMSO_MAX_BATCH": "8", "SMSO_SERVICE_HOST": "10.0.0.1"}
    _, proc = serve_on_a_taken_port(shipped_model, "--port", env=env)
    assert proc.returncode == 2  # stopped at the taken port, after the warning
    warnings = [line for line in proc.stderr.splitlines() if "is not a setting" in line]
    assert len(warnings) == 1, proc.stderr  # Kubernetes' service links are not named
    assert "SMSO_MAX_BATCH is not a setting of smso-serve and is ignored" in warnings[0]
    assert "did you mean SMSO_MAX_BATCH_SIZE?" in warnings[0]
    assert "'8'" not in warnings[0]  # a value (it might be a secret) is never repeated


def test_several_workers_leave_the_environment_as_they_found_it(shipped_model):
    """--workers hands its flags and the metrics folder to the workers through the environment;
    main() puts it back when it returns (here at once: the port is taken). A metrics folder
    that no longer exists, left in the environment, would fail every later /metrics."""
    before = dict(os.environ)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        args = ["--model-path", shipped_model, "--workers", "2", "--port", port]
        assert main([*args, "--max-batch-size", "8"]) == 2
    assert dict(os.environ) == before


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigterm_loses_no_request_sent_on_a_keep_alive_connection(workers, shipped_model):
    """Sixteen clients each keep one connection and send on it with short pauses (so that most
    connections are idle when SIGTERM comes); http.client, unlike httpx, does not probe a
    connection before reusing it. Every request sent on an open connection is answered: the
    server keeps idle connections open while draining and its responses say Connection: close.
    The only failure allowed is a refused new connection once the server stopped listening.
    With several workers, each worker drains so, and the supervisor stops listening too."""
    args = ("--log-level", "warning", "--workers", workers)
    with real_server(shipped_model, *args) as (base, server):
        port = int(base.rsplit(":", 1)[1])
        lost: list[str] = []
        closing: list[int] = []
        connected = [threading.Event() for _ in range(16)]

        def client(i: int) -> int:
            answered = 0
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            reconnecting = False  # after a Connection: close, http.client connects anew
            try:
                while True:
                    try:
                        conn.request("GET", "/healthz")
                        response = conn.getresponse()
                        response.read()
                    except ConnectionRefusedError:
                        return answered  # stopped listening: refused, never accepted
                    except (OSError, http.client.HTTPException) as error:
                        where = "new" if reconnecting or not answered else "kept-alive"
                        lost.append(f"client {i} after {answered}, {where} connection: {error!r}")
                        return answered
                    assert response.status == 200
                    answered += 1
                    connected[i].set()
                    if response.will_close:
                        closing.append(i)
                        reconnecting = True
                    time.sleep(0.05)
            finally:
                connected[i].set()  # (a client that failed does not hold the test up)
                conn.close()

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(client, i) for i in range(16)]
            # SIGTERM once every client has its connection and an answer on it (a fixed pause
            # could come before a slow machine had connected them all)
            for event in connected:
                assert event.wait(60), "a client never got its first answer"
            time.sleep(0.3)  # a few more requests each, most connections idle between them
            server.send_signal(signal.SIGTERM)
            answered = [f.result(timeout=60) for f in futures]
        assert lost == []
        assert min(answered) > 0
        assert len(set(closing)) == 16  # the drain told every client
        assert server.wait(timeout=60) == 0


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` within ``seconds`` (whatever it sends first)."""
    sock.settimeout(seconds)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if sock.recv(65536) == b"":
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return False


@pytest.mark.slow
def test_slow_headers_slow_bodies_and_too_many_connections_are_bounded(shipped_model):
    """Connections that never finish their headers (or send nothing) are closed after
    --header-timeout-s, a body that trickles in after --request-timeout-s; connections take
    no place among --max-connections (requests in progress), so the health checks are answered
    throughout."""
    # bounds far enough apart that a slow machine's pauses do not blur which one closed what
    args = ("--header-timeout-s", "3", "--request-timeout-s", "8", "--max-connections", "40")
    with real_server(shipped_model, *args) as (base, server):
        port = int(base.rsplit(":", 1)[1])
        start = time.monotonic()
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
        headers = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        for sock in headers:
            sock.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n")
        bodies = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
        for sock in bodies:
            sock.sendall(
                b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                b"Content-Length: 100000\r\n\r\n" + b"\x89PNG"
            )
        others = [socket.create_connection(("127.0.0.1", port)) for _ in range(15)]
        # 45 connections open, more than the limit of 40 requests in progress: still answered
        assert httpx.get(f"{base}/healthz").status_code == 200
        assert all(_closed_within(s, 6.5) for s in silent + headers + others)
        assert time.monotonic() - start < 6.5  # the header bound (3 s), not the deadline (8 s)
        assert all(_closed_within(s, 12) for s in bodies)
        assert time.monotonic() - start < 12
        assert httpx.get(f"{base}/healthz").status_code == 200
        for sock in silent + headers + bodies + others:
            sock.close()
        assert server.poll() is None


def test_a_worker_stops_on_its_supervisors_sigterm_and_not_on_the_groups_sigint():
    """A worker's server acts on SIGTERM only: the group's SIGINT (a terminal's Ctrl-C) and
    then the supervisor's SIGTERM would otherwise be two signals, uvicorn's "force quit" (no
    drain, the app's shutdown skipped). The single process stops on either, once."""
    from service.cli import _Server
    from service.http.connections import ServerConfig

    def config() -> ServerConfig:
        return ServerConfig(None, header_timeout_s=5.0, body_timeout_s=5.0)

    worker = _Server(config(), on_drain=None, stop_signals=(signal.SIGTERM,))
    worker.handle_exit(signal.SIGINT, None)
    assert not worker.should_exit
    worker.handle_exit(signal.SIGTERM, None)
    worker.handle_exit(signal.SIGINT, None)
    assert worker.should_exit
    assert not worker.force_exit
    alone = _Server(config(), on_drain=None)
    alone.handle_exit(signal.SIGINT, None)
    assert alone.should_exit
    assert not alone.force_exit


def test_a_ctrl_c_before_the_server_takes_the_signals_ends_it_without_a_traceback():
    """Ctrl-C while smso-serve checks the model (before uvicorn handles signals) ends it as the
    signal does (status -2 to its parent, nothing for make to call an error), with no
    traceback on stderr."""
    script = (
        "import service.cli as cli\n"
        "def interrupted(argv):\n"
        "    raise KeyboardInterrupt\n"
        "cli._main = interrupted\n"
        "cli.main([])\n"
    )
    ended = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert ended.returncode == -signal.SIGINT
    assert "Traceback" not in ended.stderr, ended.stderr


def test_malloc_arenas_are_capped_unless_the_environment_says(monkeypatch):
    """glibc takes the cap (mallopt answers 1), and the worker processes get it from their
    start through ``MALLOC_ARENA_MAX``, unless the user set that variable (then it is theirs)."""
    import ctypes

    from service.cli import _M_ARENA_MAX, MALLOC_ARENAS, _arenas_for_workers

    assert ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, MALLOC_ARENAS) == 1
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert _arenas_for_workers() == {"MALLOC_ARENA_MAX": str(MALLOC_ARENAS)}
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert _arenas_for_workers() == {}
