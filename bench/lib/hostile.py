"""The soaks' requests (``bench.soak`` and its long mode, ``bench.soak_long``): valid and
hostile HTTP requests as bytes, and a client that sends them on keep-alive or fresh connections
and records what happened to each (:class:`Outcome`)."""

from __future__ import annotations

import http.client
import random
import socket
import struct
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
