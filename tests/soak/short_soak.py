"""The soak: mixed, hostile, slow and abandoned requests against the real server, SIGTERM midway.

Against the real server (``smso-serve`` on loopback, the shipped model, default settings, one
process), ``Settings.clients`` threads send ``Settings.requests`` requests between them, each
drawn by a seeded random (``Settings.seed``) from:

* valid: a JPEG to ``/classify`` (multipart) or its preprocessed binary ``FP32`` tensor to
  ``/v2/models/<name>/infer``, on the client's keep-alive connection;
* hostile, each on a fresh connection: a truncated JPEG, a 1 x 100,000 PNG strip, random bytes
  (as a multipart file and as a protocol body), a malformed multipart body, an oversized
  declared ``Content-Length`` after which the client sends a little and closes, a protocol
  request that names 8,000 outputs, and an upload that declares 64 MiB and sends none of it
  (its connection held 0.5 s, then closed);
* slow: a valid ``/classify`` body sent in pieces with pauses;
* abandoned: a valid ``/classify`` request sent whole, then closed before the answer.

When the request at index ``requests // 2`` starts, the server gets SIGTERM (``Settings.signum``):
it drains and exits, and the requests after it are refused by design (connection refused, or no
answer on a connection used only after the signal).

Definitions (per request; times are the client's monotonic clock):

* *started*: when the client began to connect (fresh connection) or to send (reused one);
* *accepted*: a response came (status line read), or the request was started before SIGTERM
  was sent on a connection that was established: the server had not yet stopped accepting;
* *lost*: accepted, meant to be answered (not abandoned or closed by the client on purpose),
  sent completely by the client, and no status line came (EOF, reset or a 60 s timeout).
  A request refused at connect before the signal counts as lost too;
* *unsent*: accepted, meant to be answered, but the server closed the connection before the
  client had sent it all, and no status line came (reported apart; the soak expects 0);
* *refused by design*: started after the signal and not answered;
* *5xx*: responses with status 500-599, any kind of request;
* p99: latency of the valid requests answered 200 (connect or send to the end of the body),
  against a clean run (``requests`` valid requests, the two routes drawn by the same seed,
  ``clients`` clients, no SIGTERM) on a fresh server;
* peak RSS: ``VmHWM`` of the server process from ``/proc/PID/status``, read every 0.1 s until it
  exits (the clean run's server too); the server's log is kept and its tracebacks counted.

:data:`FULL` (10,000 requests, 32 clients: about 20 s on 2 cores) runs in ``make soak``,
:data:`QUICK` (400 requests, 8 clients: about 6 s) in every ``make test``; SIGKILL instead of
SIGTERM makes the same run report lost requests, so the count does see a crash.
"""

from __future__ import annotations

import random
import signal
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bench.lib import SHIPPED, launch, report
from bench.lib.payloads import jpegs
from service.runtime.backend import read_card
from tests.soak.hostile import CLIENT_CLOSES, MIX, VALID, Client, Corpus, Outcome


@dataclass(frozen=True)
class Settings:
    """One soak: its size, its seed and the signal sent midway."""

    requests: int = 10_000  # mixed requests (and as many valid ones in the clean run)
    clients: int = 32  # client threads
    seed: int = 0  # draws the kinds, the routes and each client's choices
    signum: signal.Signals = signal.SIGTERM  # sent when request ``requests // 2`` starts


FULL = Settings()
QUICK = Settings(requests=400, clients=8)


class Server:
    """The real server on the shipped model (``server``), its output kept (``output``, once
    stopped) and its peak RSS sampled until it exits."""

    def __init__(self) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in stop())
        try:
            # one process: its peak memory is the server's
            self.server = launch.smso_serve(
                "--model-path", str(SHIPPED), "--workers", "1", log=self.log
            )
        except BaseException:
            self.log.close()
            raise
        self.peak_mib = 0.0
        self.output = ""
        self.sampler = threading.Thread(target=self.sample, daemon=True)
        self.sampler.start()

    def sample(self) -> None:
        while self.server.process.poll() is None:
            try:
                self.peak_mib = max(self.peak_mib, self.server.rss_mib()["VmHWM"])
            except OSError:
                return
            time.sleep(0.1)

    def stop(self) -> int:
        code = self.server.stop()
        self.sampler.join(timeout=5)
        self.log.seek(0)
        self.output = self.log.read()
        self.log.close()
        return code


@dataclass
class Run:
    """What one run against a fresh server saw."""

    outcomes: list[Outcome]
    signalled_at: float | None  # when the signal was sent (None: the clean run)
    seconds: float
    peak_rss_mib: float
    exit_code: int
    server_output: str


def run(
    corpus: Corpus,
    kinds: list[str],
    clients: int,
    seed: int,
    signal_at: int | None,
    signum: signal.Signals = signal.SIGTERM,
) -> Run:
    """``kinds[i]`` as request ``i`` from ``clients`` threads; ``signum`` to the server when
    request ``signal_at`` starts."""
    server = Server()
    outcomes = [Outcome(i, kind) for i, kind in enumerate(kinds)]
    signalled_at: list[float] = []
    lock = threading.Lock()
    next_index = iter(range(len(kinds)))

    def worker(w: int) -> None:
        client, rng = Client(server.server.port), random.Random(seed * 1000 + w)
        while True:
            with lock:
                i = next(next_index, None)
                if i is None:
                    break
                if i == signal_at:
                    signalled_at.append(time.monotonic())
                    server.server.process.send_signal(signum)
            client.send(corpus.build(kinds[i], rng), outcomes[i])
        client.close_keep()

    start = time.monotonic()
    try:
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.monotonic() - start
    finally:
        code = server.stop()
    first = signalled_at[0] if signalled_at else None
    return Run(outcomes, first, seconds, server.peak_mib, code, server.output)


