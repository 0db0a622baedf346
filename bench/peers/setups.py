"""The servers compared, as each is started, sent an upload and read.

A :class:`Setup` is one server as it is run: ``smso-serve`` (its defaults, or other flags) or
a peer from :data:`PEERS` (its recommended setup, or its 2-worker one) with one of the
:class:`Row`'s models. :func:`start` starts it with :mod:`bench.lib.launch` (the peers with the
peers' interpreter, ``.venv-peers``, from the repository's root, their model in ``PEER_*``
variables: :mod:`bench.peers.model`); :func:`sender` sends image i of a list as that server
takes uploads (a multipart ``file`` part, or for PyTriton the Open Inference Protocol's binary
``BYTES``); :func:`top1` reads the best class's index from its answer.

This module runs in the service's environment and imports none of the peers.
"""

from __future__ import annotations

import json
import os
import shlex
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from bench.lib import ROOT, launch
from bench.lib.load import Send, post
from bench.lib.payloads import Body, multipart_body
from bench.peers import model

#: The peers' interpreter unless told (``make bench-peers`` creates its environment).
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
#: The batching every server is given where it has the setting: smso-serve's defaults.
MAX_BATCH, MAX_WAIT_MS = 16, 4
#: The GPU-like stand-in's cost: per batch, and per image in it (milliseconds).
STANDIN_LATENCY_MS, STANDIN_PER_IMAGE_MS = 1.3, 0.03
#: The packages whose versions a result records, by environment.
OUR_PACKAGES = ("onnxruntime", "onnxruntime-gpu", "fastapi", "uvicorn", "pillow", "numpy")
PEER_PACKAGES = (
    *("litserve", "bentoml", "nvidia-pytriton", "ray", "onnxruntime", "onnxruntime-gpu"),
    *("fastapi", "starlette", "uvicorn", "pillow", "numpy"),
)


class UnknownPeerError(ValueError):
    """A peer name that :data:`PEERS` does not know."""


@dataclass(frozen=True)
class Peer:
    """A peer server: how it is started (``command``, ``{port}`` replaced), when it is ready,
    how it takes an upload (``protocol``: ``multipart`` or ``triton``), and what its settings
    are, for the record."""

    name: str  # as the tables show it
    package: str  # the distribution whose version is recorded
    command: tuple[str, ...]  # after the interpreter
    ready: str  # answers 200 once the model is loaded
    protocol: str
    batching: str  # its batching settings, in words
    workers: str  # what N workers means for it
    unit: str = "workers"  # what the tables call them


PEERS: dict[str, Peer] = {
    "litserve": Peer(
        "LitServe",
        "litserve",
        ("-m", "bench.peers.litserve_server", "--port", "{port}"),
        "/health",
        "multipart",
        f"LitAPI(max_batch_size={MAX_BATCH}, batch_timeout={MAX_WAIT_MS / 1e3})",
        "LitServer(workers_per_device=N): N inference processes, N API servers",
    ),
    "bentoml": Peer(
        "BentoML",
        "bentoml",
        (
            *("-m", "bentoml", "serve", "bench.peers.bentoml_service:Classifier"),
            *("--host", "127.0.0.1", "--port", "{port}"),
        ),
        "/readyz",
        "multipart",
        f"@bentoml.api(batchable=True, max_batch_size={MAX_BATCH}); adaptive wait "
        "(max_latency_ms at its default: no fixed wait to set)",
        "@bentoml.service(workers=N): N processes",
    ),
    "pytriton": Peer(
        "PyTriton",
        "nvidia-pytriton",
        ("-m", "bench.peers.pytriton_server", "--port", "{port}"),
        "/v2/models/classifier/ready",
        "triton",
        f"ModelConfig(max_batch_size={MAX_BATCH}, "
        f"DynamicBatcher(max_queue_delay_microseconds={MAX_WAIT_MS * 1000}))",
        "N inference functions bound: N Triton model instances (threads of one process)",
        "instances",
    ),
    "rayserve": Peer(
        "Ray Serve",
        "ray",
        ("-m", "bench.peers.rayserve_app", "--port", "{port}"),
        "/ready",
        "multipart",
        f"@serve.batch(max_batch_size={MAX_BATCH}, batch_wait_timeout_s={MAX_WAIT_MS / 1e3})",
        "@serve.deployment(num_replicas=N): N replica actors",
        "replicas",
    ),
}


