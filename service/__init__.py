"""The inference service: FastAPI on onnxruntime, /classify and /embed. Never imports torch."""
