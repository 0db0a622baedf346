"""bench.lib: the launcher, the load driver, the report writer and the metrics reader, against
small servers made here (no service, no model)."""

from __future__ import annotations

import http.server
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from bench.lib import launch, load, metrics, procfs, report, timing
from bench.lib.payloads import Body, infer_body, multipart_body


def test_markdown_table_pads_and_right_aligns_numbers() -> None:
    table = report.markdown_table(["name", "ms"], [["a", "1.50"], ["long", "-"]])
    assert table.splitlines() == [
        "| name |   ms |",
        "|------|-----:|",
        "| a    | 1.50 |",
        "| long |    - |",
    ]


@pytest.mark.parametrize(
    ("one_call_s", "max_repeats", "budget_s", "expected"),
    [
        (0.01, 15, 1.5, 15),  # fast: as many as allowed
        (0.3, 15, 1.5, 5),  # fills the budget
        (0.9, 15, 1.5, 3),  # at least 3 when a call is not slow
        (2.0, 15, 1.5, 1),  # slow: the budget asks for 1
        (2.0, 15, 10.0, 3),  # slow: at most 3
        (0.01, 1, 0.0, 1),  # never above max_repeats
    ],
)
def test_repeat_count(one_call_s: float, max_repeats: int, budget_s: float, expected: int) -> None:
    policy = timing.TimingPolicy(max_repeats=max_repeats, budget_s=budget_s)
    assert timing.repeat_count(one_call_s, policy) == expected


def test_resolve_device_auto_picks_cuda_only_where_there_is_one() -> None:
    import torch

    from bench.lib import torch_device

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert torch_device.resolve_device("auto").type == expected
    with pytest.raises(SystemExit, match="cpu or cuda"):
        torch_device.resolve_device("meta")


#: The benchmarks that measure torch itself, and the one module of bench.lib they share.
TORCH = {"bench.heads", "bench.train_step", "bench.export", "bench.lib.torch_device"}


def test_the_shared_library_and_the_serving_benchmarks_import_no_torch() -> None:
    """Serving images have no torch: what measures them must not need it. Every module of
    ``bench`` and ``bench.lib`` is imported, but for :data:`TORCH`."""
    import pkgutil
    import subprocess

    import bench
    import bench.lib

    found = [f"bench.{m.name}" for m in pkgutil.iter_modules(bench.__path__)]
    found += [f"bench.lib.{m.name}" for m in pkgutil.iter_modules(bench.lib.__path__)]
    modules = sorted(set(found) - TORCH)
    assert "bench.serve" in modules
    assert "bench.lib.load" in modules
    code = f"import sys, {', '.join(modules)}; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr


def test_scrape_sums_over_labels_and_keys_stages_and_decoders() -> None:
    """The /metrics reader: samples summed over their labels, histogram buckets skipped, and
    ``stage`` / ``decoder`` values kept apart as ``name[value]``."""
    page = "\n".join(
        [
            "# HELP smso_images_decoded_total ...",
            'smso_images_decoded_total{decoder="device"} 30.0',
            'smso_images_decoded_total{decoder="pillow"} 2.0',
            'smso_inference_stage_seconds_sum{model="m",stage="run"} 1.5',
            'smso_inference_stage_seconds_bucket{le="0.1",model="m",stage="run"} 4.0',
            'smso_images_total{model="a",route="/classify"} 5.0',
            'smso_images_total{model="b",route="/classify"} 7.0',
            'smso_drift_p_value{model="a"} NaN',
        ]
    )
    values = metrics.parse(page)
    assert values["smso_images_decoded_total"] == 32.0
    assert values["smso_images_decoded_total[device]"] == 30.0
    assert values["smso_images_decoded_total[pillow]"] == 2.0
    assert values["smso_inference_stage_seconds_sum[run]"] == 1.5
    assert "smso_inference_stage_seconds_bucket" not in values
    assert values["smso_images_total"] == 12.0
    assert "smso_drift_p_value" in values


def test_interleave_alternates_and_ratios_take_the_median() -> None:
    calls: list[str] = []

    def variant(name: str, value: float) -> Callable[[], float]:
        def run() -> float:
            calls.append(name)
            return value

        return run

    runs = load.interleave({"a": variant("a", 1.0), "b": variant("b", 2.0)}, 3, alternate=True)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert runs == {"a": [1.0, 1.0, 1.0], "b": [2.0, 2.0, 2.0]}
    assert load.ratios([2.0, 4.0, 9.0], [1.0, 1.0, 3.0]) == {
        "ratio_by_round": [2.0, 4.0, 3.0],
        "ratio": 3.0,
    }


@pytest.fixture
def echo() -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    """A keep-alive HTTP server here: ``/ok`` answers 200, any other path 400; what it was sent
    (path, content type, body)."""
    seen: list[tuple[str, str, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the service

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.path, self.headers["Content-Type"], body))
            self.send_response(200 if self.path == "/ok" else 400)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_drive_counts_the_200_answers_and_the_others(echo) -> None:
    base, _ = echo
    ok = load.drive(load.multipart(f"{base}/ok", [b"JPEGDATA"]), 3, 10)
    assert (ok["requests"], ok["failures"], ok["outcomes"]) == (10, 0, {"200": 10})
    assert ok["requests_per_second"] > 0
    assert ok["p50_ms"] <= ok["p99_ms"]
    assert len(ok["latencies_ms"]) == 10
    bad = load.drive(load.post(f"{base}/no", [Body(b"x", {"Content-Type": "a/b"})]), 2, 4)
    assert (bad["requests"], bad["failures"], bad["outcomes"]) == (0, 4, {"400": 4})
    merged = load.merge([ok, ok])
    assert merged["requests"] == 20
    assert merged["rounds_rps"] == [ok["requests_per_second"]] * 2


