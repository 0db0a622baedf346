"""The long soak: everything at once against the real server for ``Settings.minutes``.

For ``minutes`` (``SOAK_MINUTES`` in ``make soak``: 10 by default), the real server
(``smso-serve``, default settings, 1 worker) serves a model repository it polls every second,
with gRPC on, and gets at once:

* **valid traffic** (``clients`` HTTP threads on keep-alive connections, each pausing 0-10 ms
  between requests, and one gRPC client): ``/classify`` uploads, binary ``FP32``
  ``/v2/models/fmnist/infer`` requests and gRPC ``ModelInfer`` calls, all to the model
  ``fmnist``, whose served version is replaced under the traffic every few seconds;
* **every attack class of the hardening campaigns** (``attackers`` threads, a fresh connection
  each): the short soak's hostile kinds (:data:`tests.soak.hostile.MIX`), and a 20 MB header,
  200,000 header fields, a 40 kB head left unfinished, an 80 kB query, a gzip body on
  ``/classify``, a non-protocol content type on ``/v2``, FP32 inputs of 1e20, JSON nested
  100,000 deep, a 5,000-digit integer, a bad ``parameters.timeout``, and on the gRPC port
  malformed protobuf and ModelInfer calls naming 16,000 outputs;
* **bursts** every ``burst_every_s``: 1,000 idle TCP connections held for 10 s, then
  an HTTP/2 rapid reset (20,000 ModelInfer streams opened and cancelled at once on one
  connection, :func:`tests.soak.hostile.rapid_reset`), then 1,500 concurrent gRPC calls;
* **repository churn** every 1.5 s, in turn: a new version of ``fmnist`` (the oldest removed
  past three), a model appearing and disappearing, folders named ``²``, ``007`` and ``bad name``,
  a version whose ``model.onnx`` is garbage, a file where a model folder should be, and 3,000
  empty version folders under one model from the start;
* **probes**, from a process of their own (its own interpreter: the load's threads do not delay
  them): ``GET /healthz`` every 100 ms on a fresh connection, as a kubelet does, and
  ``GET /readyz`` every second.

The server's resident memory (``VmRSS``) is read every second. At the end the traffic stops and
the server gets SIGTERM; it must drain and exit 0.

Definitions, per request: *answered* (a status line or a gRPC status came), *lost* (meant to be
answered, sent whole, on a connection the server had accepted, and no answer; for gRPC, any
status but OK and the documented refusals), *unsent* (the server closed the connection while the
client was still sending a request it refuses, e.g. past the header limit, and no answer came),
*client-closed* (closed by the client on purpose). Targets: 0 lost, 0 5xx, ``/healthz`` p99 <=
100 ms, every ``/readyz`` 200, peak ``VmRSS`` within ``rss_bound_mib`` (512 MiB by default:
the server idles at about 160 MiB), no growth (the median ``VmRSS`` of the last third of the run
after its first minute within 32 MiB of the first third's), no traceback in the server's log.
Refusals under load (503 ``overloaded`` with ``Retry-After``, gRPC ``RESOURCE_EXHAUSTED``) are
answers, counted apart. Each target is one entry of the summary's ``checks``.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import multiprocessing
import os
import queue
import random
import resource
import shutil
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from bench.lib import SHIPPED, launch, report
from bench.lib.launch import HOST
from bench.lib.payloads import Body, jpegs
from service.runtime.backend import read_card
from tests.soak.hostile import (
    MIX,
    VALID,
    Client,
    Corpus,
    Outcome,
    Request,
    rapid_reset,
    request,
    upload,
)

MODEL = "fmnist"  # the model the valid traffic uses (always served)
CHURN_S = 1.5
PROBE_S = 0.1
PROBE_TIMEOUT_S = 5.0
IDLE_CONNECTIONS = 1000
IDLE_HOLD_S = 10.0
GRPC_BURST = 1500
RESET_STREAMS = 20_000
GRPC_MANY_OUTPUTS = 16_000
#: a channel option: the channel's own connection. grpcio shares one connection among the
#: channels of a process to the same target (its global subchannel pool), so the burst's 30
#: channels and the valid client's would be one connection, past the server's streams per
#: connection; separate clients, as they are here, have connections of their own
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
#: gRPC statuses that are answers (the documented refusals), not losses
GRPC_ANSWERS = {"OK", "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT", "UNAVAILABLE (refused stream)"}


@dataclass(frozen=True)
class Settings:
    """One long soak: how long, how much traffic, how often the bursts, the memory bound."""

    minutes: float  # how long the traffic lasts
    clients: int = 6  # valid HTTP client threads (beside one gRPC client)
    attackers: int = 4  # threads sending attacks
    burst_every_s: float = 60.0  # idle connections, a rapid reset and a gRPC burst, this often
    rss_bound_mib: float = 512.0  # the peak resident memory allowed


def grpc_code(error: grpc.RpcError) -> str:
    """The status name of a failed call; a stream the server refused (HTTP/2 REFUSED_STREAM,
    past its streams per connection: not processed, safe to retry) is told apart from any
    other UNAVAILABLE."""
    code = error.code().name
    refused = code == "UNAVAILABLE" and "error code 7" in (error.details() or "")
    return "UNAVAILABLE (refused stream)" if refused else code


#: attack kind -> weight (the short soak's hostile kinds, then the second campaign's)
ATTACKS = {k: w for k, w in MIX.items() if k not in ("valid-classify", "valid-v2-fp32")} | {
    "header-bomb": 2,
    "header-flood": 2,
    "header-hold": 2,
    "long-query": 3,
    "gzip-classify": 3,
    "v2-text-plain": 3,
    "extreme-fp32": 4,
    "deep-json": 3,
    "big-int": 3,
    "bad-timeout": 3,
}
#: kinds whose request the server may refuse before the client has sent it all
REFUSED_MIDWAY = ("header-bomb", "header-flood", "oversized-close")
CLIENT_CLOSES = ("oversized-close", "abandoned", "header-hold", "silent-body")


class Attacks:
    """The second campaign's HTTP requests (the first's come from
    :class:`tests.soak.hostile.Corpus`)."""

    def __init__(self, corpus: Corpus, files: list[bytes]) -> None:
        self.corpus = corpus
        self.infer = f"/v2/models/{MODEL}/infer"
        self.extreme = [self._extreme(r) for r in corpus.v2]
        self.gzipped = [gzip.compress(f) for f in files[:4]]

    @staticmethod
    def _extreme(valid: Request) -> Request:
        """``valid`` (a binary FP32 request) with every value 1e20: finite, and the model's
        outputs are not."""
        head = valid.head.decode()
        json_bytes = int(head.split("Inference-Header-Content-Length: ")[1].split("\r\n")[0])
        values = (len(valid.body) - json_bytes) // 4
        return Request(valid.head, valid.body[:json_bytes] + np.full(values, 1e20, "<f4").tobytes())

    def _json(self, text: str) -> Request:
        return request(self.infer, Body(text.encode(), {"Content-Type": "application/json"}))

    def build(self, kind: str, rng: random.Random) -> Request:
        if kind in MIX:
            return self.corpus.build(kind, rng)
        if kind == "header-bomb":  # one header of 20 MB
            return Request(raw_head("/healthz", [("X-Bomb", "a" * 20_000_000)]))
        if kind == "header-flood":  # 200,000 small header fields
            return Request(raw_head("/healthz", [(f"X-{i}", "b") for i in range(200_000)]))
        if kind == "header-hold":  # 40 kB of a head that never ends, held a while
            return Request(
                f"GET /healthz HTTP/1.1\r\nHost: {HOST}\r\nX-Hold: ".encode() + b"c" * 40_000
            )
        if kind == "long-query":
            return Request(
                f"GET /metadata?q={'q' * 80_000} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
            )
        if kind == "gzip-classify":
            r = upload(rng.choice(self.gzipped), "x.jpg.gz")
            return Request(
                r.head.replace(b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\n\r\n", 1), r.body
            )
        if kind == "v2-text-plain":
            return request(self.infer, Body(b"hello", {"Content-Type": "text/plain"}))
        if kind == "extreme-fp32":
            return rng.choice(self.extreme)
        if kind == "deep-json":
            return self._json("[" * 100_000 + "]" * 100_000)
        if kind == "big-int":
            return self._json(
                '{"inputs": [{"name": "image", "datatype": "FP32", "shape": [1], '
                f'"data": [{"9" * 5000}]}}]}}'
            )
        if kind == "bad-timeout":
            bad = rng.choice(['"soon"', "-5", "1e400", "true"])
            return self._json('{"inputs": [], "parameters": {"timeout": ' + bad + "}}")
        raise ValueError(f"unknown attack {kind!r}; expected one of {sorted(ATTACKS)}")


def raw_head(path: str, headers: list[tuple[str, str]]) -> bytes:
    """``GET path`` with ``headers``, a whole head."""
    fields = "".join(f"{k}: {v}\r\n" for k, v in headers)
    return f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n{fields}\r\n".encode()


def send(client: Client, req: Request, out: Outcome) -> None:
    """:meth:`tests.soak.hostile.Client.send`, with the second campaign's ways of closing: a held
    head is kept open 2 s, then closed by the client."""
    if out.kind != "header-hold":
        client.send(req, out)
        return
    out.started = time.monotonic()
    try:
        with client.connect() as sock:
            out.connected = True
            sock.sendall(req.head)
            time.sleep(2.0)
    except OSError as e:
        out.error = type(e).__name__


def overload_refusal(out: Outcome) -> bool:
    """A documented refusal under load: 503 ``overloaded`` with ``Retry-After``."""
    said = out.error or ""
    return out.status == 503 and '"overloaded"' in said and not said.startswith("Retry-After None")


def fate(out: Outcome) -> str:
    """``answered``, ``lost``, ``unsent`` or ``client-closed`` (see the module's definitions)."""
    if out.status is not None:
        return "answered"
    if out.kind in CLIENT_CLOSES and out.connected:
        return "client-closed"
    if not out.connected:
        return "lost"  # refused at connect while the server was up
    if out.kind in REFUSED_MIDWAY and not out.sent:
        return "unsent"
    return "lost" if out.sent else "unsent"


# ---------------------------------------------------------------------------------------------
# the repository and its churn


def make_repository(root: Path) -> None:
    """``root/fmnist/1/model.onnx`` (the shipped model) and ``root/crowd/`` with version 1 and
    3,000 empty version folders (a scan's cost)."""
    for name in (MODEL, "crowd"):
        (root / name / "1").mkdir(parents=True)
        shutil.copy(SHIPPED, root / name / "1" / "model.onnx")
    for v in range(2, 3002):
        (root / "crowd" / str(v)).mkdir()


def make_folders(folders: list[Path]) -> None:
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)