def classify(out: Outcome, signalled_at: float | None) -> str:
    """``answered``, ``lost``, ``refused`` (by design, after the signal) or ``client-closed``."""
    before = signalled_at is None or out.started < signalled_at
    if out.status is not None:
        return "answered"
    if out.kind in CLIENT_CLOSES and out.connected:
        return "client-closed"
    if not before:
        return "refused"
    if not out.connected:
        return "lost"  # refused before the server was signalled
    return "lost" if out.sent else "unsent"  # unsent: the server closed while it was uploaded


def summarize(r: Run) -> dict[str, Any]:
    """The run's counts, latencies, memory and server log, as the JSON and the table give them."""
    fates = [classify(o, r.signalled_at) for o in r.outcomes]
    accepted = sum(
        f == "answered" or (f != "refused" and o.connected)
        for o, f in zip(r.outcomes, fates, strict=True)
    )
    valid_ms = sorted(
        1e3 * o.seconds
        for o in r.outcomes
        if o.kind in VALID and o.status == 200 and o.seconds is not None
    )
    by_kind: dict[str, Counter[str]] = {}
    for o, f in zip(r.outcomes, fates, strict=True):
        key = str(o.status) if o.status is not None else f"{f} ({o.error or 'no error'})"
        by_kind.setdefault(o.kind, Counter())[key] += 1
    # requests with a duration: in flight when the signal came, or started after it
    in_flight = started_after = 0
    if r.signalled_at is not None:
        at = r.signalled_at
        timed = [(o.started, o.seconds) for o in r.outcomes if o.seconds is not None]
        in_flight = sum(start < at < start + seconds for start, seconds in timed)
        started_after = sum(start >= at for start, _ in timed)
    lost = [asdict(o) for o, f in zip(r.outcomes, fates, strict=True) if f == "lost"]
    return {
        "requests": len(r.outcomes),
        "seconds": r.seconds,
        "accepted": accepted,
        "answered": fates.count("answered"),
        "lost": len(lost),
        "refused_by_design": fates.count("refused"),
        "client_closed": fates.count("client-closed"),
        "unsent": fates.count("unsent"),
        "status_5xx": sum(o.status is not None and o.status >= 500 for o in r.outcomes),
        "valid_answered_200": len(valid_ms),
        "valid_p50_ms": float(np.percentile(valid_ms, 50)) if valid_ms else None,
        "valid_p99_ms": float(np.percentile(valid_ms, 99)) if valid_ms else None,
        "peak_rss_mib": r.peak_rss_mib,
        "server_exit_code": r.exit_code,
        "in_flight_at_signal": in_flight,
        "started_after_signal_answered": started_after,
        "server_tracebacks": r.server_output.count("Traceback"),
        "server_log_tail": r.server_output.splitlines()[-20:],
        "server_log_lines": len(r.server_output.splitlines()),
        "by_kind": {k: dict(sorted(v.items())) for k, v in sorted(by_kind.items())},
        "lost_requests": lost[:20],
    }


#: the table's rows: label -> key of the summary
ROWS = {
    "requests": "requests",
    "accepted": "accepted",
    "lost (target 0)": "lost",
    "refused by design (after the signal)": "refused_by_design",
    "closed by the client on purpose": "client_closed",
    "5xx (target 0)": "status_5xx",
    "valid answered 200": "valid_answered_200",
    "answered: in flight at the signal": "in_flight_at_signal",
    "answered: sent after the signal, kept connection": "started_after_signal_answered",
    "valid p50 ms": "valid_p50_ms",
    "valid p99 ms": "valid_p99_ms",
    "peak RSS MiB (VmHWM)": "peak_rss_mib",
    "seconds": "seconds",
}


@dataclass(frozen=True)
class Report:
    """A soak and its clean run, each :func:`summarize`'s dictionary."""

    settings: Settings
    soak: dict[str, Any]
    clean: dict[str, Any]

    def table(self) -> str:
        """What the soak prints: the settings, a markdown table of both runs, the p99 ratio."""
        s = self.settings
        lines = [
            f"Soak: {s.requests} mixed requests, {s.clients} clients, {s.signum.name} at "
            f"request {s.requests // 2}; clean: {s.requests} valid ones only, no signal.\n",
            report.markdown_table(
                ["measure", "soak", "clean"],
                [
                    [name, *(report.format_value(run[key]) for run in (self.soak, self.clean))]
                    for name, key in ROWS.items()
                ],
            ),
        ]
        if self.soak["valid_p99_ms"] and self.clean["valid_p99_ms"]:
            ratio = self.soak["valid_p99_ms"] / self.clean["valid_p99_ms"]
            lines.append(f"\nvalid p99 soak / clean = {ratio:.2f}")
        return "\n".join(lines)

    def record(self) -> dict[str, Any]:
        """The JSON record: the settings, the mix of kinds and both runs."""
        settings = asdict(self.settings) | {"signum": self.settings.signum.name}
        return {"settings": settings, "mix": MIX, "soak": self.soak, "clean": self.clean}


def soak(settings: Settings) -> Report:
    """The clean run, then the soak, each on a fresh server."""
    files = jpegs(32)
    corpus = Corpus(files, read_card(SHIPPED))
    rng = random.Random(settings.seed)
    kinds = rng.choices(list(MIX), weights=list(MIX.values()), k=settings.requests)
    valid = random.Random(settings.seed).choices(VALID, k=settings.requests)
    clean = summarize(run(corpus, valid, settings.clients, settings.seed, None))
    signal_at = settings.requests // 2
    mixed = run(corpus, kinds, settings.clients, settings.seed, signal_at, settings.signum)
    return Report(settings, summarize(mixed), clean)