def peer(name: str) -> Peer:
    """The peer called ``name``; :class:`UnknownPeerError` listing the valid names."""
    if name not in PEERS:
        raise UnknownPeerError(f"unknown peer {name!r}; valid: {', '.join(PEERS)}")
    return PEERS[name]


@dataclass(frozen=True)
class Row:
    """One comparison: a model (a file, or the stand-in when ``model`` is None) and the JPEGs
    every server is sent."""

    name: str  # short, for flags and the JSON
    title: str  # as the tables show it
    model: Path | None
    files: Sequence[bytes] = field(repr=False)


@dataclass(frozen=True)
class Setup:
    """A server as it is run: ``server`` is ``smso-serve`` or a key of :data:`PEERS`."""

    server: str
    workers: int = 1
    flags: tuple[str, ...] = ()  # smso-serve's: more of its flags (``--decode-threads 2``)

    @property
    def ours(self) -> bool:
        return self.server == "smso-serve"

    @property
    def label(self) -> str:
        name = self.server if self.ours else PEERS[self.server].name
        if self.flags:
            name = f"{name} {' '.join(self.flags)}"
        if self.workers == 1:
            return name
        unit = "workers" if self.ours else PEERS[self.server].unit
        return f"{name}, {self.workers} {unit}"

    @property
    def slug(self) -> str:
        """The label as a file name's part."""
        flags = "".join(flag.strip("-").replace("-", "") for flag in self.flags)
        return f"{self.server}-{self.workers}{'-' + flags if flags else ''}"

    def settings(self) -> dict[str, Any]:
        """What the record says of this setup's batching and workers."""
        if self.ours:
            batching = f"defaults: max_batch_size {MAX_BATCH}, max_wait_ms {MAX_WAIT_MS}"
            return {
                "batching": batching,
                "workers": self.workers,
                "means": "--workers N",
                "flags": list(self.flags),
            }
        found = PEERS[self.server]
        return {"batching": found.batching, "workers": self.workers, "means": found.workers}


def setups(peers: Sequence[str], workers: Sequence[int], ours: Sequence[str] = ()) -> list[Setup]:
    """``smso-serve`` with its defaults (``--workers auto``), then each of ``peers`` with each of
    ``workers``; then ``smso-serve`` with each of ``ours`` (its flags in one string, as a shell
    splits them: ``"--workers 1"``)."""
    found = [Setup("smso-serve")] + [Setup(peer, n) for peer in peers for n in workers]
    return found + [Setup("smso-serve", 1, tuple(shlex.split(flags))) for flags in ours]


def peer_environment(row: Row, workers: int) -> dict[str, str]:
    """This environment and the ``PEER_*`` variables a peer reads its model from."""
    env = dict(os.environ) | {model.WORKERS_ENV: str(workers)}
    if row.model is None:
        env[model.BACKEND_ENV] = "standin"
        env[model.LATENCY_ENV] = str(STANDIN_LATENCY_MS)
        env[model.PER_IMAGE_ENV] = str(STANDIN_PER_IMAGE_MS)
    else:
        env[model.BACKEND_ENV] = "onnx"
        env[model.MODEL_ENV] = str(row.model)
    env.pop("VIRTUAL_ENV", None)  # the service's, not the peers'
    return env


