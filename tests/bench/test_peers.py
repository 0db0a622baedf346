"""``python -m bench.peers``: the parts that need no peer (parity, rounds, ratios, tables, how
each server is sent an upload and read, the peers' shared model code) on fake servers; and,
where ``.venv-peers`` exists (``make bench-peers``), ``--quick`` against one real peer."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from bench.lib import ROOT, SHIPPED
from bench.lib.load import Answered, Send
from bench.lib.payloads import jpegs
from bench.peers import compare, model, setups
from bench.peers.setups import PEERS, Setup
from service.dataplane.answers import top_classes
from tests.bench import cells, run_script


def answer_of(index: int) -> bytes:
    """What the peers serving over multipart answer (:mod:`bench.peers.model`)."""
    return json.dumps({"predictions": [{"label": "x", "index": index, "score": 1.0}]}).encode()


def fake(indices: list[int], status: int = 200, delay_s: float = 0.0) -> Any:
    """A fake server's ``send``: image i answered with class ``indices[i]`` after ``delay_s``."""

    def send(client: object, i: int) -> Answered:
        time.sleep(delay_s)
        return Answered(status, content=answer_of(indices[i % len(indices)]))

    return send


def read(content: bytes) -> int:
    return setups.top1(Setup("litserve"), content)


def test_parity_passes_when_every_server_agrees_with_ours() -> None:
    answers = {
        name: compare.top1_answers(fake([3, 1, 4]), read, 3)
        for name in ("smso-serve", "LitServe", "BentoML")
    }
    assert compare.check_parity(answers) == {
        "reference": "smso-serve",
        "images": 3,
        "top1": [3, 1, 4],
    }


def test_parity_names_each_server_and_image_that_differs_or_fails() -> None:
    def broken(client: object, i: int) -> Answered:
        raise httpx.ReadTimeout("no answer")

    answers = {
        "smso-serve": compare.top1_answers(fake([3, 1, 4]), read, 3),
        "LitServe": compare.top1_answers(fake([3, 1, 5]), read, 3),
        "BentoML": compare.top1_answers(fake([3], status=500), read, 3),
        "Ray Serve": compare.top1_answers(broken, read, 1) * 3,
    }
    with pytest.raises(compare.ParityError) as raised:
        compare.check_parity(answers)
    message = str(raised.value)
    assert "LitServe: image 2: class 5, smso-serve says 4" in message
    assert "LitServe: image 0" not in message
    assert "BentoML: image 0: status 500" in message
    assert "Ray Serve: image 1: ReadTimeout" in message


def test_measure_interleaves_rounds_and_the_ratios_are_ours_over_theirs() -> None:
    """Fake servers: ours answers at once, the peer after 20 ms; every server is driven once a
    round at each number of clients, and ours comes out faster in every round."""
    sends = {"smso-serve": fake([0]), "Peer": fake([0], delay_s=0.02)}
    loads = compare.measure(compare.python_loads(sends, {1: 4, 4: 16}), rounds=2)
    assert set(loads) == {1, 4}
    for n, requests in ((1, 4), (4, 16)):
        assert [load["requests"] for load in loads[n]["Peer"]] == [requests, requests]
    ratios = compare.ratios_over(loads[4], ["smso-serve"], ["Peer"])
    found = ratios["smso-serve"]["Peer"]
    assert len(found["ratio_by_round"]) == 2
    assert found["ratio"] > 1
    summary = compare.summarise(loads[4])
    assert summary["Peer"]["requests"] == 32
    assert "latencies_ms" not in summary["Peer"]
    assert summary["Peer"]["rounds_rps"] == [r["requests_per_second"] for r in loads[4]["Peer"]]


class Pauser:
    """A fake server that records when it is paused and resumed, and whose meter says it
    used half a core while the machine had 1.5 busy."""

    def __init__(self, name: str, events: list[str]) -> None:
        self.name, self.events = name, events
        self.result: dict[str, float] | None = None

    def pause(self) -> None:
        self.events.append(f"pause {self.name}")

    def resume(self) -> None:
        self.events.append(f"resume {self.name}")

    def settle(self) -> None:
        self.events.append(f"settle {self.name}")

    def meter(self) -> Pauser:
        return self

    def __enter__(self) -> Pauser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.result = {"server_cores": 0.5, "machine_cores_busy": 1.5}


