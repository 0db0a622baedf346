"""Soak and fault test of the service: mixed, hostile, slow and abandoned requests, SIGTERM midway.

Against the real server (``smso-serve`` on loopback, the shipped model, default settings),
``--clients`` threads send ``--requests`` requests between them, each drawn by a seeded random
(``--seed``) from:

* valid: a JPEG to ``/classify`` (multipart) or its preprocessed binary ``FP32`` tensor to
  ``/v2/models/<name>/infer``, on the client's keep-alive connection;
* hostile, each on a fresh connection: a truncated JPEG, a 1 x 100,000 PNG strip, random bytes
  (as a multipart file and as a protocol body), a malformed multipart body, and an oversized
  declared ``Content-Length`` after which the client sends a little and closes;
* slow: a valid ``/classify`` body sent in pieces with pauses;
* abandoned: a valid ``/classify`` request sent whole, then closed before the answer.

When the request at index ``--requests // 2`` starts, the server gets SIGTERM (``--signal``):
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
  client had sent it all, and no status line came (reported apart; the quick test expects 0);
* *refused by design*: started after the signal and not answered;
* *5xx*: responses with status 500-599, any kind of request;
* p99: latency of the valid requests answered 200 (connect or send to the end of the body),
  against a clean run (``--requests`` valid requests, the two routes drawn by the same seed,
  ``--clients`` clients, no SIGTERM) on a fresh server in the same invocation;
* peak RSS: ``VmHWM`` of the server process from ``/proc/PID/status``, read every 0.1 s until it
  exits (the clean run's server too); the server's log is kept and its tracebacks counted.

    python -m bench.soak              # 10,000 requests, 32 clients (about 20 s on 2 cores)
    python -m bench.soak --quick      # 400 requests, 8 clients (about 6 s)
    python -m bench.soak --signal KILL --quick   # a crash instead: the soak must see losses
"""

from __future__ import annotations

import argparse
import http.client
import random
import signal
import socket
import struct
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib import RESULTS, SHIPPED, launch, report
from bench.lib.launch import HOST
from bench.lib.payloads import BOUNDARY, Body, jpegs, multipart_body, tensor_bodies
from service.core.card import ModelCard
from service.runtime.backend import read_card

TIMEOUT_S = 60.0  # no answer within this long after sending: lost

# kind -> weight in the mix (valid ones dominate, as in real traffic)
MIX = {
    "valid-classify": 30,
    "valid-v2-fp32": 30,
    "truncated-jpeg": 4,
    "png-strip": 3,
    "random-multipart": 3,
    "random-v2": 3,
    "malformed-multipart": 4,
    "oversized-close": 4,
    "slow": 9,
    "abandoned": 10,
}
VALID = ("valid-classify", "valid-v2-fp32")
# kinds where the client closes on purpose: never lost, whatever happens
CLIENT_CLOSES = ("oversized-close", "abandoned")


@dataclass
class Outcome:
    """What happened to one request (see the module's definitions)."""

    index: int
    kind: str
    started: float = 0.0
    connected: bool = False
    sent: bool = False
    status: int | None = None
    seconds: float | None = None
    error: str | None = None


@dataclass
class Request:
    """One request's bytes: ``head`` (request line and headers) and ``body``."""

    head: bytes
    body: bytes = b""
    pieces: int = 1  # >1: the body in this many pieces with pauses

    @property
    def data(self) -> bytes:
        return self.head + self.body


def request(path: str, body: Body, length: int | None = None) -> Request:
    """``POST path`` with ``body`` and its headers (``length``: the declared Content-Length)."""
    headers = {"Host": HOST, **body.headers}
    headers["Content-Length"] = str(len(body.data) if length is None else length)
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return Request((head + "\r\n").encode(), body.data)


def upload(data: bytes, filename: str = "x.jpg", content_type: str = "image/jpeg") -> Request:
    """``data`` as the file of a multipart ``/classify`` request."""
    return request("/classify", multipart_body(data, filename, content_type))


def broken(data: bytes, length: int | None = None) -> Request:
    """``data`` as a ``/classify`` body declared multipart, whatever it holds."""
    return request("/classify", Body(data, multipart_body(b"").headers), length)


