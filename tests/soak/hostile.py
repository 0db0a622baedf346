"""The soaks' requests (:mod:`tests.soak.short_soak`, :mod:`tests.soak.long_soak`): valid and
hostile HTTP requests as bytes, a client that sends them on keep-alive or fresh connections and
records what happened to each (:class:`Outcome`), and an HTTP/2 rapid reset on the gRPC port."""

from __future__ import annotations

import http.client
import json
import random
import socket
import struct
import threading
import time
import zlib
from dataclasses import dataclass

from bench.lib.launch import HOST
from bench.lib.payloads import BOUNDARY, Body, multipart_body, tensor_bodies
from service.core.card import ModelCard

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
    "many-outputs-v2": 3,
    "silent-body": 3,
}
VALID = ("valid-classify", "valid-v2-fp32")
# kinds where the client closes on purpose: never lost, whatever happens
CLIENT_CLOSES = ("oversized-close", "abandoned", "silent-body")
#: how long a silent body's connection is held (its head sent, none of its body) before closing
SILENT_HOLD_S = 0.5
#: the outputs a many-outputs request names (the model has 2; the pairwise check took seconds)
MANY_OUTPUTS = 8_000


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
        # a valid image tensor, and far more outputs than the model has: 400 at once
        side = card.input
        image = [0.0] * (side.channels * side.height * side.width)
        shape = [1, side.channels, side.height, side.width]
        many = {
            "inputs": [{"name": "image", "datatype": "FP32", "shape": shape, "data": image}],
            "outputs": [{"name": f"out{i}"} for i in range(MANY_OUTPUTS)],
        }
        json_type = {"Content-Type": "application/json"}
        self.many_outputs = request(self.infer, Body(json.dumps(many).encode(), json_type))
        # a /classify upload that declares max_request_bytes and never sends its body
        self.silent = broken(b"", length=64 * 2**20)

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
        if kind == "many-outputs-v2":
            return self.many_outputs
        if kind == "silent-body":
            return self.silent
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
            elif out.kind == "silent-body":  # its declared body never comes
                time.sleep(SILENT_HOLD_S)
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


# ---------------------------------------------------------------------------------------------
# HTTP/2 rapid reset (CVE-2023-44487's pattern), written frame by frame: no client library sends
# it, since each call is opened and cancelled at once

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY = 0x1, 0x3, 0x4, 0x6, 0x7
_END_HEADERS, _ACK, _CANCEL = 0x4, 0x1, 0x8
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


def _literal(name: str, value: str) -> bytes:
    """One HPACK header field, a literal without indexing (names and values under 127 bytes)."""
    return b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()


def rapid_reset(port: int, streams: int, path: str = MODEL_INFER, batch: int = 100) -> str:
    """Open ``streams`` gRPC calls on one HTTP/2 connection, each cancelled (RST_STREAM) right
    after its headers, ``batch`` pairs per write; answers the server's SETTINGS and PINGs.
    How it ended: ``"sent"``, ``"goaway"`` (the server closed the connection with GOAWAY) or
    the name of the socket error."""
    block = b"".join(
        _literal(k, v)
        for k, v in (
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", f"{HOST}:{port}"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        )
    )
    ended: list[str] = []
    with socket.create_connection((HOST, port), timeout=30) as sock:
        sock.sendall(_PREFACE + _frame(_SETTINGS, 0, 0))

        def read() -> None:  # the server's frames: acknowledged, or its GOAWAY noted
            buffer = b""
            try:
                while True:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buffer += data
                    while len(buffer) >= 9:
                        size = int.from_bytes(buffer[:3], "big")
                        if len(buffer) < 9 + size:
                            break
                        kind, flags = buffer[3], buffer[4]
                        payload, buffer = buffer[9 : 9 + size], buffer[9 + size :]
                        if kind == _SETTINGS and not flags & _ACK:
                            sock.sendall(_frame(_SETTINGS, _ACK, 0))
                        elif kind == _PING and not flags & _ACK:
                            sock.sendall(_frame(_PING, _ACK, 0, payload))
                        elif kind == _GOAWAY:
                            ended.append("goaway")
            except OSError:
                return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        cancel = struct.pack(">I", _CANCEL)
        try:
            for start in range(0, streams, batch):
                ids = range(1 + 2 * start, 1 + 2 * min(start + batch, streams), 2)
                sock.sendall(
                    b"".join(
                        _frame(_HEADERS, _END_HEADERS, i, block) + _frame(_RST_STREAM, 0, i, cancel)
                        for i in ids
                    )
                )
                if ended:
                    break
        except OSError as error:
            return ended[0] if ended else type(error).__name__
        time.sleep(0.2)  # the server's last frames
        sock.shutdown(socket.SHUT_RDWR)
    reader.join(timeout=5)
    return ended[0] if ended else "sent"