def test_measure_pauses_every_other_server_during_each_load() -> None:
    events: list[str] = []

    def send(name: str) -> Send:
        inner = fake([0])

        def run(client: httpx.Client, i: int) -> httpx.Response:
            events.append(f"drive {name}")
            return inner(client, i)

        return run

    names = ("smso-serve", "A", "B")
    servers = {name: Pauser(name, events) for name in names}
    sends = {name: send(name) for name in names}
    loads = compare.measure(compare.python_loads(sends, {1: 1}), 1, servers)
    load = loads[1]["A"][0]
    assert load["server_cpu_ms_per_request"] == pytest.approx(500 / load["requests_per_second"])
    assert load["machine_cores_busy"] == 1.5
    summary = compare.summarise(loads[1])["A"]
    assert summary["server_cpu_ms_per_request"] == load["server_cpu_ms_per_request"]
    assert "CPU ms/req" in compare.latency_table({1: compare.summarise(loads[1])})
    assert events == [
        *("pause A", "pause B", "drive smso-serve", "settle smso-serve", "resume A", "resume B"),
        *("pause smso-serve", "pause B", "drive A", "settle A", "resume smso-serve", "resume B"),
        *("pause smso-serve", "pause A", "drive B", "settle B", "resume smso-serve", "resume A"),
    ]


def test_a_server_that_answered_nothing_has_no_ratio_and_dashes_in_the_tables() -> None:
    ok = {"requests": 4, "requests_per_second": 200.0, "p50_ms": 5.0, "seconds": 0.02}
    none = {"requests": 0, "failures": 4, "seconds": 1.0}
    loads = {"smso-serve": [ok, ok], "Peer": [ok, ok], "Dead": [none, none]}
    ratios = compare.ratios_over(loads, ["smso-serve"], ["Peer", "Dead"])
    assert ratios["smso-serve"]["Peer"]["ratio"] == 1.0
    assert ratios["smso-serve"]["Dead"]["ratio"] is None
    table = compare.ratio_table({"16 clients: smso-serve": ratios["smso-serve"]})
    lines = table.splitlines()
    assert cells(lines[0]) == ["our req/s over theirs", "Peer", "Dead"]
    assert cells(lines[2]) == ["16 clients: smso-serve", "1.00x", "-"]
    latency = compare.latency_table({16: {"smso-serve": ok, "Dead": none}}).splitlines()
    assert cells(latency[0]) == ["server", "16 clients: req/s", "p50 ms", "p99 ms"]
    assert cells(latency[2]) == ["smso-serve", "200.0", "5.00", "-"]
    assert cells(latency[3]) == ["Dead", "-", "-", "-"]


def test_each_server_is_read_as_it_answers() -> None:
    ours = {"results": [{"predictions": [{"label": "Bag", "index": 8, "score": 0.9}]}]}
    assert setups.top1(Setup("smso-serve"), json.dumps(ours).encode()) == 8
    assert setups.top1(Setup("litserve"), answer_of(2)) == 2
    assert setups.top1(Setup("bentoml"), b"[" + answer_of(6) + b"]") == 6  # a batchable API
    triton = {"outputs": [{"name": "score", "data": [0.5] * 5}, {"name": "index", "data": [7]}]}
    assert setups.top1(Setup("pytriton"), json.dumps(triton).encode()) == 7


def test_pytriton_is_sent_the_jpeg_as_one_binary_bytes_element() -> None:
    body = setups.triton_body(b"JPEGDATA")
    size = int(body.headers["Inference-Header-Content-Length"])
    header, raw = json.loads(body.data[:size]), body.data[size:]
    (tensor,) = header["inputs"]
    assert (tensor["name"], tensor["datatype"], tensor["shape"]) == ("image_bytes", "BYTES", [1, 1])
    assert tensor["parameters"]["binary_data_size"] == len(raw)
    assert raw == struct.pack("<I", 8) + b"JPEGDATA"
    assert [output["name"] for output in header["outputs"]] == ["index", "score"]


def test_the_setups_and_their_labels() -> None:
    found = setups.setups(["litserve", "pytriton", "rayserve"], [1, 2], ["--workers 1"])
    assert [s.label for s in found] == [
        "smso-serve",
        "LitServe",
        "LitServe, 2 workers",
        "PyTriton",
        "PyTriton, 2 instances",
        "Ray Serve",
        "Ray Serve, 2 replicas",
        "smso-serve --workers 1",
    ]
    assert found[0].settings()["batching"].startswith("defaults")
    assert found[-1].flags == ("--workers", "1")
    assert found[-1].slug == "smso-serve-1-workers1"
    assert "max_batch_size=16" in found[1].settings()["batching"]
    with pytest.raises(setups.UnknownPeerError, match="valid: litserve, bentoml"):
        setups.peer("triton")


@pytest.mark.parametrize("name", list(PEERS))
def test_every_registered_peer_has_its_server_module(name: str) -> None:
    """A peer added to the registry without a server module (run by the peers' interpreter,
    never imported here) fails this test."""
    command = PEERS[name].command
    target = command[command.index("serve") + 1] if "bentoml" in command else command[1]
    module = target.split(":")[0]
    assert module.startswith("bench.peers.")
    assert (ROOT / Path(*module.split("."))).with_suffix(".py").is_file()