def png_strip(width: int) -> bytes:
    """A grey 8-bit PNG of 1 x ``width`` pixels (a few hundred bytes, a huge aspect ratio)."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    ihdr = struct.pack(">IIBBBBB", width, 1, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" + b"\x80" * width, 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


class Corpus:
    """Every request the soak can send, built once (the random draws pick among them)."""

    def __init__(self, files: list[bytes], card: ModelCard, model: str | None = None) -> None:
        self.infer = f"/v2/models/{model or card.name}/infer"  # model: a repository's name
        self.classify = [upload(f, f"{i}.jpg") for i, f in enumerate(files)]
        self.v2 = [request(self.infer, body) for body in tensor_bodies(card, files)]

    def build(self, kind: str, rng: random.Random) -> Request:
        k = rng.randrange(len(self.classify))
        if kind in ("valid-classify", "abandoned"):
            return self.classify[k]
        if kind == "valid-v2-fp32":
            return self.v2[k]
        if kind == "slow":
            r = self.classify[k]
            return Request(r.head, r.body, pieces=4)
        if kind == "truncated-jpeg":
            jpeg = self.classify[k].body  # cut the multipart's JPEG somewhere inside
            return upload(jpeg[: rng.randrange(200, len(jpeg) // 2)], "cut.jpg")
        if kind == "png-strip":
            return upload(png_strip(100_000), "strip.png", "image/png")
        noise = rng.randbytes(rng.randrange(16, 20_000))
        if kind == "random-multipart":
            return upload(noise)
        if kind == "random-v2":
            header = str(rng.randrange(0, len(noise) + 100))
            headers = {"Content-Type": "application/octet-stream"}
            headers["Inference-Header-Content-Length"] = header
            return request(self.infer, Body(noise, headers))
        if kind == "malformed-multipart":
            body = self.classify[k].body
            return broken(
                rng.choice(
                    [
                        body.replace(b"\r\n\r\n", b"\r\n", 1),  # no blank line after its headers
                        body[: len(body) // 2],  # no closing boundary
                        body.replace(BOUNDARY.encode(), b"other", 1),  # the first boundary is wrong
                        b"--" + BOUNDARY.encode() + b"\r\n" + noise,  # garbage part headers
                    ]
                )
            )
        if kind == "oversized-close":
            return broken(noise[:1024], length=2**40)
        raise ValueError(f"unknown kind {kind!r}; expected one of {sorted(MIX)}")


class Client:
    """One client thread's connections: a keep-alive one for valid requests, fresh ones else."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.keep: socket.socket | None = None

    def connect(self) -> socket.socket:
        return socket.create_connection((HOST, self.port), timeout=TIMEOUT_S)

    def close_keep(self) -> None:
        if self.keep is not None:
            self.keep.close()
            self.keep = None

    def send(self, req: Request, out: Outcome) -> None:
        keep_alive = out.kind in VALID
        out.started = time.monotonic()
        if keep_alive and self.keep is not None:
            sock = self.keep
        else:
            try:
                sock = self.connect()
            except OSError as e:
                out.error = type(e).__name__
                return
        out.connected = True
        try:
            self.transmit(sock, req, out)
        except OSError as e:  # the server closed early: it may still have answered (413, 400)
            out.error = type(e).__name__
        if out.kind in CLIENT_CLOSES:
            if out.kind == "abandoned":  # a moment after the request, before the answer
                time.sleep(random.Random(out.index).random() * 0.005)
            sock.close()
            return
        try:
            response = http.client.HTTPResponse(sock)
            response.begin()
            out.status = response.status
            answer = response.read()
            if out.status >= 500:  # what the server said, for the report
                retry = response.getheader("Retry-After")
                out.error = f"Retry-After {retry}: {answer[:300].decode('utf-8', 'replace')}"
            out.seconds = time.monotonic() - out.started
            if keep_alive and not response.will_close:
                self.keep = sock
                return
        except OSError as e:  # reset, timeout
            out.error = out.error or type(e).__name__
        except http.client.HTTPException as e:  # EOF before or inside the status line
            out.error = out.error or type(e).__name__
        if sock is self.keep:
            self.keep = None
        sock.close()

    def transmit(self, sock: socket.socket, req: Request, out: Outcome) -> None:
        """Send ``req`` (in pieces with 50 ms pauses when it asks for them)."""
        if req.pieces == 1:
            sock.sendall(req.data)
        else:
            sock.sendall(req.head)
            step = -(-len(req.body) // req.pieces)
            for start in range(0, len(req.body), step):
                time.sleep(0.05)
                sock.sendall(req.body[start : start + step])
        out.sent = out.kind != "oversized-close"  # its declared body never comes


class Server:
    """The real server on the shipped model (``server``), its output kept (``output``, once
    stopped) and its peak RSS sampled until it exits."""

    def __init__(self) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in stop())
        try:
            self.server = launch.smso_serve("--model-path", str(SHIPPED), log=self.log)
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
    outcomes: list[Outcome]
    signalled_at: float | None
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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument(
        "--clients", type=int, help="client threads (default 32; the long soak's valid ones: 6)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="400 requests, 8 clients")
    parser.add_argument(
        "--signal",
        choices=("TERM", "KILL"),
        default="TERM",
        help="sent midway; KILL checks that the soak does see lost requests",
    )
    parser.add_argument("--json", type=Path, help="default: bench/results/soak.json")
    long = parser.add_argument_group("the long soak (bench.soak_long: attacks, bursts, churn)")
    long.add_argument("--minutes", type=float, help="run the long soak for this long instead")
    long.add_argument("--attackers", type=int, default=4, help="threads sending attacks")
    long.add_argument("--burst-every-s", type=float, default=60.0)
    long.add_argument("--rss-bound-mib", type=float, default=512.0)
    args = parser.parse_args(argv)
    if args.clients is None:
        args.clients = 6 if args.minutes else 32
    if args.json is None:
        args.json = RESULTS / ("soak_long.json" if args.minutes else "soak.json")
    if args.minutes is not None and args.minutes <= 0:
        parser.error(f"--minutes must be above 0, got {args.minutes}")
    if args.quick:
        args.requests, args.clients = 400, 8
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.minutes is not None:
        from bench import soak_long

        return soak_long.main(args)
    files = jpegs(32)
    corpus = Corpus(files, read_card(SHIPPED))
    rng = random.Random(args.seed)
    kinds = rng.choices(list(MIX), weights=list(MIX.values()), k=args.requests)
    valid = random.Random(args.seed).choices(VALID, k=args.requests)
    clean = summarize(run(corpus, valid, args.clients, args.seed, None))
    signum = signal.Signals[f"SIG{args.signal}"]
    soak = summarize(run(corpus, kinds, args.clients, args.seed, args.requests // 2, signum))
    rows = [
        ("requests", "requests"),
        ("accepted", "accepted"),
        ("lost (target 0)", "lost"),
        ("refused by design (after the signal)", "refused_by_design"),
        ("closed by the client on purpose", "client_closed"),
        ("5xx (target 0)", "status_5xx"),
        ("valid answered 200", "valid_answered_200"),
        ("answered: in flight at the signal", "in_flight_at_signal"),
        ("answered: sent after the signal, kept connection", "started_after_signal_answered"),
        ("valid p50 ms", "valid_p50_ms"),
        ("valid p99 ms", "valid_p99_ms"),
        ("peak RSS MiB (VmHWM)", "peak_rss_mib"),
        ("seconds", "seconds"),
    ]

    def cell(value: Any) -> str:
        return (
            "-" if value is None else f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"
        )

    print(
        f"Soak: {args.requests} mixed requests, {args.clients} clients, SIG{args.signal} at "
        f"request {args.requests // 2}; clean: {len(valid)} valid ones only, no signal.\n"
    )
    table = [[name, cell(soak[key]), cell(clean[key])] for name, key in rows]
    print(report.markdown_table(["measure", "soak", "clean"], table))
    if soak["valid_p99_ms"] and clean["valid_p99_ms"]:
        print(f"\nvalid p99 soak / clean = {soak['valid_p99_ms'] / clean['valid_p99_ms']:.2f}")
    report.save(args.json, {"settings": vars(args), "mix": MIX, "soak": soak, "clean": clean})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
