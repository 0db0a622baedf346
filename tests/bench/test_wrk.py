"""``bench.lib.wrk``: every body is sent in turn with its own headers, the answers are counted
by status, and the generator's own CPU is measured; against a small server in this process."""

from __future__ import annotations

import collections
import http.server
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest

from bench.lib import wrk
from bench.lib.load import merge
from bench.lib.payloads import Body

pytestmark = pytest.mark.skipif(not wrk.available(), reason="wrk is not installed (make wrk)")


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers 200 to a body it was told to accept, 400 to any other; counts what it saw."""

    protocol_version = "HTTP/1.1"  # keep-alive, as wrk's connections are
    seen: ClassVar[collections.Counter[tuple[bytes, str]]] = collections.Counter()
    refuse = b"refuse me"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen[(body, self.headers.get("X-Body", ""))] += 1
        status = 400 if body == self.refuse else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Recorder.seen = collections.Counter()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/post"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_every_body_is_sent_in_turn_with_its_own_headers(server: str) -> None:
    bodies = [Body(f"body {k}".encode(), {"X-Body": str(k)}) for k in range(3)]
    result = wrk.drive(server, bodies, connections=2, seconds=1)
    assert result.requests > 30
    assert result.answered == result.requests
    assert result.errors == result.status_errors == 0
    counts = Recorder.seen
    assert set(counts) == {(b"body 0", "0"), (b"body 1", "1"), (b"body 2", "2")}
    # in turn: each body within a connection's in-flight request of the others
    assert max(counts.values()) - min(counts.values()) <= 2
    assert 0 < result.p50_ms <= result.p95_ms <= result.p99_ms <= result.max_ms
    assert result.cpu_s > 0
    assert 0 < result.client_cpu_ms < 1e3 * result.seconds


def test_other_statuses_are_not_answers_and_the_figures_say_so(server: str) -> None:
    bodies = [Body(b"fine", {}), Body(Recorder.refuse, {})]
    figures = wrk.load(server, bodies, connections=1, seconds=1)
    refused = sum(n for (body, _), n in Recorder.seen.items() if body == Recorder.refuse)
    assert figures["outcomes"]["other status"] == refused
    assert figures["failures"] == refused
    assert figures["requests"] == figures["outcomes"]["2xx"]
    assert abs(figures["requests"] - refused) <= 1  # one after the other, on one connection
    assert figures["requests_per_second"] == pytest.approx(figures["requests"] / figures["seconds"])
    assert figures["client_cpu_ms_per_request"] > 0
    assert "latencies_ms" not in figures


def test_rounds_without_latencies_merge_as_the_median_of_theirs() -> None:
    def run(rps: float, p50: float) -> dict[str, object]:
        return {
            "requests": int(rps),
            "failures": 0,
            "outcomes": {"2xx": int(rps)},
            "seconds": 1.0,
            "requests_per_second": rps,
            "p50_ms": p50,
            "client_cpu_ms_per_request": 0.1,
        }

    merged = merge([run(100, 5.0), run(300, 1.0), run(200, 2.0)])
    assert merged["requests_per_second"] == pytest.approx(200)
    assert merged["p50_ms"] == 2.0
    assert merged["rounds_rps"] == [100, 300, 200]
    assert merged["outcomes"] == {"2xx": 600}


def test_a_server_that_is_not_there_is_a_runtime_error() -> None:
    with pytest.raises(RuntimeError, match="wrk"):
        wrk.drive("http://127.0.0.1:9/none", Body(b"x", {}), connections=1, seconds=1)


def test_a_load_on_a_server_that_is_gone_answered_nothing() -> None:
    figures = wrk.load("http://127.0.0.1:9/none", Body(b"x", {}), connections=1, seconds=1)
    assert figures["requests"] == 0
    assert "requests_per_second" not in figures
    assert "wrk" in figures["error"]