def start(
    setup: Setup,
    row: Row,
    peers_python: Path = PEERS_PYTHON,
    log: Path | IO[Any] | None = None,
    timeout_s: float = 300,
) -> launch.Server:
    """``setup`` serving ``row``'s model on a free port, ready (its output to ``log``)."""
    flags = (("--workers", str(setup.workers)) if setup.workers > 1 else ()) + setup.flags
    if setup.ours and row.model is None:
        per_image = ("--per-image-ms", str(STANDIN_PER_IMAGE_MS))
        latency = ("--latency-ms", str(STANDIN_LATENCY_MS))
        module = "bench.standin"
        return launch.smso_serve(
            *latency, *per_image, *flags, log=log, timeout_s=timeout_s, module=module
        )
    if setup.ours:
        model = ("--model-path", str(row.model))
        return launch.smso_serve(*model, *flags, log=log, timeout_s=timeout_s)
    found = PEERS[setup.server]
    command = [str(peers_python), *found.command]
    env = peer_environment(row, setup.workers)
    return launch.Server(command, found.ready, env, log, timeout_s, stop_s=30)


def triton_body(image: bytes) -> Body:
    """An Open Inference Protocol ``infer`` request for PyTriton's model: the image as one
    ``BYTES`` element (``image_bytes``, shape ``[1, 1]``: a batch of one) in binary form, the
    ``index`` and ``score`` outputs answered as JSON."""
    raw = struct.pack("<I", len(image)) + image
    header = {
        "inputs": [
            {
                "name": "image_bytes",
                "datatype": "BYTES",
                "shape": [1, 1],
                "parameters": {"binary_data_size": len(raw)},
            }
        ],
        "outputs": [{"name": "index"}, {"name": "score"}],
    }
    encoded = json.dumps(header).encode()
    headers = {
        "Inference-Header-Content-Length": str(len(encoded)),
        "Content-Type": "application/octet-stream",
    }
    return Body(encoded + raw, headers)


@dataclass(frozen=True)
class Target:
    """Where a server takes uploads and what it is sent: request i posts
    ``bodies[i % len(bodies)]`` to ``url`` (driven by ``wrk`` or by Python clients)."""

    url: str
    bodies: Sequence[Body] = field(repr=False)


def target(setup: Setup, base: str, files: Sequence[bytes]) -> Target:
    """``files`` as the server at ``base`` takes uploads: a multipart ``file`` part on
    ``/classify``, or for PyTriton the Open Inference Protocol's binary ``BYTES``."""
    if not setup.ours and PEERS[setup.server].protocol == "triton":
        return Target(f"{base}/v2/models/classifier/infer", [triton_body(f) for f in files])
    return Target(f"{base}/classify", [multipart_body(f, f"{i}.jpg") for i, f in enumerate(files)])


def sender(setup: Setup, base: str, files: Sequence[bytes]) -> Send:
    """Request i sends ``files[i % len(files)]`` to the server at ``base`` as it takes uploads
    (:func:`target`), from a Python client."""
    found = target(setup, base, files)
    return post(found.url, found.bodies)


def top1(setup: Setup, content: bytes) -> int:
    """The best class's index in an answer from ``setup``'s server."""
    answer = json.loads(content)
    if setup.ours:
        return int(answer["results"][0]["predictions"][0]["index"])
    if PEERS[setup.server].protocol == "triton":
        outputs = {output["name"]: output["data"] for output in answer["outputs"]}
        return int(outputs["index"][0])
    if isinstance(answer, list):  # BentoML: a batchable API answers each request's list
        answer = answer[0]
    return int(answer["predictions"][0]["index"])


def versions(python: Path | str, packages: Sequence[str]) -> dict[str, str]:
    """The installed versions of ``packages`` in ``python``'s environment (those installed)."""
    script = (
        "import importlib.metadata as m, json, sys\n"
        "found = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        found[name] = m.version(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
        "print(json.dumps(found))\n"
    )
    done = subprocess.run(
        [str(python), "-c", script, *packages], capture_output=True, text=True, check=True
    )
    found: dict[str, str] = json.loads(done.stdout)
    return found