@pytest.mark.parametrize("client", ["stdlib", "httpx"])
def test_client_processes_post_the_payloads_and_count_answers(client: str, echo) -> None:
    """What each client process runs (:func:`bench.lib.load.run_job`, called here): both HTTP
    libraries send each payload as the server expects it (a multipart JPEG, a binary tensor with
    its header), spread over the paths, and count 200s and other answers."""
    import numpy as np

    base, seen = echo
    payloads = {
        "jpeg": [multipart_body(b"JPEGDATA")],
        "fp32": [infer_body(np.zeros((1, 1, 2, 2), np.float32), {"logits": {}})],
    }
    start = time.time() + 1.0  # as a load does: its clients set up before its window opens
    job = load.Job(base, ("/ok",), "jpeg", range(0, 2), 2, None, 0.3, start, client)
    tally = load.run_job(job, payloads)
    assert len(tally.latencies) > 0
    assert set(tally.outcomes) == {"200"}
    _, kind, body = seen[-1]
    assert kind.startswith("multipart/form-data; boundary=")
    assert b'name="file"; filename="i.jpg"' in body
    assert b"\r\n\r\nJPEGDATA\r\n--" in body
    seen.clear()
    job = load.Job(base, ("/ok", "/no"), "fp32", range(1, 2), 1, 4, None, time.time(), client)
    tally = load.run_job(job, payloads)
    assert tally.outcomes == {"400": 2, "200": 1}  # requests 1, 2, 3: /no, /ok, /no
    assert [path for path, _, _ in seen] == ["/no", "/ok", "/no"]
    assert seen[0][1] == "application/octet-stream"
    assert seen[0][2] == payloads["fp32"][0].data


LEADER = """
import http.server, subprocess, sys
stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
# a child in the group that starts one leading a group of its own, as Ray's raylet starts
# its actors; and one of the server's own children that does so
parent = (
    "import subprocess, sys; "
    f"apart = subprocess.Popen([sys.executable, '-c', {stubborn!r}], start_new_session=True); "
    f"print(apart.pid, flush=True); {stubborn}"
)
child = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
grandchild = int(child.stdout.readline())
apart = subprocess.Popen([sys.executable, "-c", stubborn], start_new_session=True)
print(child.pid, apart.pid, grandchild, flush=True)
handler = http.server.SimpleHTTPRequestHandler
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), handler).serve_forever()
"""


def gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped counts as gone)."""
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


def test_the_launcher_waits_for_ready_and_stops_the_whole_group(tmp_path: Path) -> None:
    """A server that started a process which ignores SIGTERM: stopping the server stops it."""
    log = tmp_path / "server.log"
    with launch.Server([sys.executable, "-c", LEADER, "{port}"], "/", log=log, stop_s=5) as s:
        assert s.base == f"http://127.0.0.1:{s.port}"
        assert s.rss_mib()["VmRSS"] > 0
        child, apart, grandchild = map(int, log.read_text().split()[:3])
        assert not gone(child)
        group = procfs.group_memory_mib(s.pid)  # the server leads its own group
        assert group["processes"] == 4  # the server and the processes it started
        assert set(group["by_process"]) == {str(p) for p in (s.pid, child, apart, grandchild)}
        assert 0 < group["pss_mib"] <= group["rss_mib"]
    deadline = time.monotonic() + 10
    while not all(map(gone, (child, apart, grandchild))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(child)
    assert gone(apart)
    assert gone(grandchild)


def stopped(*pids: int, want: bool = True) -> bool:
    """Whether the processes are all stopped (state ``T``; with ``want=False``: all running),
    waiting up to 5 s for it (a signal is delivered asynchronously)."""

    def is_stopped(pid: int) -> bool:
        status = Path(f"/proc/{pid}/status").read_text()
        return next(x for x in status.splitlines() if x.startswith("State:")).split()[1] == "T"

    deadline = time.monotonic() + 5
    while any(is_stopped(pid) != want for pid in pids):
        if time.monotonic() > deadline:
            return not want
        time.sleep(0.05)
    return want


def test_a_paused_server_and_its_children_stop_until_resumed_and_a_paused_one_still_stops(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    with launch.Server([sys.executable, "-c", LEADER, "{port}"], "/", log=log, stop_s=5) as s:
        child, apart, grandchild = map(int, log.read_text().split()[:3])
        s.pause()
        assert stopped(s.pid, child, apart, grandchild)
        with pytest.raises(httpx.TimeoutException):
            httpx.get(s.base, timeout=0.5)  # the connection waits: nobody accepts it
        s.resume()
        assert not stopped(s.pid, child, apart, grandchild, want=False)
        assert httpx.get(s.base, timeout=10).status_code == 200
        s.pause()
    # stopped while paused: continued first, so that the SIGTERM is seen, and the child killed
    deadline = time.monotonic() + 10
    while not all(map(gone, (child, apart, grandchild))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(s.pid)
    assert gone(child)
    assert gone(apart)
    assert gone(grandchild)


def test_a_server_that_exits_is_reported_at_once() -> None:
    with pytest.raises(RuntimeError, match="exited with status 3"):
        launch.Server([sys.executable, "-c", "raise SystemExit(3)"], timeout_s=60)
