"""The one load driver: concurrent clients, requests/s and latency percentiles, rounds.

A load is ``requests`` requests, or ``seconds`` of them, from ``clients`` concurrent clients,
each sending one request after another: client k sends requests k, k + clients, ... Two ways
to run the clients:

* :func:`drive`: threads of this process, each with an ``httpx.Client`` of its own, request i
  sent by ``send(client, i)`` (:func:`post`, :func:`multipart` or any callable: a gRPC stub);
* :class:`ClientProcesses`: spawned processes started once, each running client threads on
  keep-alive connections (``http.client``: a tenth of httpx's CPU per request; or httpx), for
  loads one Python process cannot send (it tops out near 1-2k requests/s) or that must leave
  the machine's cores to the server.

Both give :func:`summary`'s figures: the requests answered 200, the failures (any other
answer, or none), the answers by status, requests/s, and the mean and percentile latencies of
the 200 answers. This machine is shared and noisy: :func:`interleave` runs variants in turn
within each round, :func:`ratios` compares them round by round (their median is the result),
and :func:`merge` makes one load of a variant's rounds.
"""

from __future__ import annotations

import functools
import http.client
import itertools
import math
import multiprocessing
import statistics
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol, TypeVar

import httpx
import numpy as np

from bench.lib.payloads import Body, multipart_body

T = TypeVar("T")


class Answer(Protocol):
    """What a load reads of an answer (``httpx.Response`` has it)."""

    @property
    def status_code(self) -> int: ...


@dataclass(frozen=True)
class Answered:
    """An answer as a load counts it: its status (0: none came, ``error`` names why), its body."""

    status_code: int
    error: str = ""
    content: bytes = b""


#: ``send(client, i)``: the i-th request of a load, sent through the client thread's client.
Send = Callable[[Any, int], Answer]


@dataclass
class Tally:
    """What clients saw: the latencies (s) of the 200 answers, every answer by status (or the
    error's name), and when the first request started and the last ended
    (``time.perf_counter``: the system's monotonic clock, the same in every process)."""

    latencies: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    start: float = math.inf
    end: float = -math.inf

    def add(self, other: Tally) -> None:
        self.latencies += other.latencies
        self.outcomes += other.outcomes
        self.start, self.end = min(self.start, other.start), max(self.end, other.end)


def run_clients(
    send: Send,
    open_client: Callable[[], Any],
    clients: Iterable[int],
    stride: int,
    requests: int | None = None,
    seconds: float | None = None,
    start_at: float | None = None,
) -> Tally:
    """The ``clients`` (numbers among ``stride`` in the whole load) as threads, each with the
    client ``open_client()`` gives: client k sends requests k, k + stride, ... below
    ``requests`` and until ``seconds`` after ``start_at`` (a ``time.time()``, so that client
    processes start together; default now)."""
    start_at = time.time() if start_at is None else start_at
    end = math.inf if seconds is None else start_at + seconds
    tally, lock = Tally(), threading.Lock()

    def client(k: int) -> None:
        mine, connection = Tally(), open_client()
        try:
            time.sleep(max(0.0, start_at - time.time()))
            mine.start = time.perf_counter()
            indices = itertools.count(k, stride) if requests is None else range(k, requests, stride)
            for i in indices:
                if time.time() >= end:
                    break
                sent = time.perf_counter()
                answer = send(connection, i)
                if answer.status_code == 200:
                    mine.latencies.append(time.perf_counter() - sent)
                mine.outcomes[getattr(answer, "error", "") or str(answer.status_code)] += 1
            mine.end = time.perf_counter()
        finally:
            connection.close()
            with lock:
                tally.add(mine)

    numbers = list(clients)
    with ThreadPoolExecutor(len(numbers)) as pool:
        for done in [pool.submit(client, k) for k in numbers]:
            done.result()
    return tally


def summary(tally: Tally) -> dict[str, Any]:
    """A load's figures; ``latencies_ms`` (sorted) for :func:`merge`. Without any 200 answer,
    the counts only."""
    ms = sorted(1e3 * x for x in tally.latencies)
    return _figures(ms, tally.outcomes, tally.end - tally.start) | {"latencies_ms": ms}


def _figures(ms: list[float], outcomes: Counter[str], seconds: float) -> dict[str, Any]:
    counts = {
        "requests": len(ms),
        "failures": sum(outcomes.values()) - len(ms),
        "outcomes": dict(outcomes),
        "seconds": seconds,
    }
    if not ms:
        return counts
    return counts | {
        "requests_per_second": len(ms) / seconds,
        "mean_ms": statistics.fmean(ms),
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
        "p99_ms": float(np.percentile(ms, 99)),
    }