def remove_folders(folders: list[Path]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


class Churn:
    """One repository change every :data:`CHURN_S`, in turn (see the module's docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 1
        self.steps = 0
        self.errors: list[str] = []

    def _copy(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / ".model.onnx.partial"  # written whole, then renamed into place
        shutil.copy(SHIPPED, partial)
        partial.rename(folder / "model.onnx")

    def actions(self) -> Iterator[Callable[[], object]]:
        odd = [self.root / MODEL / "²", self.root / MODEL / "007", self.root / "bad name" / "1"]
        while True:
            yield self.new_version
            yield lambda: self._copy(self.root / "comes-and-goes" / "1")
            yield lambda: make_folders(odd)
            yield self.new_version
            yield lambda: shutil.rmtree(self.root / "comes-and-goes", ignore_errors=True)
            yield lambda: (self.root / "garbage" / "1").mkdir(parents=True, exist_ok=True)
            yield lambda: (self.root / "garbage" / "1" / "model.onnx").write_bytes(os.urandom(4096))
            yield lambda: (self.root / "a-file").write_text("not a model folder")
            yield self.new_version
            yield lambda: remove_folders(odd)
            yield lambda: shutil.rmtree(self.root / "bad name", ignore_errors=True)
            yield lambda: shutil.rmtree(self.root / "garbage", ignore_errors=True)
            yield lambda: (self.root / "a-file").unlink(missing_ok=True)

    def new_version(self) -> None:
        """``fmnist/<v+1>``; versions below ``v - 2`` removed (the served one never is)."""
        self.version += 1
        self._copy(self.root / MODEL / str(self.version))
        old = self.root / MODEL / str(self.version - 3)
        if old.is_dir():
            shutil.rmtree(old)

    def run(self, stop: threading.Event) -> None:
        actions = self.actions()
        while not stop.wait(CHURN_S):
            try:
                next(actions)()
                self.steps += 1
            except OSError as e:
                self.errors.append(f"{type(e).__name__}: {e}")


# ---------------------------------------------------------------------------------------------
# probes: a process of their own


def probe_once(port: int, path: str) -> tuple[float, int, str]:
    """``GET path`` on a fresh connection: (seconds to the whole answer, status (0 if none), the
    answer's start unless it is 200)."""
    start = time.monotonic()
    try:
        connection = http.client.HTTPConnection(HOST, port, timeout=PROBE_TIMEOUT_S)
        connection.request("GET", path)
        response = connection.getresponse()
        answer = response.read()
        connection.close()
        said = "" if response.status == 200 else answer[:300].decode("utf-8", "replace")
        return time.monotonic() - start, response.status, said
    except (OSError, http.client.HTTPException) as e:
        return time.monotonic() - start, 0, type(e).__name__


def probes(port: int, seconds: float, results: Any) -> None:
    """``/healthz`` every :data:`PROBE_S`, ``/readyz`` every second, for ``seconds``; the
    answers (path, seconds, status, what a failed one said) put on ``results`` at the end."""
    found: list[tuple[str, float, int, str]] = []
    start = time.monotonic()
    tick = 0
    while time.monotonic() - start < seconds:
        found.append(("/healthz", *probe_once(port, "/healthz")))
        if tick % round(1 / PROBE_S) == 0:
            found.append(("/readyz", *probe_once(port, "/readyz")))
        tick += 1
        time.sleep(max(0.0, start + tick * PROBE_S - time.monotonic()))
    results.put(found)


# ---------------------------------------------------------------------------------------------
# gRPC


def infer_request(image: bytes) -> Any:
    message = pb.ModelInferRequest(model_name=MODEL)
    message.inputs.add(name="image_bytes", datatype="BYTES", shape=[1])
    message.raw_input_contents.append(len(image).to_bytes(4, "little") + image)
    return message


@dataclass
class GrpcTally:
    """Status names of the gRPC calls, by kind."""

    codes: dict[str, Counter[str]] = field(default_factory=dict)
    #: what the first calls that got no documented answer were told (kind, status, details)
    unanswered: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, code: str) -> None:
        with self.lock:
            self.codes.setdefault(kind, Counter())[code] += 1

    def failed(self, kind: str, error: grpc.RpcError) -> None:
        """A failed call, by :func:`grpc_code`; the details of one that is no documented answer
        are kept (the first 20), so that a lost call can be told apart."""
        code = grpc_code(error)
        self.add(kind, code)
        if code not in GRPC_ANSWERS:
            with self.lock:
                if len(self.unanswered) < 20:
                    self.unanswered.append(f"{kind}: {code}: {error.details()}")


def grpc_traffic(target: str, files: list[bytes], tally: GrpcTally, stop: threading.Event) -> None:
    """Valid ``ModelInfer`` calls on one channel; every tenth call a malformed message, or
    one naming :data:`GRPC_MANY_OUTPUTS` outputs."""
    messages = [infer_request(f) for f in files]
    many = infer_request(files[0])
    for i in range(GRPC_MANY_OUTPUTS):
        many.outputs.add(name=f"out{i}")
    with grpc.insecure_channel(target, options=OWN_CONNECTION) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        raw = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        rng = random.Random(7)
        i = 0
        while not stop.is_set():
            i += 1
            kind = {0: "grpc-malformed", 5: "grpc-many-outputs"}.get(i % 10, "grpc-valid")
            try:
                if kind == "grpc-valid":
                    stub.ModelInfer(rng.choice(messages), timeout=60)
                elif kind == "grpc-many-outputs":
                    stub.ModelInfer(many, timeout=60)
                else:
                    raw(
                        rng.choice([b"\xff\xff\xff\x0f junk", b"\x0a\x80", rng.randbytes(300)]),
                        timeout=60,
                    )
                tally.add(kind, "OK")
            except grpc.RpcError as error:
                tally.failed(kind, error)
            time.sleep(rng.random() * 0.01)


def grpc_burst(target: str, files: list[bytes], tally: GrpcTally) -> None:
    """:data:`GRPC_BURST` concurrent calls, spread over 30 channels."""
    messages = [infer_request(f) for f in files]
    channels = [grpc.insecure_channel(target, options=OWN_CONNECTION) for _ in range(30)]
    try:
        stubs = [pb_grpc.GRPCInferenceServiceStub(c) for c in channels]
        futures = [
            stubs[i % len(stubs)].ModelInfer.future(messages[i % len(messages)], timeout=120)
            for i in range(GRPC_BURST)
        ]
        for future in futures:
            try:
                future.result()
                tally.add("grpc-burst", "OK")
            except grpc.RpcError as error:
                tally.failed("grpc-burst", error)
    finally:
        for c in channels:
            c.close()


def idle_connections(port: int) -> int:
    """:data:`IDLE_CONNECTIONS` TCP connections that send nothing, held :data:`IDLE_HOLD_S`;
    how many connected."""
    held: list[socket.socket] = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            with contextlib.suppress(OSError):
                held.append(socket.create_connection((HOST, port), timeout=5))
        time.sleep(IDLE_HOLD_S)
        return len(held)
    finally:
        for s in held:
            s.close()


# ---------------------------------------------------------------------------------------------
# the run


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass
class Observed:
    """What one long soak saw, for :func:`summarize`."""

    outcomes: list[Outcome]  # every HTTP request
    tally: GrpcTally  # every gRPC call
    probed: list[tuple[str, float, int, str]]  # the probes: path, seconds, status, what it said
    rss: list[tuple[float, float]]  # (seconds since the start, VmRSS MiB), once a second
    rss_end: dict[str, float]  # VmRSS and VmHWM once the traffic stopped
    exit_code: int  # the server's, after SIGTERM
    output: str  # the server's log
    churn: Churn
    idle_held: list[int]  # idle connections held, per burst
    resets: Counter[str]  # how each rapid-reset round ended
    seconds: float


def run(settings: Settings) -> dict[str, Any]:
    """One long soak on a fresh server and repository: :func:`summarize`'s summary."""
    s = settings
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 1,000 idle connections and more
    files = jpegs(32)
    corpus = Corpus(files, read_card(SHIPPED), MODEL)
    attacks = Attacks(corpus, files)
    seconds = 60 * settings.minutes
    with tempfile.TemporaryDirectory(prefix="smso-soak-") as tmp:
        root = Path(tmp) / "repository"
        make_repository(root)
        log = (Path(tmp) / "server.log").open("w+")
        grpc_port = launch.free_port()
        # one process, as measured in docs/security.md: its memory is the server's
        server = launch.smso_serve(
            "--model-repository", str(root), "--default-model", MODEL,
            "--repository-poll-s", "1", "--grpc-port", str(grpc_port), "--workers", "1", log=log,
        )  # fmt: skip
        target = f"{HOST}:{grpc_port}"
        stop = threading.Event()
        rss: list[tuple[float, float]] = []
        outcomes: list[Outcome] = []
        lock = threading.Lock()
        tally = GrpcTally()
        churn = Churn(root)
        idle_held: list[int] = []
        resets: Counter[str] = Counter()
        start = time.monotonic()

        def sample() -> None:
            while not stop.wait(1.0):
                with contextlib.suppress(OSError):
                    rss.append((time.monotonic() - start, server.rss_mib()["VmRSS"]))

        def valid_client(w: int) -> None:
            client, rng = Client(server.port), random.Random(1000 + w)
            while not stop.is_set():
                kind = rng.choice(("valid-classify", "valid-v2-fp32"))
                out = Outcome(len(outcomes), kind)
                client.send(corpus.build(kind, rng), out)
                with lock:
                    outcomes.append(out)
                time.sleep(rng.random() * 0.01)
            client.close_keep()

        def attacker(w: int) -> None:
            client, rng = Client(server.port), random.Random(2000 + w)
            kinds, weights = list(ATTACKS), list(ATTACKS.values())
            while not stop.is_set():
                kind = rng.choices(kinds, weights)[0]
                out = Outcome(len(outcomes), kind)
                send(client, attacks.build(kind, rng), out)
                with lock:
                    outcomes.append(out)
                time.sleep(rng.random() * 0.05)

        def bursts() -> None:
            while not stop.wait(settings.burst_every_s):
                idle_held.append(idle_connections(server.port))
                if stop.is_set():
                    return
                resets[rapid_reset(grpc_port, RESET_STREAMS)] += 1
                grpc_burst(target, files, tally)

        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        prober = context.Process(target=probes, args=(server.port, seconds, results))
        prober.start()
        threads = [
            threading.Thread(target=sample),
            threading.Thread(target=churn.run, args=(stop,)),
            threading.Thread(target=grpc_traffic, args=(target, files, tally, stop)),
            threading.Thread(target=bursts),
        ]
        threads += [threading.Thread(target=valid_client, args=(w,)) for w in range(s.clients)]
        threads += [threading.Thread(target=attacker, args=(w,)) for w in range(s.attackers)]
        for t in threads:
            t.start()
        try:
            time.sleep(seconds)
        finally:
            stop.set()
            for t in threads:
                t.join()
            try:
                probed = results.get(timeout=60)
            except queue.Empty:
                probed = []
            prober.join(timeout=10)
            rss_end = server.rss_mib()
            code = server.stop()
            log.seek(0)
            output = log.read()
            log.close()
    seen = Observed(
        outcomes=outcomes,
        tally=tally,
        probed=probed,
        rss=rss,
        rss_end=rss_end,
        exit_code=code,
        output=output,
        churn=churn,
        idle_held=idle_held,
        resets=resets,
        seconds=time.monotonic() - start,
    )
    return summarize(seen, settings)


def scan_index_note(output: str) -> list[str]:
    """The server log's distinct warnings, first 20 (each skipped entry should appear once)."""
    seen: list[str] = []
    for line in output.splitlines():
        text = line.split("]", 1)[-1].strip() if "]" in line else line.strip()
        if text and text not in seen:
            seen.append(text)
    return seen[:20]


def summarize(seen: Observed, settings: Settings) -> dict[str, Any]:
    """The counts, latencies, probes and memory of a long soak, and its ``checks`` (name ->
    held), one per target of the module's docstring."""
    outcomes, tally, probed, rss = seen.outcomes, seen.tally, seen.probed, seen.rss
    fates = [fate(o) for o in outcomes]
    by_kind: dict[str, Counter[str]] = {}
    for o, f in zip(outcomes, fates, strict=True):
        key = (
            f"{o.status} ({o.error})"
            if o.status is not None and o.status >= 500
            else str(o.status)
            if o.status is not None
            else f"{f} ({o.error or 'no error'})"
        )
        by_kind.setdefault(o.kind, Counter())[key] += 1
    for kind, codes in tally.codes.items():
        by_kind[kind] = Counter(codes)
    grpc_lost = sum(
        n for codes in tally.codes.values() for c, n in codes.items() if c not in GRPC_ANSWERS
    )
    grpc_valid: Counter[str] = tally.codes.get("grpc-valid", Counter())
    # RESOURCE_EXHAUSTED is gRPC's documented refusal under load, as REST's 503 overloaded
    grpc_valid_failed = sum(
        n for c, n in grpc_valid.items() if c not in ("OK", "RESOURCE_EXHAUSTED")
    )
    health = [s for path, s, _, _ in probed if path == "/healthz"]
    health_bad = sum(status != 200 for path, _, status, _ in probed if path == "/healthz")
    ready = [status for path, _, status, _ in probed if path == "/readyz"]
    probes_failed = [
        {"path": path, "status": status, "ms": round(1e3 * s, 1), "said": said}
        for path, s, status, said in probed
        if status != 200
    ]
    valid_ms = [
        1e3 * o.seconds for o in outcomes if o.kind in VALID and o.status == 200 and o.seconds
    ]
    valid_not_200 = sum(
        o.kind in VALID and o.status != 200 and not overload_refusal(o) for o in outcomes
    )
    after_warmup = [m for t, m in rss if t >= 60] or [m for _, m in rss]
    # growth: the median of the last third of the run after its first minute against the median
    # of its first third (medians: RSS saws up and down as the allocator gives memory back)
    third = len(after_warmup) // 3
    first_third = percentile(after_warmup[:third], 50) if third else None
    last_third = percentile(after_warmup[-third:], 50) if third else None
    peak = max([m for _, m in rss] + [seen.rss_end["VmHWM"]])
    summary: dict[str, Any] = {
        "minutes": settings.minutes,
        "seconds": seen.seconds,
        "http_requests": len(outcomes),
        "http_answered": fates.count("answered"),
        "http_lost": fates.count("lost"),
        "http_unsent": fates.count("unsent"),
        "http_client_closed": fates.count("client-closed"),
        "status_5xx": sum(
            o.status is not None and o.status >= 500 and not overload_refusal(o) for o in outcomes
        ),
        "refused_overloaded": sum(overload_refusal(o) for o in outcomes),
        "valid_http_refused_overloaded": sum(
            o.kind in VALID and overload_refusal(o) for o in outcomes
        ),
        "valid_http_answered_200": len(valid_ms),
        "valid_http_not_200": valid_not_200,
        "valid_http_p50_ms": percentile(valid_ms, 50),
        "valid_http_p99_ms": percentile(valid_ms, 99),
        "grpc_calls": sum(sum(c.values()) for c in tally.codes.values()),
        "grpc_lost": grpc_lost,
        "grpc_valid_failed": grpc_valid_failed,
        "healthz_probes": len(health),
        "healthz_not_200": health_bad,
        "healthz_p50_ms": percentile([1e3 * s for s in health], 50),
        "healthz_p99_ms": percentile([1e3 * s for s in health], 99),
        "healthz_max_ms": 1e3 * max(health) if health else None,
        "readyz_probes": len(ready),
        "readyz_not_200": sum(s != 200 for s in ready),
        "probes_not_200": probes_failed[:20],
        "rss_after_1_min_mib": after_warmup[0] if after_warmup else None,
        "rss_median_first_third_mib": first_third,
        "rss_median_last_third_mib": last_third,
        "rss_end_mib": seen.rss_end["VmRSS"],
        "rss_peak_mib": peak,
        "rss_bound_mib": settings.rss_bound_mib,
        "repository_changes": seen.churn.steps,
        "fmnist_versions_published": seen.churn.version,
        "idle_connections_held": seen.idle_held,
        "server_exit_code": seen.exit_code,
        "server_tracebacks": seen.output.count("Traceback"),
        "server_log_lines": len(seen.output.splitlines()),
        "by_kind": {k: dict(sorted(v.items())) for k, v in sorted(by_kind.items())},
        "lost_requests": [o.__dict__ for o, f in zip(outcomes, fates, strict=True) if f == "lost"][
            :20
        ],
        "grpc_unanswered": tally.unanswered,
    }
    checks = {
        "no accepted request lost": summary["http_lost"] == 0 and grpc_lost == 0,
        "no 5xx but the documented 503 overloaded with Retry-After": summary["status_5xx"] == 0,
        "every valid request answered 200 (or 503 overloaded)": valid_not_200 == 0
        and grpc_valid_failed == 0,
        "/healthz p99 <= 100 ms, all 200": health_bad == 0
        and (summary["healthz_p99_ms"] or 1e9) <= 100,
        "/readyz 200 throughout": summary["readyz_not_200"] == 0 and bool(ready),
        f"peak RSS <= {settings.rss_bound_mib} MiB": peak <= settings.rss_bound_mib,
        "no growth: RSS median of the last third <= the first third's + 32 MiB": (
            first_third is not None and last_third is not None and last_third <= first_third + 32
        ),
        "drained and exited 0 on SIGTERM": seen.exit_code == 0,
        "no traceback in the server's log": summary["server_tracebacks"] == 0,
    }
    summary["checks"] = checks
    summary["rss_timeline_mib"] = [(round(t), round(m, 1)) for t, m in rss[::10]]
    summary["log_notes"] = scan_index_note(seen.output)
    summary["rapid_reset_rounds"] = dict(seen.resets)
    return summary


def tables(summary: dict[str, Any], settings: Settings) -> str:
    """What the long soak prints: the settings, the measures, the rapid resets' ends, each
    kind's outcomes and the checks, as markdown."""
    rows = [
        ("minutes", "minutes"), ("HTTP requests", "http_requests"),
        ("HTTP answered", "http_answered"), ("HTTP lost (target 0)", "http_lost"),
        ("HTTP refused while being sent (header limits)", "http_unsent"),
        ("HTTP closed by the client on purpose", "http_client_closed"),
        ("5xx but 503 overloaded (target 0)", "status_5xx"),
        ("503 overloaded with Retry-After", "refused_overloaded"),
        ("valid HTTP refused 503 overloaded", "valid_http_refused_overloaded"),
        ("valid HTTP answered 200", "valid_http_answered_200"),
        ("valid HTTP not 200 (target 0)", "valid_http_not_200"),
        ("valid gRPC not OK nor RESOURCE_EXHAUSTED (target 0)", "grpc_valid_failed"),
        ("valid HTTP p50 ms", "valid_http_p50_ms"), ("valid HTTP p99 ms", "valid_http_p99_ms"),
        ("gRPC calls", "grpc_calls"), ("gRPC lost (target 0)", "grpc_lost"),
        ("/healthz probes", "healthz_probes"), ("/healthz p50 ms", "healthz_p50_ms"),
        ("/healthz p99 ms (target <= 100)", "healthz_p99_ms"),
        ("/healthz max ms", "healthz_max_ms"),
        ("/readyz probes", "readyz_probes"), ("/readyz not 200 (target 0)", "readyz_not_200"),
        ("RSS after 1 min MiB", "rss_after_1_min_mib"), ("RSS at the end MiB", "rss_end_mib"),
        ("RSS median, first third MiB", "rss_median_first_third_mib"),
        ("RSS median, last third MiB", "rss_median_last_third_mib"),
        ("peak RSS MiB", "rss_peak_mib"), ("RSS bound MiB", "rss_bound_mib"),
        ("repository changes", "repository_changes"),
        ("versions of fmnist published", "fmnist_versions_published"),
        ("server exit code", "server_exit_code"), ("server tracebacks", "server_tracebacks"),
    ]  # fmt: skip
    rounds = summary.get("rapid_reset_rounds", {})
    return "\n\n".join(
        [
            f"Long soak: {settings.minutes} min, {settings.clients} valid HTTP clients, 1 gRPC "
            f"client, {settings.attackers} attackers, bursts every {settings.burst_every_s:.0f} "
            f"s, churn every {CHURN_S} s.",
            report.markdown_table(
                ["measure", "value"], [[n, report.format_value(summary[k])] for n, k in rows]
            ),
            f"HTTP/2 rapid reset ({RESET_STREAMS:,} streams a round), how the rounds ended: "
            + (", ".join(f"{end} x{n}" for end, n in rounds.items()) or "none ran"),
            report.markdown_table(
                ["kind", "outcomes"],
                [
                    [k, ", ".join(f"{c} x{n}" for c, n in v.items())]
                    for k, v in summary["by_kind"].items()
                ],
            ),
            report.markdown_table(
                ["check", "held"],
                [[name, "yes" if ok else "NO"] for name, ok in summary["checks"].items()],
            ),
        ]
    )


def record(summary: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The JSON record: the settings, the attacks' weights and the summary."""
    return {"settings": asdict(settings), "attacks": ATTACKS, "soak": summary}
