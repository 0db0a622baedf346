"""The comparison's logic, apart from any server: parity first, then rounds, ratios and tables.

* :func:`top1_answers` and :func:`check_parity`: every server is sent the same images before
  anything is timed, and must answer each with the same best class as the first server (ours);
  :class:`ParityError` names each server and image that differ, or fail;
* :func:`measure`: interleaved rounds (the machine is shared and noisy: every server is driven
  in turn within a round, the order reversed every other round), at each number of clients;
  given the servers, each is driven with every other one paused (:func:`alone`), so that an
  idle server's own work (a cluster's heartbeats, spare workers) does not take the cores, and
  its CPU (every process of it) is metered per request;
* :func:`ratios_over`: our requests/s over each peer setup's, round by round, and their median;
* :func:`ratio_table` and :func:`latency_table`: the markdown tables printed.

A server here is a name and its :data:`Load` (a callable that drives it and gives the load's
figures): ``wrk`` loads (:mod:`bench.lib.wrk`) or Python clients' (:func:`python_loads`) for
real servers, fakes in the tests.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import httpx

from bench.lib import report
from bench.lib.load import Send, interleave, loads_of, merge, ratios, rps, without_latencies

#: Reads the best class's index from an answer's body.
Reader = Callable[[bytes], int]


class Meter(Protocol):
    """Where the cores went during a ``with`` block (:class:`bench.lib.procfs.CpuMeter`):
    ``result`` holds ``server_cores`` and ``machine_cores_busy`` (core-seconds a second), or
    None where they could not be read."""

    result: dict[str, float] | None

    def __enter__(self) -> Meter: ...

    def __exit__(self, *exc: object) -> None: ...


class Driven(Protocol):
    """A server that can be stopped and continued whole, and whose CPU can be metered
    (:class:`bench.lib.launch.Server`)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def settle(self) -> None: ...

    def meter(self) -> Meter: ...


def metered(result: dict[str, Any], cpu: dict[str, float] | None) -> dict[str, Any]:
    """A load's ``result`` with what a :class:`Meter` read during it (``cpu``): the server's
    CPU per request (``server_cpu_ms_per_request``: every process of the server, ms of CPU
    per answered request) and the machine's busy cores (``machine_cores_busy``), where they
    could be read (not where processes of it died meanwhile: their CPU is gone from
    ``/proc``)."""
    answered = result.get("requests_per_second")
    if cpu is not None and answered and cpu["server_cores"] >= 0:
        result["server_cpu_ms_per_request"] = 1e3 * cpu["server_cores"] / answered
        result["machine_cores_busy"] = cpu["machine_cores_busy"]
    return result


def alone(
    name: str, servers: Mapping[str, Driven], load: Callable[[], dict[str, Any]]
) -> Callable[[], dict[str, Any]]:
    """``load`` run with every server of ``servers`` but ``name`` paused; once ``name`` has
    settled (finished what the load left in flight, so that it is never paused mid-batch),
    the others resumed. Its result with the server's CPU per request and the machine's busy
    cores while it ran (:func:`metered`)."""

    def run() -> dict[str, Any]:
        others = [server for other, server in servers.items() if other != name]
        for server in others:
            server.pause()
        try:
            with servers[name].meter() as cpu:
                result = load()
            servers[name].settle()
        finally:
            for server in others:
                server.resume()
        return metered(result, cpu.result)

    return run


class ParityError(RuntimeError):
    """Servers that do not answer the same best class as the reference, for the same images."""


def top1_answers(send: Send, read: Reader, count: int) -> list[int | str]:
    """Image 0 to ``count - 1`` sent one at a time: each answer's best class index, or what
    went wrong (``"status 500"``, the exception's name)."""
    found: list[int | str] = []
    with httpx.Client(timeout=120) as client:
        for i in range(count):
            try:
                answer = send(client, i)
            except httpx.HTTPError as error:
                found.append(type(error).__name__)
                continue
            if answer.status_code != 200:
                found.append(f"status {answer.status_code}")
                continue
            try:
                found.append(read(getattr(answer, "content", b"")))
            except (ValueError, KeyError, IndexError, TypeError) as error:
                found.append(f"unreadable answer ({type(error).__name__})")
    return found


def check_parity(answers: Mapping[str, Sequence[int | str]]) -> dict[str, Any]:
    """Every server's answers against the first's (the reference): all the same best class,
    every answer a class. Raises :class:`ParityError` naming each server and image that
    differs; else what was compared."""
    names = list(answers)
    reference = answers[names[0]]
    problems = []
    for name in names:
        for i, (theirs, ours) in enumerate(zip(answers[name], reference, strict=True)):
            if not isinstance(theirs, int):
                problems.append(f"{name}: image {i}: {theirs}")
            elif theirs != ours:
                problems.append(f"{name}: image {i}: class {theirs}, {names[0]} says {ours}")
    if problems:
        raise ParityError("servers disagree before timing: " + "; ".join(problems))
    return {"reference": names[0], "images": len(reference), "top1": list(reference)}