#: Per-round figures of a load whose latencies were not kept (``wrk``'s): merged as the
#: median of the rounds.
ROUND_FIGURES = (
    *("mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms"),
    "client_cpu_ms_per_request",
)


def merge(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one load as one: requests/s over their summed time, latencies over all of
    them (where a load kept none, as ``wrk`` does not: each percentile the median of the
    rounds'); and each round's requests/s (``rounds_rps``)."""
    outcomes = sum((Counter(r["outcomes"]) for r in runs), Counter[str]())
    seconds = sum(r["seconds"] for r in runs)
    by_round = {"rounds_rps": [r.get("requests_per_second", 0.0) for r in runs]}
    if all("latencies_ms" in r for r in runs):
        ms = sorted(x for r in runs for x in r["latencies_ms"])
        return _figures(ms, outcomes, seconds) | by_round
    answered = sum(r["requests"] for r in runs)
    merged: dict[str, Any] = {
        "requests": answered,
        "failures": sum(r["failures"] for r in runs),
        "outcomes": dict(outcomes),
        "seconds": seconds,
    }
    if answered:
        merged["requests_per_second"] = answered / seconds
    for key in ROUND_FIGURES:
        values = [r[key] for r in runs if key in r]
        if values:
            merged[key] = statistics.median(values)
    return merged | by_round


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> dict[str, Any]:
    """Each round's ratio and their median: ``{"ratio_by_round": [...], "ratio": median}``."""
    by_round = [a / b for a, b in zip(numerators, denominators, strict=True)]
    return {"ratio_by_round": by_round, "ratio": statistics.median(by_round)}


def without_latencies(run: dict[str, Any]) -> dict[str, Any]:
    """A load's figures without its (long) list of latencies, for a results file."""
    return {key: value for key, value in run.items() if key != "latencies_ms"}


def rps(runs: Iterable[dict[str, Any]]) -> list[float]:
    """Each load's requests per second."""
    return [run["requests_per_second"] for run in runs]


def interleave(
    variants: Mapping[str, Callable[[], T]], rounds: int, alternate: bool = False
) -> dict[str, list[T]]:
    """``rounds`` rounds in which each variant runs once, in turn; in the order given, or
    reversed every other round (``alternate``: A B, B A, A B, ...). Each variant's results."""
    names = list(variants)
    out: dict[str, list[T]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[::-1] if alternate and r % 2 else names:
            out[name].append(variants[name]())
    return out


# --- clients in this process ----------------------------------------------------------------


def drive(send: Send, clients: int, requests: int) -> dict[str, Any]:
    """``requests`` requests from ``clients`` threads of this process: :func:`summary`."""
    tally = run_clients(send, lambda: httpx.Client(timeout=120), range(clients), clients, requests)
    return summary(tally)


def loads_of(
    sends: Mapping[str, Send], clients: int, requests: int
) -> dict[str, Callable[[], dict[str, Any]]]:
    """Each of ``sends`` as a load for :func:`interleave`: :func:`drive` with ``clients`` clients
    and ``requests`` requests."""
    return {name: functools.partial(drive, send, clients, requests) for name, send in sends.items()}


def drive_rounds(
    sends: Mapping[str, Send], clients: int, requests: int, rounds: int, alternate: bool = False
) -> dict[str, list[dict[str, Any]]]:
    """:func:`drive` each of ``sends`` with ``requests`` requests a round, in :func:`interleave`'s
    rounds: each one's loads."""
    return interleave(loads_of(sends, clients, requests), rounds, alternate)


def post(url: str, bodies: Sequence[Body]) -> Send:
    """Request i posts ``bodies[i % len(bodies)]`` to ``url``."""

    def send(client: httpx.Client, i: int) -> httpx.Response:
        body = bodies[i % len(bodies)]
        return client.post(url, content=body.data, headers=body.headers)

    return send


def multipart(url: str, files: Sequence[bytes]) -> Send:
    """One of ``files`` per request, uploaded as the multipart part ``file`` (``/classify``)."""
    return post(url, [multipart_body(data, f"{i}.jpg") for i, data in enumerate(files)])


# --- client processes -----------------------------------------------------------------------


class StdlibClient:
    """Keep-alive connections through ``http.client``, one per host: a tenth of httpx's CPU per
    request, so that the clients leave the machine's cores to the server."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.connections: dict[str, http.client.HTTPConnection] = {}

    def post(self, url: str, body: Body) -> Answered:
        parts = urllib.parse.urlsplit(url)
        connection = self.connections.get(parts.netloc)
        if connection is None:
            host = parts.hostname or "127.0.0.1"
            connection = http.client.HTTPConnection(host, parts.port, timeout=self.timeout)
            self.connections[parts.netloc] = connection
        try:
            connection.request("POST", parts.path, body=body.data, headers=body.headers)
            response = connection.getresponse()
            return Answered(response.status, content=response.read())
        except (OSError, ValueError, http.client.HTTPException) as error:
            connection.close()  # a new one for the next request
            del self.connections[parts.netloc]
            return Answered(0, type(error).__name__)

    def close(self) -> None:
        for connection in self.connections.values():
            connection.close()


class HttpxClient:
    """One ``httpx.Client`` (what a Python user of the service would write)."""

    def __init__(self, timeout: float) -> None:
        self.http = httpx.Client(timeout=timeout)

    def post(self, url: str, body: Body) -> Answered:
        try:
            response = self.http.post(url, content=body.data, headers=body.headers)
        except httpx.HTTPError as error:
            return Answered(0, type(error).__name__)
        return Answered(response.status_code, content=response.content)

    def close(self) -> None:
        self.http.close()


#: The HTTP clients a client thread may use, by name.
CLIENTS: dict[str, type[StdlibClient | HttpxClient]] = {
    "stdlib": StdlibClient,
    "httpx": HttpxClient,
}


@dataclass(frozen=True)
class Job:
    """One client process's share of a load: its clients among ``stride``; request i posts the
    payload's body i (modulo its length) to ``base + paths[i % len(paths)]``."""

    base: str
    paths: tuple[str, ...]
    payload: str
    clients: range
    stride: int
    requests: int | None
    seconds: float | None
    start_at: float
    client: str = "stdlib"


def run_job(job: Job, payloads: Mapping[str, Sequence[Body]]) -> Tally:
    """``job``'s clients as threads of this process (what each client process runs)."""
    bodies, urls = payloads[job.payload], [job.base + path for path in job.paths]
    # a request that takes longer than the load itself has failed
    timeout = 60.0 if job.seconds is None else job.seconds + 10

    def send(client: StdlibClient | HttpxClient, i: int) -> Answered:
        return client.post(urls[i % len(urls)], bodies[i % len(bodies)])

    def connect() -> StdlibClient | HttpxClient:
        return CLIENTS[job.client](timeout)

    share = (job.clients, job.stride, job.requests, job.seconds, job.start_at)
    return run_clients(send, connect, *share)


def _client_process(pipe: Connection, payloads: dict[str, list[Body]]) -> None:
    """Runs each job it receives and sends back its tally, until it receives ``None``."""
    while (job := pipe.recv()) is not None:
        pipe.send(run_job(job, payloads))


class ClientProcesses:
    """``processes`` client processes (spawned once) holding ``payloads`` (name -> bodies); a
    load spreads its clients over them, a thread each, on fresh connections."""

    def __init__(
        self, processes: int, payloads: Mapping[str, Sequence[Body]], client: str = "stdlib"
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.client = client
        self.pipes: list[Connection] = []
        self.processes: list[Any] = []
        bodies = {name: list(found) for name, found in payloads.items()}
        for _ in range(processes):
            parent, child = context.Pipe()
            process = context.Process(target=_client_process, args=(child, bodies), daemon=True)
            process.start()
            self.pipes.append(parent)
            self.processes.append(process)

    def load(
        self,
        base: str,
        paths: Sequence[str],
        payload: str,
        clients: int,
        requests: int | None = None,
        seconds: float | None = None,
    ) -> dict[str, Any]:
        """``requests`` requests, or ``seconds`` of them (starting a second from now, once every
        process's clients are set up), from ``clients`` clients: :func:`summary`, and
        ``concurrency`` (the clients)."""
        used = self.pipes[: min(len(self.pipes), clients)]
        start_at = time.time() + (0.0 if seconds is None else 1.0)
        job = functools.partial(
            Job, base, tuple(paths), payload, stride=clients, client=self.client
        )
        first = 0
        for k, pipe in enumerate(used):
            threads = clients // len(used) + (k < clients % len(used))
            share = range(first, first + threads)
            pipe.send(job(share, requests=requests, seconds=seconds, start_at=start_at))
            first += threads
        tally = Tally()
        for pipe in used:
            tally.add(pipe.recv())
        return {"concurrency": clients} | summary(tally)

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for process in self.processes:
            process.join(timeout=30)

    def __enter__(self) -> ClientProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
