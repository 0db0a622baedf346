"""``smso-serve`` on the GPU-like stand-in backend (:mod:`bench.lib.standin`), on any machine.

    python -m bench.standin --port 8000 [--latency-ms 1.3 --per-image-ms 0.19] [--SMSO settings]

Every other flag is ``smso-serve``'s. The backend sleeps ``latency_ms + per_image_ms * N`` per
batch, as ResNet-50 SMSO p = 2,048 on an H100 takes, with ResNet-50's card at 224 px.
"""

from __future__ import annotations

import argparse

import uvicorn

from bench.lib.standin import StandinBackend
from service.app import create_app
from service.cli import parse_args
from service.core.settings import Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=1.3, help="per batch")
    parser.add_argument("--per-image-ms", type=float, default=0.19, help="per image in a batch")
    args, rest = parser.parse_known_args(argv)
    settings = Settings(**parse_args(rest))
    app = create_app(settings, StandinBackend(args.latency_ms, args.per_image_ms))
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