def test_peer_environment_names_the_model_or_the_standin() -> None:
    row = setups.Row("shipped", "", SHIPPED, [])
    env = setups.peer_environment(row, 2)
    assert env[model.MODEL_ENV] == str(SHIPPED)
    assert (env[model.BACKEND_ENV], env[model.WORKERS_ENV]) == ("onnx", "2")
    standin = setups.peer_environment(setups.Row("standin", "", None, []), 1)
    assert standin[model.BACKEND_ENV] == "standin"
    assert float(standin[model.PER_IMAGE_ENV]) == setups.STANDIN_PER_IMAGE_MS


def test_the_peers_top_classes_are_the_services() -> None:
    """The peers' answer against the service's own top-k (``service.dataplane.pipeline``),
    ties included (the stand-in's zeros: the lowest index first)."""
    rng = np.random.default_rng(0)
    logits = np.concatenate([rng.standard_normal((6, 10)), np.zeros((1, 10))]).astype(np.float32)
    labels = [f"c{k}" for k in range(10)]
    scores, best = top_classes(logits, 5)
    found = model.top_classes(logits, labels)
    assert [[p["index"] for p in row] for row in found] == best.tolist()
    for row, expected in zip(found, scores, strict=True):
        np.testing.assert_allclose(
            [p["score"] for p in row], expected[[p["index"] for p in row]], rtol=1e-5
        )
    assert [p["label"] for p in found[0]] == [labels[k] for k in best[0]]
    assert [p["index"] for p in found[-1]] == [0, 1, 2, 3, 4]


def test_the_peers_model_classifies_as_the_service_preprocesses() -> None:
    """The shipped model through the peers' code: the service's preprocessing, one batch."""
    from bench.lib.payloads import preprocessed
    from bench.lib.session import open_backend

    files = jpegs(4)
    peer = model.Model(SHIPPED)
    backend = open_backend(SHIPPED)
    expected = np.argmax(backend.run(preprocessed(backend.card, files)).logits, axis=1)
    assert [answer[0]["index"] for answer in peer.classify(files)] == expected.tolist()
    standin = model.StandinModel(1.0, 0.0)
    assert [answer[0]["index"] for answer in standin.classify(files[:2])] == [0, 0]


def test_the_standin_serves_with_two_workers_and_its_metrics_combine_theirs() -> None:
    """Each request on a new connection (they fall on either worker): ``/metrics``, from
    whichever worker answers it, counts every one, as smso-serve's workers do."""
    from bench.lib import launch
    from bench.lib.load import multipart
    from bench.lib.metrics import scrape

    requests = 12
    with launch.standin("--workers", "2", "--per-image-ms", "0.03") as server:
        send = multipart(f"{server.base}/classify", jpegs(1))
        for i in range(requests):
            with httpx.Client(timeout=60) as client:
                answer = send(client, i)
            assert isinstance(answer, httpx.Response)
            assert answer.status_code == 200
            assert setups.top1(Setup("smso-serve"), answer.content) == 0
        counts = {scrape(f"{server.base}/metrics")["smso_decode_seconds_count"] for _ in range(4)}
    assert counts == {requests}


@pytest.mark.slow
@pytest.mark.skipif(not setups.PEERS_PYTHON.exists(), reason="no .venv-peers (make bench-peers)")
def test_quick_run_against_litserve(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    proc = run_script(
        "bench.peers",
        *("--quick", "--rows", "shipped", "--peers", "litserve", "--workers", "1"),
        *("--json", str(out)),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    row = report["rows"]["shipped"]
    assert row["parity"]["images"] == 8
    assert row["not_started"] == {}
    for n in ("1", "16"):
        assert all(load["failures"] == 0 for load in row["loads"][n].values())
        assert row["ratios"][n]["smso-serve"]["LitServe"]["ratio"] > 0
    assert report["versions"]["peers"]["litserve"]
    assert "our req/s over theirs" in proc.stdout


def test_a_profile_counts_busy_samples_by_function_whatever_the_line() -> None:
    from bench.peers.profile import aggregate

    raw = "\n".join(
        [
            'process 1:"smso";run (/usr/lib/thread.py:58);resize (/x/images.py:10) 3',
            'process 1:"smso";run (/usr/lib/thread.py:60);resize (/x/images.py:12) 1',
            'process 2:"smso";handle (/y/h11_impl.py:5) 4',
            'process 2:"smso";select (/usr/lib/selectors.py:468) 90',  # idle
        ]
    )
    found = aggregate(raw)
    assert found["samples"] == 8
    assert found["self"] == {"resize (images.py)": 0.5, "handle (h11_impl.py)": 0.5}
    assert found["total"]["run (thread.py)"] == 0.5
