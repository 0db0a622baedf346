"""The inference service: FastAPI and grpcio on onnxruntime, /classify and /embed. Never imports
torch.

Packages, each importing only those below it (``[tool.importlinter]`` in pyproject.toml, checked
by ``make lint``):

- :mod:`service.cli` (``smso-serve``) and :mod:`service.app` (``create_app``): the composition
  root that builds the state, the doors and the lifespan;
- :mod:`service.http` and :mod:`service.grpc`: the two doors (routes, request parsing, ASGI
  middleware, uvicorn's connections; the gRPC servicer), independent of each other;
- :mod:`service.protocol`: the Open Inference Protocol's codec and meaning, for both doors;
- :mod:`service.dataplane`: the transport-free request path (decode, admit, batch, infer) and the
  state a server's doors share;
- :mod:`service.models`: the registry of models served, loading and retiring them, the
  repository folder followed, drift;
- :mod:`service.batching` (the micro-batcher) and :mod:`service.imaging` (bytes to tensors, on
  the CPU or the GPU);
- :mod:`service.runtime`: onnxruntime's providers, sessions, runners and the session host;
- :mod:`service.limits` (server-wide bounds) and :mod:`service.telemetry` (request records and
  access lines, metrics, spans, stage timings, the log format);
- :mod:`service.core`: errors, settings and the model card.

The typicality maths the exporter and the service share is :mod:`modelcard.typicality`, below
both. docs/architecture.md follows one request through these packages.
"""