#: A load to run: its figures (:func:`bench.lib.load.summary` or :func:`bench.lib.wrk.load`).
Load = Callable[[], dict[str, Any]]


def measure(
    loads: Mapping[int, Mapping[str, Load]],
    rounds: int,
    servers: Mapping[str, Driven] | None = None,
) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """For each number of clients, ``loads[clients]`` (server -> its load) in ``rounds``
    interleaved rounds (the order reversed every other round), each with the other
    ``servers`` paused where they are given (:func:`alone`). Each server's loads, by number
    of clients."""
    out: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for n, by_server in loads.items():
        found = dict(by_server)
        if servers is not None:
            found = {name: alone(name, servers, load) for name, load in found.items()}
        out[n] = interleave(found, rounds, alternate=True)
    return out


def python_loads(
    sends: Mapping[str, Send], requests: Mapping[int, int]
) -> dict[int, dict[str, Load]]:
    """Each server driven by ``n`` Python client threads sending ``requests[n]`` requests, by
    number of clients ``n`` (:func:`bench.lib.load.loads_of`)."""
    return {n: loads_of(sends, n, count) for n, count in requests.items()}


#: What :func:`alone` and the load generator add to a load, summarised as the median of the
#: rounds (each round's also kept, ``<key>_by_round``: their spread).
METERED = ("server_cpu_ms_per_request", "machine_cores_busy", "client_cpu_ms_per_request")


def summarise(loads: Mapping[str, Sequence[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each server's rounds as one load (:func:`bench.lib.load.merge`), without latencies;
    with the median of the rounds' :data:`METERED` figures, and each round's, where they were
    measured."""
    out = {}
    for name, runs in loads.items():
        merged = without_latencies(merge(runs))
        for key in METERED:
            values = [run[key] for run in runs if key in run]
            if values:
                merged[key] = statistics.median(values)
                merged[f"{key}_by_round"] = values
        out[name] = merged
    return out


def ratios_over(
    loads: Mapping[str, Sequence[dict[str, Any]]], ours: Sequence[str], theirs: Sequence[str]
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{our setup: {their setup: {"ratio": median, "ratio_by_round": [...]}}}``: our
    requests/s over theirs, round by round. A server with a round that answered nothing has
    no ratio (None)."""

    def ratio(a: str, b: str) -> dict[str, Any]:
        try:
            return ratios(rps(loads[a]), rps(loads[b]))
        except (KeyError, ZeroDivisionError):
            return {"ratio": None, "ratio_by_round": []}

    return {a: {b: ratio(a, b) for b in theirs} for a in ours}


def ratio_table(lines: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """A markdown table: one line per ``lines`` key (a setup of ours, at some number of
    clients), one column per peer setup, our requests/s over theirs (median of the rounds)."""
    theirs = list(next(iter(lines.values())))
    rows = [
        [name, *(report.format_ratio(cells[p]["ratio"]) for p in theirs)]
        for name, cells in lines.items()
    ]
    return report.markdown_table(["our req/s over theirs", *theirs], rows)


def _spread(load: Mapping[str, Any], key: str) -> str:
    """The median of a metered figure and its range over the rounds: ``2.41 (2.30-2.55)``."""
    if key not in load:
        return "-"
    values = load.get(f"{key}_by_round", [load[key]])
    if len(values) < 2:
        return f"{load[key]:.2f}"
    return f"{load[key]:.2f} ({min(values):.2f}-{max(values):.2f})"


def latency_table(summaries: Mapping[int, Mapping[str, Mapping[str, Any]]]) -> str:
    """A markdown table: each server's requests/s, p50 and p99 latency at each number of
    clients; its CPU per answered request where it was metered (median of the rounds, their
    range in brackets), and the load generator's where it was measured (``-`` where a
    server answered nothing)."""
    counts = sorted(summaries)
    names = list(summaries[counts[0]])
    loads = [load for by in summaries.values() for load in by.values()]
    metered = any("server_cpu_ms_per_request" in load for load in loads)
    client = any("client_cpu_ms_per_request" in load for load in loads)
    extra = (["CPU ms/req"] if metered else []) + (["client CPU ms/req"] if client else [])
    header = ["server"]
    for n in counts:
        header += [f"{n} client{'s' * (n > 1)}: req/s", "p50 ms", "p99 ms", *extra]
    rows = []
    for name in names:
        line = [name]
        for n in counts:
            load = summaries[n][name]
            if "requests_per_second" not in load:
                line += ["-"] * (3 + len(extra))
                continue
            line += [f"{load['requests_per_second']:.1f}", report.format_ms(load["p50_ms"])]
            line.append(report.format_ms(load["p99_ms"]) if "p99_ms" in load else "-")
            if metered:
                line.append(_spread(load, "server_cpu_ms_per_request"))
            if client:
                line.append(_spread(load, "client_cpu_ms_per_request"))
        rows.append(line)
    return report.markdown_table(header, rows)
