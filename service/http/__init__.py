"""The HTTP door: FastAPI routes (``/classify``, ``/embed``, the protocol's ``/v2``), request
parsing, the ASGI middleware and uvicorn's connection handling."""
